"""Run a task over a record stream as Ray tasks across a cluster, in order, with exact state.

:class:`RayTaskMap` is the Ray engine's drop-in for :class:`feedline._tasks.map.TaskMap`. The
driver reads records (cheap: a fraction of tokenization's cost, see ``docs/ray.md``) in chunks
of ``chunk``, submits ``task.process(chunk)`` as a Ray task, keeps up to ``ahead`` chunks in
flight over the cluster, and takes results back in submission order::

    driver:  read chunk 0 ─► submit ─┐  read chunk 1 ─► submit ─┐  ...   get(0) get(1) ...
    cluster:                         └► worker A: process(0)    └► worker B: process(1)

Planning, shuffling, packing and cursors never leave the driver, so the examples, their order,
the rejection counts and the state are exactly :class:`TaskMap`'s: the state (the parent's
state at the start of the current chunk plus the examples of it already yielded) has the same
layout, and a state saved under one engine resumes under the other.

Each Ray task reserves ``parallel.num_cpus`` (one CPU) and tokenizes on one thread (``TOKENIZERS_PARALLELISM=false``
in the workers), so N CPUs run N chunks at once. The task travels once per job: it is ``ray.put`` in the object store, and each worker process
unpickles it (tokenizer included) on first use and keeps it, so chunks carry only records.
A worker that dies mid-chunk (node lost, OOM-killed) has its chunk re-run by Ray
(``max_retries``); since a chunk's output is a pure function of its records, the retry gives
the same examples and nothing is lost or duplicated.

State: ``{"parent": ..., "skip": n, "rejected": {reason: n}}``.
"""

from __future__ import annotations

import collections
from collections.abc import Sequence
from typing import Any

from feedline._core.dataset import Dataset, State
from feedline._core.record import Record
from feedline._ray.runtime import cluster_cpus, connect
from feedline._spec import ParallelSpec
from feedline._tasks.base import Task, TaskOutput
from feedline._tasks.map import DEFAULT_CHUNK, TaskMap
from feedline.errors import FeedlineError, TaskError

__all__ = ["RayRunner", "RayTaskMap"]
#: Ray re-runs a chunk whose worker died this many times before the stream fails.
DEFAULT_RETRIES = 3

#: Each Ray task reserves one CPU, so its tokenizer runs one thread: the cluster's parallelism is
#: the number of tasks, without N tasks x all-cores Rayon pools oversubscribing a node.
WORKER_ENV = {"TOKENIZERS_PARALLELISM": "false"}

# Worker side: tasks already unpickled in this worker process, by object-ref id (a few jobs at most).
_TASKS: collections.OrderedDict[str, Task] = collections.OrderedDict()
_TASKS_KEPT = 4


def process_chunk(task_box: list[Any], records: Sequence[Record]) -> list[TaskOutput]:
    """Run on a Ray worker: ``task.process(records)`` with the task cached in this process.

    ``task_box`` holds the task's object ref inside a list, so Ray does not resolve (and
    unpickle) it on every call; it is fetched here once per worker process.
    """
    import ray

    ref = task_box[0]
    key = ref.hex()
    task = _TASKS.get(key)
    if task is None:
        task = ray.get(ref)
        _TASKS[key] = task
        while len(_TASKS) > _TASKS_KEPT:
            _TASKS.popitem(last=False)
    return task.process(records)


class RayRunner:
    """A :class:`~feedline._tasks.map.ChunkRunner` that runs chunks as Ray tasks; connects on creation."""

    def __init__(self, task: Task, options: ParallelSpec, *, ahead: int | None, retries: int) -> None:
        self.task = task
        self.retries = retries
        self.ray = connect(options)
        self.ahead = ahead or max(2, int(2 * cluster_cpus() / options.num_cpus))
        self.remote = self.ray.remote(num_cpus=options.num_cpus, max_retries=retries, retry_exceptions=False,
                                      runtime_env={"env_vars": WORKER_ENV})(process_chunk)
        self.task_ref: Any = None

    def submit(self, records: Sequence[Record]) -> Any:
        if self.task_ref is None:
            self.task_ref = self.ray.put(self.task)
        return self.remote.remote([self.task_ref], records)

    def result(self, handle: Any, state: State) -> list[TaskOutput]:
        try:
            return self.ray.get(handle)  # type: ignore[no-any-return]
        except self.ray.exceptions.RayTaskError as e:
            cause = getattr(e, "cause", None)
            if isinstance(cause, FeedlineError):
                raise cause from None
            raise TaskError(f"task {self.task.kind!r} failed on a Ray worker for the chunk read from {state}: {e}") from e
        except self.ray.exceptions.RayError as e:
            raise TaskError(
                f"a Ray worker processing a chunk of {self.task.kind!r} was lost {self.retries + 1} times ({e}); "
                "check the cluster's health (OOM kills, lost nodes) or raise the retries"
            ) from e

    def close(self) -> None:
        """Leaves the Ray session running (it may be the caller's)."""


class RayTaskMap(TaskMap):
    """The examples of ``task`` over ``parent``'s records, computed on a Ray cluster.

    Args:
        parent: the records (read in the driver).
        task: the task; pickled once and shipped to the workers.
        options: where to run (``parallel``'s ``address``, and the ``num_cpus`` each task reserves); see
            :func:`feedline._ray.runtime.connect`.
        chunk: records per Ray task (keep the default to share states with the local engine).
        ahead: chunks in flight (default: twice as many as the cluster's CPUs run at once).
        retries: re-runs of a chunk whose worker died.
        on_error: ``skip`` counts rejected records, ``raise`` raises on the first.

    Example:
        >>> from feedline._pipeline import Pipeline                       # doctest: +SKIP
        >>> p = Pipeline({**spec, "parallel": {"map": "ray", "address": "local"}})
        >>> examples = iter(p.examples())                                # TaskMap's iterator, Ray runner
    """

    def __init__(self, parent: Dataset[Record], task: Task, options: ParallelSpec | None = None, *,
                 chunk: int = DEFAULT_CHUNK, ahead: int | None = None, retries: int = DEFAULT_RETRIES,
                 on_error: str = "skip", reject_limit: int = 0) -> None:
        super().__init__(parent, task, chunk=chunk, on_error=on_error, reject_limit=reject_limit)
        self.options = options or ParallelSpec(map="ray")
        self.ahead = ahead
        self.retries = retries

    def runner(self) -> RayRunner:
        return RayRunner(self.task, self.options, ahead=self.ahead, retries=self.retries)

    def __repr__(self) -> str:
        return f"RayTaskMap({self.task!r}, address={self.options.address!r}, chunk={self.chunk})"


def ray_engine(pipeline: Any) -> RayTaskMap:
    """The ``ray`` map of a pipeline (installed by the package root: ``parallel: {map: ray}``)."""
    s = pipeline.spec
    return RayTaskMap(pipeline.records(), pipeline.task, s.parallel, on_error=s.on_error, reject_limit=s.reject_limit)
