"""The ``auto`` backend check waits while a stream is before its first batch (it would take the
cores that batch waits for), then starts at once; batches never depend on when it runs."""

from __future__ import annotations

import collections
import json
from concurrent.futures import Future
from pathlib import Path

import pytest

from conftest import shared
from feedline._pipeline import GlobalStream, Pipeline
from feedline._tokenize import backends
from feedline._tokenize.backends import HfEncoder, Verdict, VerifiedEncoder
from feedline._tokenize.load import load_tokenizer


def _deferred(start_after: int) -> tuple[VerifiedEncoder, list[int]]:
    """A deferred-check encoder over real GPT-2 whose check, when started, is recorded (no fastokens)."""
    tok = load_tokenizer(str(shared("tokenizers", "gpt2")))
    started: list[int] = []

    def start() -> Future[Verdict]:
        started.append(1)
        fut: Future[Verdict] = Future()
        fut.set_result(Verdict(None, "not checked in this test"))
        return fut

    return VerifiedEncoder(HfEncoder(tok.backend), None, strict=False, label="gpt2", start=start, start_after=start_after), started


def test_a_held_check_starts_at_release_and_not_before() -> None:
    enc, started = _deferred(start_after=10)
    enc.hold()
    enc.hold()  # two streams starting
    want = HfEncoder(enc.hf.backend).encode_batch(["Hello world, and more words than ten characters."])
    got = enc.encode_batch(["Hello world, and more words than ten characters."])
    assert [a.tolist() for a in got] == [a.tolist() for a in want]
    assert not started  # due, but held
    enc.release_hold()
    assert not started  # one stream still waits for its first batch
    enc.release_hold()
    assert started == [1]  # due: started by the release itself, not by a later encode
    enc.release_hold()  # more releases than holds are ignored
    assert started == [1]


def test_a_held_check_starts_past_the_hold_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(backends, "HOLD_LIMIT_CHARS", 100)
    enc, started = _deferred(start_after=10)
    enc.hold()  # a stream that never delivers a batch must not keep the check off for good
    enc.encode_batch(["a" * 50])
    assert not started
    enc.encode_batch(["b" * 60])
    assert started == [1]
    enc.release_hold()
    assert started == [1]


def test_release_before_the_threshold_leaves_the_usual_deferral() -> None:
    enc, started = _deferred(start_after=1000)
    enc.hold()
    enc.encode_batch(["short text"])
    enc.release_hold()
    assert not started  # not due yet: the usual START_AFTER_CHARS rule goes on
    enc.encode_batch(["y" * 1000])
    assert started == [1]


def test_a_global_stream_holds_until_its_first_batch_is_out(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Through the real pipeline: held while the first batch is made, released once it is out."""
    monkeypatch.setattr(backends, "_VERDICTS", collections.OrderedDict())  # as in a fresh process: the check is deferred
    texts = [json.loads(line)["text"] for line in shared("prose", "c4_demo.jsonl").read_text(encoding="utf-8").splitlines()]
    path = tmp_path / "c4.jsonl"
    path.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts[:60]), encoding="utf-8")
    spec = {"sources": [str(path)], "tokenizer": str(shared("tokenizers", "gpt2")),
            "task": {"kind": "clm", "max_length": 128}, "batching": {"strategy": "pad", "batch_size": 4}}
    p = Pipeline(spec)
    enc = p.tokenizer.encoder  # type: ignore[union-attr]
    assert isinstance(enc, VerifiedEncoder) and enc.start is not None
    it = iter(GlobalStream(p))
    assert enc._holds == 1
    next(it)
    assert enc._holds == 1  # the first batch is being handed out
    next(it)
    assert enc._holds == 0
    it.close()
    it2 = iter(GlobalStream(p))
    it2.close()  # a stream closed before its first batch releases its hold too
    assert enc._holds == 0
