"""Apply a task to a record stream in chunks, in order, with exact state.

Records are read in the caller's thread in chunks of at most ``chunk`` records and about
:data:`CHUNK_BYTES` of text (:mod:`feedline._tasks.sizing`); a :class:`ChunkRunner` runs each
chunk's :meth:`Task.process` somewhere (a thread pool here; Ray workers in :mod:`feedline._ray.map`),
up to ``runner.ahead`` chunks and :data:`INFLIGHT_BYTES` of text in flight; examples come out in
record order. Bounding chunks by size keeps the head of the queue short (256 Wikipedia articles
made one chunk of ~2 M BERT tokens). After a start or restore the work ahead ramps up: the text
queued behind the chunk waited for stays under half the text handed out, so while chunks double
(below) the next chunk is made beside the one read, and a stream read for a few batches tokenizes
one chunk beyond them, not ``ahead`` chunks; when chunks are submitted never changes where they
end. The state is the parent's state *at the start of the current chunk* plus how many of its
examples were already yielded; a restore re-reads and re-processes that one chunk and skips,
which gives the same examples because tasks are pure functions of (record, seed, epoch, key).
The runner never appears in the state, so a state resumes under any runner. Chunks are read
with the parent's ``take`` and processed with ``Task.process_block``: a task that builds a chunk
as one :class:`~feedline._core.block.ExampleBlock` has it kept whole, and a consumer that takes
examples a chunk at a time (the ``pack`` batcher) uses ``peek_block``/``consume`` instead of
``next`` (same examples, same state).

:meth:`TaskMap.rebuild` answers the stages above (batchers' buffers): it re-reads the records
of the refs through ``parent.fetch`` and re-processes them in one batched task call.

State: ``{"parent": ..., "skip": n, "rejected": {reason: n}, "chunk": n}``, where ``chunk`` is
the number of records of the chunk the state points into (chunks ramp up from :data:`FIRST_CHUNK`
records, so the first batch waits for few records; each next chunk may hold twice as many records
as the one before, and stops early at :data:`CHUNK_BYTES`). Where a chunk ends is a function of the
records from its start and the previous chunk's size only, so a resumed stream cuts the same chunks
(and saves the same states) as an uninterrupted one; states of any older chunking still resume,
since a restore re-reads exactly the ``chunk`` records named. ``rejected`` counts every
rejection *up to the end of the current chunk* that the parent's state (taken at the chunk's
start) does not already hold: the task's own rejections so far, plus the parent's rejections
made while reading the current chunk. Summing every ``rejected`` table in the state therefore
counts each rejection the moment the chunk holding it is processed (never a chunk late; a
small corpus is counted at the first example). A restore re-reads the chunk and recovers the
task's count at its start by subtracting what the chunk re-counts.

A fresh iterator whose task rejects its first ``reject_limit`` records (``0``: no such early
check), or whose stream ends without one example (whatever ``reject_limit``), raises :class:`~feedline.errors.SourceError` (counts, a sample, the fix).
"""

from __future__ import annotations

import collections
import concurrent.futures as cf
import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar, Protocol

from feedline._core.block import ExampleBlock
from feedline._core.cores import usable_cores
from feedline._core.dataset import Dataset, DatasetIterator, State
from feedline._core.documents import TokenRecords
from feedline._core.record import Example, ExampleRef, Key, Record, Rejection
from feedline._core.report import Rejections, add_counts, nothing_delivered, sum_rejected
from feedline._tasks.base import Task, TaskOutput
from feedline._tasks.runahead import read_run, run_end
from feedline._tasks.sizing import CHUNK_BYTES, INFLIGHT_BYTES, read_chunk, records_size
from feedline._tasks.threads import thread_count, useful_threads
from feedline.errors import SourceError, StateError

log = logging.getLogger("feedline")

__all__ = ["CHUNK_BYTES", "INFLIGHT_BYTES", "ChunkRunner", "TaskMap", "ThreadRunner", "thread_count", "usable_cores",
           "useful_threads"]

#: At most this many records a chunk (short records reach it long before :data:`CHUNK_BYTES`).
DEFAULT_CHUNK = 256

#: The first chunk after a start or restore holds this many records; each next one twice as many,
#: up to ``chunk``. Long documents (Wikipedia articles) then reach the first batch without waiting
#: for 256 of them. Output never depends on chunking (tasks are pure per record); the state
#: names the size of the chunk it points into, so a restore re-reads exactly that chunk (and
#: re-counts exactly its rejections).
FIRST_CHUNK = 8


class ChunkRunner(Protocol):
    """Where chunks are processed: ``submit`` returns a handle, ``result`` waits for it.

    ``ahead``: the most chunks in flight; a runner may also set ``ahead_bytes``, the most text in
    flight (the chunk that crosses it is the last submitted), absent or ``None`` for no such bound.
    """

    ahead: int

    def submit(self, records: Sequence[Record]) -> Any: ...

    def result(self, handle: Any, state: State) -> list[TaskOutput] | ExampleBlock: ...

    def close(self) -> None: ...


class ThreadRunner:
    """Process chunks on up to ``workers`` threads (no more than :func:`useful_threads`: see
    :func:`thread_count`), that many + 2
    chunks in flight and no more text than ``ahead_bytes``: more threads never queue more work
    ahead of the chunk the stream waits for, nor take the GIL from the reader and the batcher.

    Even one thread runs apart from the caller, so reading, batching and the consumer overlap the
    tokenizer; the tokenizer's Rust batch call already spreads each chunk over every core. A run
    of pre-tokenized records for a task whose ``inline_runs`` is set is processed at once in the
    caller's thread (a copy of its ids: ~20 us where the hand-off and the GIL contention of a
    second thread cost more); its outcome, an error included, is still read at :meth:`result`.
    """

    def __init__(self, task: Task, workers: int, ahead_bytes: int | None = INFLIGHT_BYTES) -> None:
        self.task = task
        self.workers = thread_count(task, workers)
        self.ahead = self.workers + 2
        self.ahead_bytes = ahead_bytes
        self.pool: cf.ThreadPoolExecutor | None = None

    def submit(self, records: Sequence[Record]) -> Any:
        if self.task.inline_runs and isinstance(records, TokenRecords):
            done: cf.Future[list[TaskOutput] | ExampleBlock] = cf.Future()
            try:
                done.set_result(self.task.process_block(records))
            except Exception as e:  # raised where the chunk's examples are taken, as from a thread
                done.set_exception(e)
            return done
        if self.pool is None:
            self.pool = cf.ThreadPoolExecutor(self.workers, thread_name_prefix="feedline-task")
        return self.pool.submit(self.task.process_block, records)

    def result(self, handle: Any, state: State) -> list[TaskOutput] | ExampleBlock:
        return handle.result() if isinstance(handle, cf.Future) else handle  # type: ignore[no-any-return]

    def close(self) -> None:
        if self.pool is not None:
            self.pool.shutdown(wait=False, cancel_futures=True)
            self.pool = None


class TaskMap(Dataset[Example]):
    """The examples of ``task`` over ``parent``'s records."""

    def __init__(self, parent: Dataset[Record], task: Task, *, chunk: int = DEFAULT_CHUNK, workers: int = 1,
                 on_error: str = "skip", reject_limit: int = 0, chunk_bytes: int = CHUNK_BYTES,
                 inflight_bytes: int = INFLIGHT_BYTES) -> None:
        """``chunk``: most records a chunk; ``chunk_bytes``: a chunk ends at this much text;
        ``inflight_bytes``: the thread runner's bound on text in flight."""
        if chunk < 1 or chunk_bytes < 1 or inflight_bytes < 1:
            raise ValueError(f"chunk: {chunk}, chunk_bytes: {chunk_bytes}, inflight_bytes: {inflight_bytes} must be >= 1")
        self.parent = parent
        self.task = task
        self.chunk = chunk
        self.chunk_bytes = chunk_bytes
        self.inflight_bytes = inflight_bytes
        self.workers = max(1, workers)
        self.on_error = on_error
        self.reject_limit = reject_limit

    #: key -> (file, line) for reports of rejected records; set by the pipeline.
    locate: Callable[[Key], tuple[str, int | None]] | None = None
    #: One partition's share of the stream (``partitions`` > 1), set by the pipeline: it may end
    #: without an example (a small source need not feed every partition); whether the whole
    #: stream delivered nothing is the composing stage's to say.
    share: bool = False

    def runner(self) -> ChunkRunner:
        """A fresh runner for one iterator (override to run chunks elsewhere)."""
        return ThreadRunner(self.task, self.workers, self.inflight_bytes)

    def __iter__(self) -> TaskMapIterator:
        return TaskMapIterator(self)

    def rebuild(self, refs: Sequence[ExampleRef]) -> list[Example]:
        """The examples named by ``refs``: their records re-read and re-processed in one task call.

        Raises:
            StateError: a record is now rejected (the data changed since the state was saved).
        """
        wanted = list(dict.fromkeys((int(r[0]), int(r[1]), int(r[2]), int(r[3])) for r in refs))
        found = self.parent.fetch(list(dict.fromkeys((s, f, p) for s, f, p, _e in wanted)))
        outputs = self.task.process([Record((s, f, p), e, found[(s, f, p)]) for s, f, p, e in wanted]) if wanted else []
        made: dict[tuple[int, int, int, int], list[Example]] = {}
        for k, out in zip(wanted, outputs, strict=True):
            if not isinstance(out, list):
                raise StateError(f"record {k[:3]} was rejected on re-read; the data changed since the state was saved")
            made[k] = out
        try:
            return [made[(int(r[0]), int(r[1]), int(r[2]), int(r[3]))][int(r[4])] for r in refs]
        except IndexError as e:
            raise StateError(f"an example ref in the state names an example its record no longer makes ({e}); "
                             "the data or the tokenizer changed since the state was saved") from e


class TaskMapIterator(DatasetIterator[Example]):
    """Cursor over a :class:`TaskMap` (or any subclass with its own runner).

    Its ``parent`` entry is the parent's state at the start of the current chunk (not the
    parent's live state, which has read ahead), so :meth:`get_state` is its own.
    """

    NAME = "task map"
    STATE_KEYS = ("skip", "rejected", "chunk")
    STATE_DEFAULTS: ClassVar[Mapping[str, Any]] = {"chunk": None}

    def __init__(self, ds: TaskMap) -> None:
        self.ds = ds
        self.runner = ds.runner()
        self.parent = iter(ds.parent)
        self.rejections = Rejections(ds.on_error, locate=getattr(ds, "locate", None))
        # (parent state at the chunk's start, its size, runner handle (None: no record), parent
        #  rejections made reading it, parent state at its end, its text size)
        self.inflight: collections.deque[tuple[State, int, Any, dict[str, int], State, int]] = collections.deque()
        self.inflight_size = 0  # text size of the chunks in flight
        self.taken = 0  # text size of the chunks handed out since the start or restore (see _room)
        self.exhausted = False
        self.current: list[Example] | ExampleBlock = []
        self.current_state: State | None = None
        self.current_end: State | None = None
        self.current_rejected: dict[str, int] = {}
        self.skip = 0
        self._next_start: State | None = None  # parent state where the next chunk starts (cached)
        self._watch = True  # fresh and no example yet: see _nothing (the end is checked whatever reject_limit)
        self.chunk = min(FIRST_CHUNK, ds.chunk)  # the next chunk's most records (ramps up to ds.chunk)
        self.exact: int | None = None  # the next chunk's records, exactly (a restore re-reads its chunk)
        self.current_size = self.chunk  # the size of the chunk current_state points into
        # chunks of a pre-tokenized run are read and processed together (runahead.py) where they stay in this
        # thread, after the first chunk (the first batch waits for that one only)
        self._runs = isinstance(self.runner, ThreadRunner) and bool(ds.task.inline_runs)

    def _submit(self) -> None:
        """Read chunks until ``runner.ahead`` chunks or the byte budget are in flight, or the parent
        is exhausted; only one before the first chunk's examples are out (the first batch waits for
        nothing else), then as :meth:`_room` allows."""
        ahead = self.runner.ahead if self.current_state is not None else 1
        budget = getattr(self.runner, "ahead_bytes", None)  # None: chunks only (a Ray cluster's CPUs)
        while not self.exhausted and len(self.inflight) < ahead and (budget is None or self._room(budget)):
            state = self._next_start if self._next_start is not None else self.parent.get_state()
            if self.exact is None and self._runs and self.current_state is not None and read_run(self, state):
                continue
            if self.exact is not None:
                want, self.exact = self.exact, None
                recs = self.parent.take(want)
                size, exhausted = records_size(recs), len(recs) < want
            else:
                want = self.chunk
                recs, size, exhausted = read_chunk(self.parent, want, self.ds.chunk_bytes)
            self.chunk = min(2 * max(1, len(recs)), self.ds.chunk)
            if exhausted:
                self.exhausted = True
            self._next_start = end = self.parent.get_state()
            read = add_counts(sum_rejected(end), sum_rejected(state), -1)
            if not recs:
                if read:  # rejections after the last record: counted with an empty chunk
                    self.inflight.append((state, want, None, read, end, 0))
                break
            self.inflight_size += size
            self.inflight.append((state, len(recs), self.runner.submit(recs), read, end, size))

    def _room(self, budget: int) -> bool:
        """Another chunk may go: under ``budget`` in flight, and less text queued behind the chunk waited
        for than half the text handed out since the start or restore (see the module docstring)."""
        if not self.inflight:
            return True
        return self.inflight_size < budget and 2 * (self.inflight_size - self.inflight[0][5]) < self.taken

    def _advance(self) -> bool:
        self._submit()
        if not self.inflight:
            return False
        state, self.current_size, handle, read, self.current_end, size = self.inflight.popleft()
        self.inflight_size -= size
        self.taken += size
        outputs = self.runner.result(handle, state) if handle is not None else []
        self.current_state = state
        examples: list[Example] | ExampleBlock
        if isinstance(outputs, ExampleBlock):
            examples = outputs
            for record, rejection in outputs.rejected:
                self.rejections.add(rejection)
                if self._watch and self.ds.reject_limit and not outputs.examples_before(record) \
                        and self.rejections.total >= self.ds.reject_limit:
                    self._nothing(first=self.ds.reject_limit)
        else:
            examples = []
            for out in outputs:
                if isinstance(out, Rejection):
                    self.rejections.add(out)
                    if self._watch and self.ds.reject_limit and not examples and self.rejections.total >= self.ds.reject_limit:
                        self._nothing(first=self.ds.reject_limit)
                else:
                    examples.extend(out)
        if len(examples):
            self._watch = False
        self.current_rejected = add_counts(self.rejections.get_state(), read)
        self.current, self.skip = examples, 0
        return True

    def _nothing(self, first: int | None) -> None:
        counts = add_counts(dict(self.rejections.counts), sum_rejected(self.parent.get_state()))
        where = f"task {self.ds.task.kind!r}" if self.rejections.counts else "the spec's sources"
        error = SourceError(nothing_delivered(where, counts, self.rejections.samples, first=first))
        if first is None:  # at the end of the stream: a consumer may stand there (Prefetch), so stats() count
            error.at_end = True  # type: ignore[attr-defined]
        raise error

    def __next__(self) -> Example:
        if not self._ready():
            raise StopIteration
        ex = self.current[self.skip]
        self.skip += 1
        return ex

    def _ready(self) -> bool:
        """Advance to a chunk with examples left; False at the end of the stream."""
        while self.skip >= len(self.current):
            if not self._advance():
                if self._watch and not self.ds.share:
                    self._nothing(first=None)
                return False
        return True

    def peek_block(self) -> ExampleBlock | list[Example] | None:
        """The examples left in the current chunk (the next one when it is used up), without taking
        them: an :class:`ExampleBlock` (views) or a list; ``None`` at the end of the stream. Take
        the first ``n`` with :meth:`consume`; the state is then as after ``n`` calls of ``next``.
        """
        if not self._ready():
            return None
        cur = self.current
        return cur.slice(self.skip, len(cur)) if isinstance(cur, ExampleBlock) else cur[self.skip:]

    def peek_run(self) -> ExampleBlock | list[Example] | None:
        """:meth:`peek_block`, continued over the queued chunks processed with the current one as one
        run (:mod:`~feedline._tasks.runahead`): their examples as one block of views."""
        if not self._ready():
            return None
        cur = self.current
        if not isinstance(cur, ExampleBlock) or cur.base is None:
            return cur.slice(self.skip, len(cur)) if isinstance(cur, ExampleBlock) else cur[self.skip:]
        return cur.base[0].slice(cur.base[1] + self.skip, run_end(self))

    def consume(self, n: int) -> None:
        """Take the first ``n`` examples of :meth:`peek_block` (or :meth:`peek_run`, across its chunks):
        the state is then as after ``n`` calls of ``next``."""
        cur = self.current
        left = len(cur) - self.skip
        if n > left and isinstance(cur, ExampleBlock) and cur.base is not None:
            left = run_end(self) - cur.base[1] - self.skip
        if not 0 <= n <= left:
            raise ValueError(f"consume({n}): {left} examples are left in the chunk")
        while n:
            self._ready()
            k = min(n, len(self.current) - self.skip)
            self.skip += k
            n -= k

    def get_state(self) -> State:
        if self.current_state is None:
            return {"parent": self.parent.get_state(), "skip": 0, "rejected": self.rejections.get_state(),
                    "chunk": self.chunk}
        if self.skip == 0:  # a chunk that gave no example (the end of the stream): stand after it
            return {"parent": self.current_end, "skip": 0, "rejected": self.rejections.get_state(),
                    "chunk": min(2 * self.current_size, self.ds.chunk)}
        return {"parent": self.current_state, "skip": self.skip, "rejected": self.current_rejected,
                "chunk": self.current_size}

    def restore(self, own: Mapping[str, Any]) -> None:
        skip, rejected = int(own["skip"]), own["rejected"]
        chunk = self.ds.chunk if own["chunk"] is None else int(own["chunk"])  # older states: whole chunks
        self._drop_inflight()
        self.rejections.set_state(rejected)
        self.exhausted, self.current, self.current_state, self.current_end, self.skip = False, [], None, None, 0
        self._next_start, self._watch = None, False
        self.chunk = self.current_size = max(1, min(chunk, self.ds.chunk))
        if skip:
            self.exact = self.chunk  # the chunk the state points into, exactly as it was cut
            # ``rejected`` includes the current chunk, which _advance counts again: start from
            # the count before it (the chunk re-counts the same rejections: tasks are pure).
            self.rejections.set_state({})
            if not self._advance():
                raise StateError("task map: the state points past the end of the stream")
            base = add_counts({str(k): int(v) for k, v in rejected.items()}, self.current_rejected, -1)
            if any(v < 0 for v in base.values()):
                raise StateError(f"task map: rejected counts {dict(rejected)} are fewer than the chunk re-counts")
            self.rejections.set_state(add_counts(base, self.rejections.counts))
            self.current_rejected = {str(k): int(v) for k, v in rejected.items()}
            self.skip = skip

    def _drop_inflight(self) -> None:
        for _state, _size, handle, _read, _end, _bytes in self.inflight:
            if isinstance(handle, cf.Future):
                handle.cancel()
        self.inflight.clear()
        self.inflight_size, self.exact, self.taken = 0, None, 0  # other handles (Ray refs) are freed when dropped

    @property
    def rejected(self) -> dict[str, int]:
        """Every rejection counted so far (the parent's and the task's), as the state reports them."""
        return sum_rejected(self.get_state())

    def release(self) -> None:
        self._drop_inflight()
        self.current = []
        self.runner.close()
