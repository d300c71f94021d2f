"""Apply a task to a record stream in chunks, in order, with exact state.

Records are read in the caller's thread in chunks of ``chunk`` records; a :class:`ChunkRunner`
runs each chunk's :meth:`Task.process` somewhere (a thread pool here; Ray workers in
:mod:`feedline.ray.map`), up to ``runner.ahead`` chunks in flight; examples come out in record
order. The state is the parent's state *at the start of the current chunk* plus how many of its
examples were already yielded; a restore re-reads and re-processes that one chunk and skips,
which gives the same examples because tasks are pure functions of (record, seed, epoch, key).
The runner never appears in the state, so a state resumes under any runner.

:meth:`TaskMap.rebuild` answers the stages above (batchers' buffers): it re-reads the records
of the refs through ``parent.fetch`` and re-processes them in one batched task call.

State: ``{"parent": ..., "skip": n, "rejected": {reason: n}}``.
"""

from __future__ import annotations

import collections
import concurrent.futures as cf
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from feedline.core.dataset import Dataset, DatasetIterator, State
from feedline.core.record import Example, ExampleRef, Record, Rejection
from feedline.core.report import Rejections
from feedline.errors import StateError
from feedline.tasks.base import Task, TaskOutput

__all__ = ["ChunkRunner", "TaskMap", "ThreadRunner"]

DEFAULT_CHUNK = 256


class ChunkRunner(Protocol):
    """Where chunks are processed: ``submit`` returns a handle, ``result`` waits for it."""

    ahead: int

    def submit(self, records: Sequence[Record]) -> Any: ...

    def result(self, handle: Any, state: State) -> list[TaskOutput]: ...

    def close(self) -> None: ...


class ThreadRunner:
    """Process chunks on ``workers`` threads, ``workers + 2`` chunks in flight.

    Even one thread runs apart from the caller, so reading, batching and the consumer overlap the
    tokenizer; the tokenizer's Rust batch call already spreads each chunk over every core. One
    calling thread was measured fastest (``bench/tuning.py``: more threads contend for the GIL
    in the tasks' Python and for the tokenizer's thread pool).
    """

    def __init__(self, task: Task, workers: int) -> None:
        self.task = task
        self.workers = max(1, workers)
        self.ahead = self.workers + 2
        self.pool: cf.ThreadPoolExecutor | None = None

    def submit(self, records: Sequence[Record]) -> Any:
        if self.pool is None:
            self.pool = cf.ThreadPoolExecutor(self.workers, thread_name_prefix="feedline-task")
        return self.pool.submit(self.task.process, records)

    def result(self, handle: Any, state: State) -> list[TaskOutput]:
        return handle.result() if isinstance(handle, cf.Future) else handle  # type: ignore[no-any-return]

    def close(self) -> None:
        if self.pool is not None:
            self.pool.shutdown(wait=False, cancel_futures=True)
            self.pool = None


class TaskMap(Dataset[Example]):
    """The examples of ``task`` over ``parent``'s records."""

    def __init__(self, parent: Dataset[Record], task: Task, *, chunk: int = DEFAULT_CHUNK, workers: int = 1,
                 on_error: str = "skip") -> None:
        if chunk < 1:
            raise ValueError(f"chunk: {chunk} must be >= 1")
        self.parent = parent
        self.task = task
        self.chunk = chunk
        self.workers = max(1, workers)
        self.on_error = on_error

    def runner(self) -> ChunkRunner:
        """A fresh runner for one iterator (override to run chunks elsewhere)."""
        return ThreadRunner(self.task, self.workers)

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
    STATE_KEYS = ("skip", "rejected")

    def __init__(self, ds: TaskMap) -> None:
        self.ds = ds
        self.runner = ds.runner()
        self.parent = iter(ds.parent)
        self.rejections = Rejections(ds.on_error)
        self.inflight: collections.deque[tuple[State, Any]] = collections.deque()
        self.exhausted = False
        self.current: list[Example] = []
        self.current_state: State | None = None
        self.current_rejected: dict[str, int] = {}
        self.skip = 0

    def _submit(self) -> None:
        """Read chunks until ``runner.ahead`` are in flight or the parent is exhausted."""
        while not self.exhausted and len(self.inflight) < self.runner.ahead:
            state = self.parent.get_state()
            recs: list[Record] = []
            for rec in self.parent:
                recs.append(rec)
                if len(recs) == self.ds.chunk:
                    break
            if len(recs) < self.ds.chunk:
                self.exhausted = True
            if not recs:
                break
            self.inflight.append((state, self.runner.submit(recs)))

    def _advance(self) -> bool:
        self._submit()
        if not self.inflight:
            return False
        state, handle = self.inflight.popleft()
        outputs = self.runner.result(handle, state)
        self.current_state = state
        self.current_rejected = self.rejections.get_state()
        examples: list[Example] = []
        for out in outputs:
            if isinstance(out, Rejection):
                self.rejections.add(out)
            else:
                examples.extend(out)
        self.current, self.skip = examples, 0
        return True

    def __next__(self) -> Example:
        while self.skip >= len(self.current):
            if not self._advance():
                raise StopIteration
        ex = self.current[self.skip]
        self.skip += 1
        return ex

    def get_state(self) -> State:
        if self.current_state is None:
            return {"parent": self.parent.get_state(), "skip": 0, "rejected": self.rejections.get_state()}
        return {"parent": self.current_state, "skip": self.skip, "rejected": self.current_rejected}

    def restore(self, own: Mapping[str, Any]) -> None:
        skip = int(own["skip"])
        self._drop_inflight()
        self.rejections.set_state(own["rejected"])
        self.exhausted, self.current, self.current_state, self.skip = False, [], None, 0
        if skip:
            if not self._advance():
                raise StateError("task map: the state points past the end of the stream")
            self.skip = skip

    def _drop_inflight(self) -> None:
        for _state, handle in self.inflight:
            if isinstance(handle, cf.Future):
                handle.cancel()
        self.inflight.clear()  # other handles (Ray refs) are freed when dropped

    @property
    def rejected(self) -> dict[str, int]:
        return dict(self.rejections.counts)

    def release(self) -> None:
        self._drop_inflight()
        self.current = []
        self.runner.close()
