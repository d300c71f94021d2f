"""The task map cuts chunks by size as well as by count, bounds the text in flight, and a resumed
stream cuts the same chunks (so it saves the same states) as an uninterrupted one."""

from __future__ import annotations

import json
import logging
from typing import Any

import numpy as np
import pytest

from conftest import shared
from feedline._core.record import Record
from feedline._pipeline import Pipeline
from feedline._spec import Spec
from feedline._tasks.map import TaskMap, ThreadRunner
from feedline._tasks.sizing import read_chunk, record_size, records_size

# On one xdist worker (--dist loadgroup otherwise spreads the tests over every worker): the module's
# fixtures, tokenizers and first-use imports are set up once, not once a worker.
pytestmark = pytest.mark.xdist_group("task_map_chunks")


@pytest.fixture(scope="module")
def wiki_spec(tmp_path_factory: pytest.TempPathFactory) -> Spec:
    """Real Wikipedia articles (~33 KB each) and C4 documents (~2.5 KB) interleaved: sizes vary 100-fold."""
    d = tmp_path_factory.mktemp("wiki")
    wiki = [line.strip() for line in shared("prose", "wiki_demo.txt").read_text(encoding="utf-8").splitlines() if line.strip()]
    c4 = [json.loads(line)["text"] for line in shared("prose", "c4_demo.jsonl").read_text(encoding="utf-8").splitlines()[:40]]
    docs = [x for pair in zip(c4[::2], wiki[:10], strict=False) for x in pair] + c4[1::2]
    (d / "docs.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in docs), encoding="utf-8")
    return Spec.load({"sources": [{"path": str(d / "docs.jsonl")}], "tokenizer": {"path": str(shared("tokenizers", "bert-base-uncased")), "backend": "hf"},
                      "task": {"kind": "mlm", "max_length": 128}, "batching": {"strategy": "pad", "batch_size": 8}})


class _Recording(ThreadRunner):
    """The thread runner, recording each chunk's size and the text in flight when it was submitted."""

    def __init__(self, *a: Any, log: list[tuple[int, int]], owner: list[Any], **kw: Any) -> None:
        super().__init__(*a, **kw)
        self.log, self.owner = log, owner

    def submit(self, records: Any) -> Any:
        it = self.owner[0]
        self.log.append((records_size(records), sum(size for *_x, size in it.inflight)))
        return super().submit(records)


def _map(spec: Spec, log: list[tuple[int, int]], **kw: Any) -> tuple[TaskMap, list[Any]]:
    pipe = Pipeline(spec)
    owner: list[Any] = []
    tm = TaskMap(pipe.records(), pipe.task, **kw)
    tm.runner = lambda: _Recording(tm.task, tm.workers, tm.inflight_bytes, log=log, owner=owner)  # type: ignore[method-assign]
    return tm, owner


def _examples(tm: TaskMap, owner: list[Any], limit: int | None = None) -> list[Any]:
    it = iter(tm)
    owner.append(it)
    out = []
    for ex in it:
        out.append((ex.key, {k: v.tobytes() for k, v in ex.fields.items()}))
        if limit is not None and len(out) >= limit:
            break
    it.close()
    return out


@pytest.mark.slow
def test_chunks_are_bounded_by_size_and_examples_do_not_depend_on_chunking(wiki_spec: Spec,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """Small chunks on several threads (the task declares parallel_calls) give the examples of one
    whole-stream chunk, in order."""
    from feedline._tasks import threads

    monkeypatch.setattr(threads, "usable_cores", lambda: 4)
    monkeypatch.setattr(type(Pipeline(wiki_spec).task), "parallel_calls", True, raising=False)
    log: list[tuple[int, int]] = []
    small, owner = _map(wiki_spec, log, chunk_bytes=40_000, inflight_bytes=100_000, workers=14)
    got = _examples(small, owner)
    assert owner[0].runner.workers == 4 and len(log) > 8
    biggest_record = max(len(line) for line in shared("prose", "wiki_demo.txt").read_text(encoding="utf-8").splitlines())
    for size, inflight in log:
        assert size < 2 * 40_000 + biggest_record  # overshoot: less than the last take (at most doubling)
        assert inflight < 100_000  # a chunk is submitted only while the text in flight is under the budget
    whole_log: list[tuple[int, int]] = []
    whole, owner = _map(wiki_spec, whole_log, chunk_bytes=1 << 40, inflight_bytes=1 << 40)
    assert _examples(whole, owner) == got  # same examples, whatever the chunks
    assert len(whole_log) < len(log)


@pytest.mark.slow
def test_a_resumed_stream_cuts_the_same_chunks_and_saves_the_same_states(wiki_spec: Spec) -> None:
    pipe = Pipeline(wiki_spec)
    it = iter(TaskMap(pipe.records(), pipe.task, chunk_bytes=30_000))
    states, keys = [], []
    for ex in it:
        keys.append(ex.key)
        states.append(it.get_state())
    it.close()
    assert len({s["chunk"] for s in states}) > 3  # chunks of several sizes (count ramp and size bound)
    rng = np.random.default_rng(0)
    for stop in sorted(rng.choice(len(states) - 1, 3, replace=False)):
        resumed = iter(TaskMap(Pipeline(wiki_spec).records(), pipe.task, chunk_bytes=30_000))
        resumed.set_state(json.loads(json.dumps(states[stop])))
        for i in range(stop + 1, len(states)):
            assert next(resumed).key == keys[i]
            assert resumed.get_state() == states[i], i
        resumed.close()


def test_read_chunk_ends_at_the_record_that_reaches_the_budget() -> None:
    class Records:
        def __init__(self, sizes: list[int]) -> None:
            self.recs = [Record((0, 0, i), 0, {"text": "x" * n, "label": 3}) for i, n in enumerate(sizes)]
            self.pos, self.takes = 0, []

        def take(self, n: int) -> list[Record]:
            self.takes.append(n)
            out = self.recs[self.pos:self.pos + n]
            self.pos += len(out)
            return out

    src = Records([100] * 50)
    recs, size, ended = read_chunk(src, most=40, budget=1_000)  # type: ignore[arg-type]
    assert [len(r.data["text"]) for r in recs] == [100] * 10 and size == 10 * 108 and not ended
    src = Records([10] * 50)
    recs, size, ended = read_chunk(src, most=16, budget=1 << 20)  # type: ignore[arg-type]
    assert len(recs) == 16 and src.takes == [1, 1, 2, 4, 8]  # the count bound, in doubling takes
    recs, size, ended = read_chunk(src, most=64, budget=1 << 20)  # type: ignore[arg-type]
    assert len(recs) == 34 and ended
    nested = Record((0, 0, 0), 0, {"messages": [{"role": "user", "content": "hello"}], "ids": np.zeros(4, np.int32)})
    assert record_size(nested) == 4 + 5 + 16 == records_size([nested])


def test_threads_are_started_only_where_they_add_cores(wiki_spec: Spec, monkeypatch: pytest.MonkeyPatch) -> None:
    """workers is the most threads: one while the tokenizer's own pool spreads each call over the cores
    (more only contend for the GIL), every usable core once that pool is off or the task says so."""
    from feedline._tasks import map as task_map
    from feedline._tasks import threads

    task = Pipeline(wiki_spec).task
    monkeypatch.delenv("TOKENIZERS_PARALLELISM", raising=False)
    assert task_map.useful_threads(task) == Pipeline(wiki_spec.replace(workers=0)).workers == 1
    runner = ThreadRunner(task, 14)
    assert runner.workers == 1 and runner.ahead == 3 and runner.ahead_bytes == task_map.INFLIGHT_BYTES
    monkeypatch.setattr(threads, "usable_cores", lambda: 6)
    monkeypatch.setenv("TOKENIZERS_PARALLELISM", "false")
    assert task_map.useful_threads(task) == 6 and ThreadRunner(task, 14).workers == 6 and ThreadRunner(task, 2).workers == 2
    monkeypatch.delenv("TOKENIZERS_PARALLELISM")
    monkeypatch.setattr(type(task), "parallel_calls", True, raising=False)
    assert ThreadRunner(task, 4).workers == 4
    assert Pipeline({**wiki_spec.to_dict(), "workers": 0}).workers == 6


def test_workers_lowered_is_said_once(wiki_spec: Spec, monkeypatch: pytest.MonkeyPatch,
                                      caplog: pytest.LogCaptureFixture) -> None:
    """workers: N above what adds cores is lowered with one warning naming both counts and why, once."""
    from feedline._tasks import threads

    monkeypatch.setattr(threads, "_told", set())
    monkeypatch.delenv("TOKENIZERS_PARALLELISM", raising=False)
    task = Pipeline(wiki_spec).task
    with caplog.at_level(logging.INFO, logger="feedline"):
        assert [ThreadRunner(task, 5).workers for _ in range(3)] == [1, 1, 1]
        ThreadRunner(task, 1)
    said = [r for r in caplog.records if "requested" in r.getMessage()]
    assert len(said) == 1 and said[0].levelno == logging.WARNING
    assert "workers: 5 requested, 1 used" in said[0].getMessage() and "GIL" in said[0].getMessage()
    monkeypatch.setattr(threads, "usable_cores", lambda: 3)
    monkeypatch.setenv("TOKENIZERS_PARALLELISM", "false")
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="feedline"):
        assert ThreadRunner(task, 5).workers == 3 and ThreadRunner(task, 3).workers == 3
    assert [r.getMessage() for r in caplog.records if "requested" in r.getMessage()] == [
        f"workers: 5 requested, 3 used for task {task.kind!r}: the tokenizer's own pool is off "
        "(TOKENIZERS_PARALLELISM) and 3 cores are usable"]


def test_a_fresh_stream_tokenizes_one_chunk_ahead_then_ramps_up_to_ahead_chunks(wiki_spec: Spec) -> None:
    """After a start, the next chunk is made beside the one the consumer reads, and more only as the
    text handed out grows: a stream read for a few batches tokenizes one chunk beyond them (before:
    ``ahead`` = 3 chunks from the second chunk on, 1.6x-4x the text for a short read)."""
    log: list[tuple[int, int]] = []
    tm, owner = _map(wiki_spec, log, chunk_bytes=30_000)  # one thread: 3 chunks ahead at most
    it = iter(tm)
    owner.append(it)
    submitted: list[int] = []  # chunks submitted when the consumer reached chunk 1, 2, ...
    current = None
    got = []
    for ex in it:
        got.append((ex.key, {k: v.tobytes() for k, v in ex.fields.items()}))
        if it.current_state is not current:
            current = it.current_state
            submitted.append(len(log))
    it.close()
    assert submitted[:3] == [1, 3, 4]  # the first alone, then one ahead (the old code: [1, 4, 5])
    assert max(n - k for k, n in enumerate(submitted, 1)) == 2  # later the whole ``ahead``: 3 in flight
    assert got == _examples(*_map(wiki_spec, [], chunk_bytes=30_000, inflight_bytes=1 << 40))  # same examples
