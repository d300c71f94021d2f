"""The command line as a user runs it: exit codes, help with examples, outputs.

Real subprocesses where the process is what is tested (exit codes, a fresh interpreter's imports,
standard error a pipe); elsewhere ``main`` in this process, with the arguments, standard input and
outputs a subprocess would have (each ``python -m feedline`` costs ~0.6-0.9 CPU-s of interpreter start
and imports).
"""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path

import pytest

from feedline._cli.__main__ import _commands, main

EXE = [sys.executable, "-m", "feedline"]


def run(*args: str, stdin: str | None = None, env: dict | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*EXE, *args], input=stdin, capture_output=True, text=True, timeout=240, env=env)


@pytest.fixture
def cli(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]):  # type: ignore[no-untyped-def]
    """``feedline ARGS`` through ``main`` in this process: its return value (the exit code, see
    test_exit_codes_and_one_line_reasons), standard output and error, as :func:`run` gives them."""

    def call(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
        if stdin is not None:
            monkeypatch.setattr(sys, "stdin", io.StringIO(stdin))
        capsys.readouterr()
        code = main(list(args))
        out, err = capsys.readouterr()
        return subprocess.CompletedProcess(list(args), code, out, err)

    return call


def help_of(*args: str, capsys: pytest.CaptureFixture[str]) -> str:
    """``feedline ARGS --help`` in this process: argparse prints the same text, without an
    interpreter start per command (the tests below run the real subprocesses)."""
    with pytest.raises(SystemExit) as done:
        main([*args, "--help"])
    assert done.value.code == 0
    return capsys.readouterr().out


@pytest.mark.parametrize("name", sorted(_commands()))
def test_every_command_has_help_with_an_example(name: str, capsys: pytest.CaptureFixture[str]) -> None:
    out = help_of(name, capsys=capsys)
    assert "example:" in out and "feedline" in out


@pytest.mark.slow
def test_exit_codes_and_one_line_reasons(tmp_path: Path) -> None:
    r = run("inspect", str(tmp_path / "missing.yaml"))
    assert r.returncode == 2 and r.stderr.strip().count("\n") == 0 and "spec file not found" in r.stderr
    r = run("inspect", "-", stdin='{"sources": ["x.jsonl"], "task": {"kind": "clm", "max_lenght": 3}}')
    assert r.returncode == 2 and "did you mean 'max_length'" in r.stderr
    r = run("inspect", "-", stdin=json.dumps({"sources": [str(tmp_path / "nope.jsonl")], "tokenizer": str(tmp_path)}))
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert run("no-such-command").returncode == 2


@pytest.mark.slow
def test_inspect_highlights_loss_tokens(corpus: str, small_tokenizer: str, cli) -> None:  # type: ignore[no-untyped-def]
    spec = {"sources": [corpus], "tokenizer": small_tokenizer, "task": {"kind": "clm", "max_length": 16},
            "batching": {"strategy": "pad", "batch_size": 2}}
    r = cli("inspect", "-", "--json", "-n", "2", stdin=json.dumps(spec))
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["task"] == "clm" and len(out["batches"]) == 2
    assert out["batches"][0]["fields"]["input_ids"] == {"shape": [2, 16], "dtype": "int32"}
    row = out["batches"][0]["rows"][0]
    assert row["loss_tokens"] == row["tokens"] and row["text"].startswith("[[Document")
    plain = cli("inspect", "-", "--no-color", stdin=json.dumps(spec))
    assert "input_ids" in plain.stdout and "[[" in plain.stdout


@pytest.mark.slow
def test_train_tokenizer_command(tmp_path: Path, corpus: str, cli) -> None:  # type: ignore[no-untyped-def]
    r = cli("train-tokenizer", corpus, "-o", str(tmp_path / "tok"), "--kind", "wordpiece", "--vocab-size", "300")
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "tok" / "tokenizer.json").exists() and "wordpiece" in r.stdout


@pytest.mark.slow
def test_demo_trains_with_falling_loss(capsys: pytest.CaptureFixture[str]) -> None:
    """Through a real ``feedline serve`` (the demo's default), from ``main`` in this process: a subprocess would
    add an interpreter and a torch import (~2.5 CPU-s); test_exit_codes_and_one_line_reasons shows that main's
    return value becomes the exit code."""
    torch = pytest.importorskip("torch")
    threads = torch.get_num_threads()
    try:
        code = main(["demo", "--steps", "40", "--seq-len", "64", "--batch-size", "8"])
    finally:
        torch.set_num_threads(threads)
    err = capsys.readouterr().err
    assert code == 0, err
    summary = err.strip().splitlines()[-1]
    first, last = (float(x) for x in summary.split("loss ")[1].split(",")[0].split(" -> "))
    assert last < first - 0.5, summary
    assert "waited for data" in summary


@pytest.mark.slow
def test_version_prints_the_package_version() -> None:
    import feedline

    r = run("--version")
    assert r.returncode == 0 and r.stdout.strip() == f"feedline {feedline.__version__}"


def test_a_command_imports_its_own_module_alone(capsys: pytest.CaptureFixture[str]) -> None:
    """``feedline scan`` builds the parser of scan alone: the service's modules (zmq, prometheus,
    ~0.2 s a process) stay unimported; ``feedline --help`` and an unknown command still list all."""
    script = ("import sys\nfrom feedline._cli.__main__ import main\n"
              "try:\n    main(['--debug', 'scan', '--help'])\nexcept SystemExit:\n    pass\n"
              "print(sorted(m for m in sys.modules if m.startswith('feedline._cli.commands.')), 'zmq' in sys.modules)\n")
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[-1] == "['feedline._cli.commands.scan'] False"
    assert "usage: feedline scan" in r.stdout
    for argv in (["--help"], ["scna"]):
        with pytest.raises(SystemExit):
            main(argv)
        out = " ".join(capsys.readouterr())
        assert all(name in out for name in _commands()), argv

def test_serve_help_shows_the_defaults(capsys: pytest.CaptureFixture[str]) -> None:
    from feedline.service import ServerOptions

    out = " ".join(help_of("serve", capsys=capsys).split())
    o = ServerOptions()
    for option, default in (("--window", str(o.window)), ("--heartbeat", str(o.heartbeat)), ("--timeout", str(o.timeout))):
        after = out.split(option, 2)[-1]
        assert f"(default: {default})" in after.split("--", 1)[0] or f"default: {default})" in after[:200], option


@pytest.mark.slow
def test_inspect_highlighting_keeps_the_spaces_between_words(corpus: str, bert_path: str, cli) -> None:  # type: ignore[no-untyped-def]
    from feedline._tokenize import load_tokenizer

    spec = {"sources": [corpus], "tokenizer": bert_path, "seed": 5,
            "task": {"kind": "mlm", "max_length": 64, "mlm_probability": 0.3},
            "batching": {"strategy": "pad", "batch_size": 2}}
    r = cli("inspect", "-", "--json", "-n", "1", stdin=json.dumps(spec))
    assert r.returncode == 0, r.stderr
    tok = load_tokenizer(bert_path)
    batch = next(iter(__import__("feedline").Loader(spec)))
    for i, row in enumerate(json.loads(r.stdout)["batches"][0]["rows"]):
        assert row["loss_tokens"] > 0 and "[[" in row["text"]
        ids = batch["input_ids"][i][batch["attention_mask"][i].astype(bool)]
        # removing the markers gives exactly the decoded row: no word glued to a highlighted one
        assert row["text"].replace("[[", "").replace("]]", "") == tok.decode(ids.tolist())


@pytest.mark.slow
def test_demo_all_prints_a_line_per_task_and_a_table(capsys: pytest.CaptureFixture[str]) -> None:
    """In this process, through ``main`` (the torch import and training of a subprocess, ~3 CPU-s, spared): the
    exit code is main's return value, which test_exit_codes_and_one_line_reasons shows becomes the process's."""
    torch = pytest.importorskip("torch")
    threads = torch.get_num_threads()
    try:
        code = main(["demo", "--all", "--tasks", "clm,chat", "--steps", "30", "--seq-len", "64", "--batch-size", "8",
                     "--in-process", "--no-progress"])
        out, err = capsys.readouterr()
        assert code == 0, err
        lines = out.splitlines()
        assert lines[0].startswith("clm: 30 steps, loss ") and lines[0].endswith("ok") and "tokens/s" in lines[0]
        assert lines[1].startswith("chat: 30 steps") and "data wait" in lines[1]
        table = lines[lines.index("") + 1:]
        assert table[0].split()[:2] == ["task", "steps"] and [t.split()[0] for t in table[1:]] == ["clm", "chat"]
        # one step cannot lower the loss: the run fails with a reason
        code = main(["demo", "--all", "--tasks", "clm", "--steps", "1", "--seq-len", "32", "--batch-size", "4",
                     "--in-process", "--no-progress"])
    finally:
        torch.set_num_threads(threads)
    out, err = capsys.readouterr()
    assert code == 1 and "FAILED" in out and "did not fall for clm" in err


@pytest.mark.parametrize("command", ["count-tokens", "export"])
@pytest.mark.slow
def test_progress_bars_only_when_asked_or_on_a_terminal(command: str, corpus: str, small_tokenizer: str,
                                                        tmp_path: Path, cli) -> None:  # type: ignore[no-untyped-def]
    if command == "count-tokens":
        args = [corpus, "-o", str(tmp_path / "c.tsv")]
    else:
        spec = {"sources": [corpus], "tokenizer": small_tokenizer, "task": {"kind": "clm", "max_length": 16}}
        (tmp_path / "s.json").write_text(json.dumps(spec))
        args = [str(tmp_path / "s.json"), "-o", str(tmp_path / "out"), "--format", "jsonl", "--overwrite"]
    bar = f"{command}: "
    piped = run(command, *args)                      # standard error is a pipe here: no bar
    assert piped.returncode == 0, piped.stderr
    assert bar not in piped.stderr and "/s]" not in piped.stderr
    forced = cli(command, *args, "--progress")       # in this process: standard error is pytest's capture
    assert forced.returncode == 0, forced.stderr
    assert bar in forced.stderr and "/s]" in forced.stderr   # tqdm's bar, on standard error
    assert bar not in cli(command, *args, "--no-progress").stderr
