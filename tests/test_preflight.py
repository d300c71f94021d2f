"""``feedline spec --check`` and ``feedline serve`` check a spec against its data before a run.

Each broken spec is refused in one line naming the source, field, path or key and the fix; the
good one passes; ``serve`` exits 1 with the same line before it listens (a real process).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from conftest import shared
from feedline._cli.__main__ import main

# On one xdist worker (--dist loadgroup otherwise spreads the tests over every worker): the module's
# fixtures, tokenizers and first-use imports are set up once, not once a worker.
pytestmark = pytest.mark.xdist_group("preflight")


def _write(tmp_path: Path, name: str, tok: str, **over: Any) -> Path:
    spec: dict[str, Any] = {"sources": [{"path": "docs.jsonl"}], "tokenizer": tok,
                            "task": {"kind": "clm", "max_length": 16},
                            "batching": {"strategy": "pad", "batch_size": 4}}
    spec.update(over)
    path = tmp_path / name
    path.write_text(yaml.safe_dump(spec))
    return path


@pytest.fixture
def data(tmp_path: Path) -> Path:
    rows = [{"id": i, "text": f"document number {i} says something short"} for i in range(10)]
    (tmp_path / "docs.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return tmp_path


def _check(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, list[str]]:
    code = main(["spec", "--check", *args])
    out = capsys.readouterr()
    return code, out.out, out.err.strip().splitlines()


@pytest.mark.parametrize(("broken", "expected"), [
    ({"sources": [{"path": "doc*.jsonll"}]}, r"sources\[0\] \(.*doc\*\.jsonll\): no files match; check the glob"),
    ({"sources": [{"path": "docs.jsonl", "text": "body"}]},
     r"sources\[0\] \(.*docs\.jsonl\): no record among the first 10 read \(missing_field: 10\); e\.g\. .*docs\.jsonl:1: "
     r"missing_field \(no field 'body'; records have: id, text; set the source's text: to the field holding the text\)$"),
    ({"tokenizer": "tokenizers/nope/tokenizer.json"}, r"tokenizer: .*tokenizers/nope/tokenizer\.json.*; fix the path$"),
    ({"tokenizer": "/nonexistent/tok.json"}, r"tokenizer: /nonexistent/tok\.json: no such tokenizer file or directory; give a "
                                              r"tokenizer\.json, a tokenizer folder, a SentencePiece \.model or a hub name$"),
    ({"batching": {"strategy": "pad", "batch_size": 64}},
     r"the stream holds 10 rows, fewer than batching\.batch_size=64, and batching\.remainder: drop dropped them all.*"
     r"lower batch_size, or set remainder: keep"),
])
def test_each_broken_spec_is_refused_in_one_line(data: Path, gpt2_path: str, capsys: pytest.CaptureFixture[str],
                                                 broken: dict[str, Any], expected: str) -> None:
    good = _write(data, "good.yaml", gpt2_path)
    code, out, err = _check(capsys, str(good))
    assert code == 0 and out.startswith(f"{good}: valid; task clm") and not err
    bad = _write(data, "bad.yaml", gpt2_path, **broken)
    code, out, err = _check(capsys, str(bad))
    assert code == 1 and not out
    assert len(err) == 1, err
    assert err[0].startswith(f"{bad}: ")
    assert re.search(expected, err[0]), err[0]


def test_no_data_skips_the_sources_not_the_tokenizer(data: Path, gpt2_path: str, capsys: pytest.CaptureFixture[str]) -> None:
    spec = _write(data, "s.yaml", gpt2_path, sources=[{"path": "elsewhere/*.jsonl"}])
    assert _check(capsys, str(spec))[0] == 1
    code, out, _ = _check(capsys, str(spec), "--no-data")
    assert code == 0 and "valid" in out
    spec = _write(data, "s.yaml", "tokenizers/nope/tokenizer.json", sources=[{"path": "elsewhere/*.jsonl"}])
    code, _, err = _check(capsys, str(spec), "--no-data")
    assert code == 1 and len(err) == 1 and "tokenizers/nope" in err[0]


@pytest.mark.slow
def test_a_chat_spec_reading_a_text_field_is_told_to_read_whole_records(tmp_path: Path,
                                                                        capsys: pytest.CaptureFixture[str]) -> None:
    threads = shared("chat", "oasst", "en_100_top_threads.messages.jsonl")
    tok = str(shared("tokenizers", "qwen2.5"))
    spec = _write(tmp_path, "chat.yaml", tok, sources=[{"path": str(threads), "text": "text"}],
                  task={"kind": "chat", "max_length": 256}, batching={"strategy": "pack", "batch_size": 4})
    code, _, err = _check(capsys, str(spec))
    assert code == 1 and len(err) == 1
    assert "no record among the first 100 read (missing_field: 100)" in err[0]
    assert err[0].endswith("remove text: 'text' from sources[0], or write text: null"), err[0]
    for whole in ({"path": str(threads)}, {"path": str(threads), "text": None}):  # no text: reads records whole
        fixed = _write(tmp_path, "chat.yaml", tok, sources=[whole], task={"kind": "chat", "max_length": 256},
                       batching={"strategy": "pack", "batch_size": 4})
        assert _check(capsys, str(fixed))[0] == 0


def test_a_classify_spec_whose_rows_lack_the_label_is_refused(tmp_path: Path, bert_path: str,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    train = shared("classification", "banking77", "train.tsv")  # header: text, label
    spec = _write(tmp_path, "cls.yaml", bert_path, sources=[{"path": str(train)}],
                  task={"kind": "classify", "label": "intent", "max_length": 32})
    code, _, err = _check(capsys, str(spec))
    assert code == 1 and len(err) == 1
    assert "task classify rejected each of the first 8 records (missing_label: 8)" in err[0]
    assert "no field 'intent'" in err[0] and "train.tsv:2" in err[0]
    fixed = _write(tmp_path, "cls.yaml", bert_path, sources=[{"path": str(train)}],
                   task={"kind": "classify", "label": "label", "max_length": 32})
    assert _check(capsys, str(fixed))[0] == 0


def test_another_stream_is_checked_and_named(data: Path, gpt2_path: str, capsys: pytest.CaptureFixture[str]) -> None:
    spec = _write(data, "s.yaml", gpt2_path, streams={"validation": {"sources": [{"path": "val-*.jsonl"}]}})
    code, _, err = _check(capsys, str(spec))
    assert code == 1 and len(err) == 1 and err[0].startswith(f"{spec}: stream validation: sources[0] (")


@pytest.mark.slow
def test_serve_with_a_wrong_field_exits_1_naming_it_before_listening(data: Path, gpt2_path: str) -> None:
    spec = _write(data, "serve.yaml", gpt2_path, sources=[{"path": "docs.jsonl", "text": "body"}])
    started = time.monotonic()
    run = subprocess.run([sys.executable, "-m", "feedline", "serve", str(spec), "--bind", "tcp://127.0.0.1:0"],
                         capture_output=True, text=True, timeout=60, check=False)
    took = time.monotonic() - started
    assert run.returncode == 1, run.stderr
    assert "listening" not in run.stdout.lower() and "tcp://" not in run.stdout
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("feedline serve: error: sources[0] (")
    assert "no field 'body'; records have: id, text" in lines[0]
    assert took < 20, took


def test_token_ids_for_a_task_that_needs_text_is_one_line(tmp_path: Path, bert_path: str,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    import numpy as np

    from feedline.tools import write_indexed_dataset

    write_indexed_dataset(str(tmp_path / "ids"), [np.arange(1, 40 + i, dtype=np.int32) for i in range(20)])
    spec = _write(tmp_path, "ids.yaml", bert_path, sources=[{"path": "ids.bin"}], task={"kind": "mlm", "max_length": 32})
    code, _, err = _check(capsys, str(spec))
    assert code == 1 and len(err) == 1, err
    assert err[0].endswith("ids.bin): holds token ids (megatron); task 'mlm' needs text: use task: clm, or a text source")
    clm = _write(tmp_path, "ids.yaml", bert_path, sources=[{"path": "ids.bin"}], task={"kind": "clm", "max_length": 32})
    assert _check(capsys, str(clm))[0] == 0


@pytest.mark.slow
def test_serve_no_data_check_listens_and_the_client_meets_the_error(data: Path, gpt2_path: str) -> None:
    import feedline
    from feedline.errors import FeedlineError, TransportError
    from feedline.service import serve_process

    spec = _write(data, "serve.yaml", gpt2_path, sources=[{"path": "docs.jsonl", "text": "body"}])
    started = time.monotonic()
    with pytest.raises(TransportError, match=r"exited with code 1: feedline serve: error: sources\[0\].*no field 'body'"), \
            serve_process(spec):
        pass
    assert time.monotonic() - started < 20  # said at once, not after ready_timeout (60 s) as 'not listening'
    with serve_process(spec, args=["--no-data-check"]) as address, feedline.Loader(address) as loader, \
            pytest.raises(FeedlineError, match="no field 'body'"):
        next(iter(loader))
