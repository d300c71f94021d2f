"""The edges a new user hits first: each mistake gets a message that names the fix."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

import feedline
from feedline.errors import SourceError, SpecError
from feedline.testing import make_corpus

EXE = [sys.executable, "-m", "feedline"]


def _base(tok: str, path: str, **over: object) -> dict[str, object]:
    return {"sources": [path], "tokenizer": tok, "task": {"kind": "clm", "max_length": 32},
            "batching": {"strategy": "pad", "batch_size": 2}, **over}


@pytest.mark.slow
def test_a_taken_metrics_port_is_a_one_line_error(tmp_path: Path, corpus: str, small_tokenizer: str) -> None:
    spec = tmp_path / "s.yaml"
    spec.write_text(yaml.safe_dump(_base(small_tokenizer, corpus)))
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        r = subprocess.run([*EXE, "serve", str(spec), "--bind", "tcp://127.0.0.1:0", "--metrics-port", str(port)],
                           capture_output=True, text=True, timeout=120)
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert f"--metrics-port {port}: cannot listen" in r.stderr and "0 for any free one" in r.stderr


@pytest.mark.slow
def test_stats_without_keys_names_keys_as_a_cause() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    r = subprocess.run([*EXE, "stats", f"tcp://127.0.0.1:{port}", "--timeout", "0.5"], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 1 and "--keys DIR" in r.stderr


def test_a_task_that_cannot_be_packed_suggests_only_what_it_accepts() -> None:
    spec = {"sources": ["x.txt"], "tokenizer": "t5", "task": {"kind": "span", "max_length": 64},
            "batching": {"strategy": "pack", "batch_size": 4}}
    with pytest.raises(SpecError) as e:
        feedline.Spec.load(spec)
    assert "use strategy 'pad'" in str(e.value) and "bucket" not in str(e.value)  # span refuses bucket too
    with pytest.raises(SpecError, match="use strategy 'pad' or 'bucket'"):
        feedline.Spec.load({**spec, "task": {"kind": "classify", "max_length": 64}})


def test_infer_keeps_the_last_short_batch_without_being_told() -> None:
    spec = {"sources": ["x.txt"], "tokenizer": "t", "task": "infer", "batching": {"batch_size": 4}}
    assert feedline.Spec.load(spec).batching.remainder == "keep"
    assert feedline.Spec.load({**spec, "batching": {"batch_size": 4, "remainder": "pad"}}).batching.remainder == "pad"
    with pytest.raises(SpecError, match="remainder: keep"):
        feedline.Spec.load({**spec, "batching": {"batch_size": 4, "remainder": "drop"}})


def test_an_unknown_extension_fails_before_other_sources_are_read(tmp_path: Path) -> None:
    make_corpus(tmp_path / "good", files=1, docs=50)
    (tmp_path / "notes.xyz1").write_text("hello\n")
    spec = {"sources": [{"path": str(tmp_path / "good"), "weight": 1000.0},
                        {"path": str(tmp_path / "notes.xyz1"), "weight": 0.001}]}
    it = iter(feedline.records(spec))
    with pytest.raises(SourceError, match=r"notes\.xyz1: cannot tell the format.*format:"):
        next(it)  # at the first record, not after the first source's records


@pytest.mark.slow
def test_inspect_shows_multi_hot_labels_by_name(tmp_path: Path, small_tokenizer: str) -> None:
    rows = [{"text": f"row {i} about things", "labels": [["a", "c"], ["b"], ["a", "b", "c"]][i % 3]} for i in range(6)]
    (tmp_path / "d.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    spec = {"sources": [str(tmp_path / "d.jsonl")], "tokenizer": small_tokenizer,
            "task": {"kind": "classify", "label": "labels", "multi_label": True, "labels": ["a", "b", "c"],
                     "max_length": 16},
            "batching": {"strategy": "pad", "batch_size": 3}}
    r = subprocess.run([*EXE, "inspect", "-", "--json", "-n", "1", "--rows", "3"], input=json.dumps(spec), capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    got = [row["labels"] for row in json.loads(r.stdout)["batches"][0]["rows"]]
    assert got == [["a", "c"], ["b"], ["a", "b", "c"]]
