"""Apply a task to a record stream in chunks, on worker threads, in order, with exact state.

Records are read in the caller's thread in chunks of ``chunk`` records; each chunk's
:meth:`Task.process` runs on a thread pool (tokenizers release the GIL), up to ``ahead`` chunks
in flight; examples come out in record order. The state is the parent's state *at the start of
the current chunk* plus how many of its examples were already yielded; a restore re-reads and
re-processes that one chunk and skips, which gives the same examples because tasks are pure
functions of (record, seed, epoch, key).

State: ``{"parent": ..., "skip": n, "rejected": {reason: n}}``.
"""

from __future__ import annotations

import collections
import concurrent.futures as cf
from collections.abc import Mapping
from typing import Any

from feedline.core.dataset import Dataset, DatasetIterator, State
from feedline.core.record import Example, Record, Rejection
from feedline.errors import StateError
from feedline.sources.report import Rejections
from feedline.tasks.base import Task, TaskOutput

__all__ = ["TaskMap"]


class TaskMap(Dataset[Example]):
    """The examples of ``task`` over ``parent``'s records."""

    def __init__(self, parent: Dataset[Record], task: Task, *, chunk: int = 256, workers: int = 1,
                 on_error: str = "skip") -> None:
        self.parent = parent
        self.task = task
        self.chunk = chunk
        self.workers = max(1, workers)
        self.on_error = on_error

    def __iter__(self) -> TaskMapIterator:
        return TaskMapIterator(self)


class TaskMapIterator(DatasetIterator[Example]):
    """Cursor over a :class:`TaskMap`."""

    def __init__(self, ds: TaskMap) -> None:
        self.ds = ds
        self.parent = iter(ds.parent)
        self.rejections = Rejections(ds.on_error)
        self.pool: cf.ThreadPoolExecutor | None = None
        self.inflight: collections.deque[tuple[State, cf.Future[list[TaskOutput]] | list[TaskOutput], list[Record]]] = collections.deque()
        self.exhausted = False
        self.current: list[Example] = []
        self.current_state: State | None = None
        self.current_rejected: dict[str, int] = {}
        self.skip = 0

    def _submit(self) -> None:
        """Read chunks until ``ahead`` are in flight or the parent is exhausted."""
        ahead = self.ds.workers + 1
        while not self.exhausted and len(self.inflight) < ahead:
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
            if self.ds.workers > 1:
                if self.pool is None:
                    self.pool = cf.ThreadPoolExecutor(self.ds.workers, thread_name_prefix="feedline-task")
                self.inflight.append((state, self.pool.submit(self.ds.task.process, recs), recs))
            else:
                self.inflight.append((state, self.ds.task.process(recs), recs))

    def _advance(self) -> bool:
        self._submit()
        if not self.inflight:
            return False
        state, fut, _recs = self.inflight.popleft()
        outputs = fut.result() if isinstance(fut, cf.Future) else fut
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

    def set_state(self, state: Mapping[str, Any]) -> None:
        try:
            parent, skip, rejected = state["parent"], int(state["skip"]), state["rejected"]
        except (KeyError, TypeError, ValueError) as e:
            raise StateError(f"task map: malformed state ({e})") from e
        self._drain()
        self.parent.set_state(parent)
        self.rejections.set_state(rejected)
        self.exhausted, self.current, self.current_state, self.skip = False, [], None, 0
        if skip:
            if not self._advance():
                raise StateError("task map: the state points past the end of the stream")
            self.skip = skip

    def _drain(self) -> None:
        for _state, fut, _recs in self.inflight:
            if isinstance(fut, cf.Future):
                fut.cancel()
        self.inflight.clear()

    @property
    def rejected(self) -> dict[str, int]:
        return dict(self.rejections.counts)

    def close(self) -> None:
        self._drain()
        if self.pool is not None:
            self.pool.shutdown(wait=False, cancel_futures=True)
            self.pool = None
        self.parent.close()
