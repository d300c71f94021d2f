"""Records a task rejects are reported with their file and line, not their internal key."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

import feedline
from conftest import shared
from feedline.errors import RecordError
from feedline.testing import collect


def _chat_file(tmp_path: Path) -> Path:
    good = {"messages": [{"role": "user", "content": "What is two plus two?"},
                         {"role": "assistant", "content": "Two plus two is four."}]}
    bad = {"messages": [{"role": "user", "content": "nobody answers this one"}]}
    path = tmp_path / "chat.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in [good, good, bad, good, bad]))
    return path


def _spec(path: Path, on_error: str) -> dict:
    return {"sources": [{"path": str(path), "text": None}], "tokenizer": str(shared("tokenizers", "qwen2.5")), "on_error": on_error,
            "task": {"kind": "chat", "max_length": 64}, "batching": {"strategy": "pad", "batch_size": 1}}


@pytest.mark.slow
def test_chat_rejections_are_logged_with_file_and_line(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = _chat_file(tmp_path)
    with caplog.at_level(logging.WARNING, logger="feedline"):
        batches = collect(feedline.Loader(_spec(path, "skip")))
    assert len(batches) == 3  # the good records around the bad ones are all delivered
    assert f"{path}:3: no_assistant" in caplog.text and f"{path}:5: no_assistant" in caplog.text
    assert "record (" not in caplog.text


@pytest.mark.slow
def test_chat_rejection_raises_with_file_and_line(tmp_path: Path) -> None:
    path = _chat_file(tmp_path)
    with pytest.raises(RecordError, match=f"{path}:3: no_assistant"):
        collect(feedline.Loader(_spec(path, "raise")))


@pytest.mark.parametrize("what", ["examples", "batches"])
@pytest.mark.slow
def test_export_counts_the_records_a_source_skipped(tmp_path: Path, small_tokenizer: str, what: str) -> None:
    import subprocess
    import sys

    data = tmp_path / "d.jsonl"
    data.write_text('{"text": "one good line"}\n{"text": broken\n{"text": "another good line"}\n')
    spec = {"sources": [str(data)], "tokenizer": small_tokenizer, "task": {"kind": "clm", "max_length": 16},
            "batching": {"strategy": "pad", "batch_size": 1}}
    (tmp_path / "spec.json").write_text(json.dumps(spec))
    r = subprocess.run([sys.executable, "-m", "feedline", "export", str(tmp_path / "spec.json"), "-o",
                        str(tmp_path / "out"), "--format", "jsonl", "--what", what],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert f"{data}:2: bad_json" in r.stderr
    assert "rejected: bad_json=1" in r.stdout and "rejected: none" not in r.stdout
