"""``feedline scan``: counts by source and reason, --json, --tokens, stdin specs, exit codes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from feedline._cli.__main__ import main


@pytest.fixture()
def spec_file(tmp_path: Path) -> Path:
    (tmp_path / "a.jsonl").write_text('{"text": "one two"}\n{bad\n{"text": "three"}\n')
    (tmp_path / "b.txt").write_text("alpha beta\n\ngamma\n")
    spec = {"sources": [{"path": "a.jsonl"}, {"path": "b.txt"}]}
    p = tmp_path / "spec.json"
    p.write_text(json.dumps(spec))
    return p


def test_scan_json_counts_records_bytes_and_rejections(spec_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["scan", str(spec_file), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["records"] == 4 and out["rejected"] == {"bad_json": 1}
    assert out["bytes"] == len("one two" + "three" + "alpha beta" + "gamma")
    assert [(s["format"], s["records"]) for s in out["sources"]] == [("jsonl", 2), ("text", 2)]
    assert "a.jsonl:2" in out["rejected_samples"][0]
    assert main(["scan", str(spec_file), "--json", "--strict"]) == 1


def test_scan_tokens_with_a_real_tokenizer(spec_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    tok = Path(__file__).resolve().parents[2] / "shared" / "data" / "tokenizers" / "gpt2" / "tokenizer.json"
    if not tok.is_file():
        pytest.skip("../shared/data is absent")
    assert main(["scan", str(spec_file), "--json", "--tokenizer", str(tok)]) == 0
    out = json.loads(capsys.readouterr().out)
    from tokenizers import Tokenizer

    raw = Tokenizer.from_file(str(tok))
    assert out["tokens"] == sum(len(raw.encode(t, add_special_tokens=False).ids) for t in ["one two", "three", "alpha beta", "gamma"])


@pytest.mark.slow
def test_scan_reads_the_spec_from_stdin_and_reports_bad_usage(spec_file: Path, tmp_path: Path) -> None:
    spec = json.dumps({"sources": [str(tmp_path / "a.jsonl")]})
    run = subprocess.run([sys.executable, "-m", "feedline", "scan", "-", "--json"], input=spec, text=True,
                         capture_output=True, check=False)
    assert run.returncode == 0, run.stderr
    assert json.loads(run.stdout)["records"] == 2
    bad = subprocess.run([sys.executable, "-m", "feedline", "scan", "-"], input='{"sources": [{"pth": "x"}]}',
                         text=True, capture_output=True, check=False)
    assert bad.returncode == 2 and "did you mean 'path'" in bad.stderr
    missing = subprocess.run([sys.executable, "-m", "feedline", "scan", "-"], input='{"sources": ["/nonexistent/x.jsonl"]}',
                             text=True, capture_output=True, check=False)
    assert missing.returncode == 1 and "no such file" in missing.stderr and len(missing.stderr.strip().splitlines()) == 1


def test_scan_counts_the_text_of_records_kept_whole(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    chat = tmp_path / "chat.jsonl"
    rows = [{"messages": [{"role": "user", "content": "Grüß dich"}, {"role": "assistant", "content": "hi"}], "id": 7},
            {"messages": [{"role": "user", "content": "again"}]}]
    chat.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps({"sources": [{"path": "chat.jsonl", "text": None}]}))
    assert main(["scan", str(spec), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    strings = ["user", "Grüß dich", "assistant", "hi", "user", "again"]  # every string value, keys and numbers not
    assert out["records"] == 2 and out["bytes"] == sum(len(s.encode()) for s in strings) == 35
