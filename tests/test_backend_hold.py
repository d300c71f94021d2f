"""The ``auto`` backend check waits while a stream is before its first batch (it would take the
cores that batch waits for), then starts at once; batches never depend on when it runs."""

from __future__ import annotations

import collections
import json
import time
from concurrent.futures import Future
from pathlib import Path

import pytest

from conftest import shared
from feedline._pipeline import GlobalStream, Pipeline
from feedline._tokenize import backends, check
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


@pytest.mark.slow
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
    monkeypatch.setattr(check, "_VERDICTS", collections.OrderedDict())  # as in a fresh process: the check is deferred
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


class _CountingHf(HfEncoder):
    """``tokenizers``, counting its calls; ``on_call`` runs after each (to finish a check mid-call)."""

    def __init__(self, backend: object, on_call: object = None) -> None:
        super().__init__(backend)
        self.calls, self.on_call = 0, on_call

    def encode_batch(self, texts, add_special_tokens=False):  # type: ignore[no-untyped-def]
        self.calls += 1
        out = super().encode_batch(texts, add_special_tokens)
        if callable(self.on_call):
            self.on_call()
        return out


def _prose(n: int) -> list[str]:
    lines = shared("prose", "c4_demo.jsonl").read_text(encoding="utf-8").splitlines()
    return [json.loads(line)["text"] for line in lines[:n]]


@pytest.mark.slow
def test_a_check_that_passes_mid_call_takes_the_rest_of_the_call() -> None:
    """Before the check passes, tokenizers encodes a slice at a time; the texts after the slice where
    it passed go to fastokens (here with no window), and the ids are those of tokenizers. No wait for
    the running check (check_wait 0): the call goes straight to its first slice, where the check passes."""
    fastokens = pytest.importorskip("fastokens")
    tok = load_tokenizer(str(shared("tokenizers", "gpt2")))
    pending: Future[Verdict] = Future()
    fast = backends.FastEncoder(fastokens.Tokenizer.from_json_str(tok.backend.to_str()))
    hf = _CountingHf(tok.backend, on_call=lambda: pending.done() or pending.set_result(Verdict(fast, "test")))
    enc = VerifiedEncoder(hf, None, strict=True, label="gpt2", pending=pending, window=0, check_wait=0.0)
    texts = _prose(120)
    assert sum(map(len, texts)) > 3 * backends.SLICE_CHARS
    got = enc.encode_batch(texts)
    assert hf.calls == 1 and enc.name == "fastokens"  # one slice, then fastokens
    want = HfEncoder(tok.backend).encode_batch(texts)
    assert [a.tolist() for a in got] == [a.tolist() for a in want]


def test_a_running_check_is_waited_for_once_then_tokenizers_goes_on(monkeypatch: pytest.MonkeyPatch) -> None:
    """A check that outlasts ``check_wait`` is waited for by the first call after the first batch
    only; a stream still before its first batch never waits for it."""
    monkeypatch.setattr(backends, "HOLD_LIMIT_CHARS", 100)
    tok = load_tokenizer(str(shared("tokenizers", "gpt2")))
    never: Future[Verdict] = Future()  # a check that does not finish in this test
    enc = VerifiedEncoder(HfEncoder(tok.backend), None, strict=False, label="gpt2", start=lambda: never,
                          start_after=10, check_wait=0.2)
    texts = _prose(4)
    want = [a.tolist() for a in HfEncoder(tok.backend).encode_batch(texts)]
    enc.hold()
    assert [a.tolist() for a in enc.encode_batch(texts)] == want
    assert enc.pending is never and not enc._waited  # started past the hold limit, but held: no wait
    enc.release_hold()
    assert [a.tolist() for a in enc.encode_batch(texts)] == want
    assert enc._waited and enc.name == "hf" and not never.done()
    slow = VerifiedEncoder(HfEncoder(tok.backend), None, strict=False, label="gpt2", pending=never, check_wait=30)
    slow._waited = True  # as after its one wait: the next calls do not wait again
    t0 = time.monotonic()
    assert [a.tolist() for a in slow.encode_batch(texts)] == want
    assert time.monotonic() - t0 < 20  # a wait would take the whole 30 s


@pytest.mark.slow
def test_every_thread_switches_as_soon_as_another_resolved_the_check() -> None:
    """Thread B is inside a call, encoding slices with tokenizers, when thread A finds the check done
    and resolves it: B's next slice goes to the fast encoder too (it used to finish the whole call,
    a chunk of ~1 MiB, on tokenizers, because the check no longer looked pending to it)."""
    import threading

    from feedline._tokenize.wordcache import WordCacheEncoder

    tok = load_tokenizer(str(shared("tokenizers", "bert-base-uncased")))
    pending: Future[Verdict] = Future()
    in_slice, resolved = threading.Event(), threading.Event()
    calls: collections.Counter[str] = collections.Counter()

    def on_call() -> None:
        calls[threading.current_thread().name] += 1
        if threading.current_thread().name == "B" and calls["B"] == 1:
            in_slice.set()
            assert resolved.wait(30)

    hf = _CountingHf(tok.backend, on_call=on_call)
    enc = VerifiedEncoder(hf, None, strict=True, label="bert", pending=pending, window=0)
    enc._waited = True  # past its one wait for the check (as after the first batch)
    texts = _prose(120)
    assert sum(map(len, texts)) > 3 * backends.SLICE_CHARS
    got: list = []
    b = threading.Thread(target=lambda: got.extend(enc.encode_batch(texts)), name="B")
    b.start()
    assert in_slice.wait(30)
    pending.set_result(Verdict(WordCacheEncoder(tok.backend), "test"))
    enc.encode_batch(texts[:3])  # thread A finds the check done and resolves it
    assert enc.pending is None and enc.name == "wordcache"
    resolved.set()
    b.join(30)
    assert calls["B"] == 1  # one slice on tokenizers, the rest of B's call on the word cache
    want = HfEncoder(tok.backend).encode_batch(texts)
    assert [a.tolist() for a in got] == [a.tolist() for a in want]
