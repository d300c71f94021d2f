"""The ``processes`` placement: partitions in worker processes, batches over pipes.

``parallel: {placement: processes, processes: N}`` starts ``N`` workers (0: one per partition, at
most the cores; :mod:`feedline._partitions.launch`: all at once, in the background, forkserver
where there is one); worker ``w`` owns partitions ``w, w + N, ...`` and runs each one's whole
pipeline (:mod:`feedline._partitions.worker`), the tokenizer's pool sized to its share of the
cores (``RAYON_NUM_THREADS``, which sentencepiece's ``num_threads`` follows too:
:func:`~feedline._core.cores.pool_threads`). Each batch crosses a pipe with
the state after it; a thread per worker receives them into a queue. At most ``parallel.prefetch``
batches per partition are on their way to the composing stage (credit) and as many made ahead in
the worker, so memory is bounded.

**Warm start.** A worker needs a while before its first batch (a process, its imports, the
tokenizer): until it says it is ready, its partitions run here, on threads (as ``threads`` runs
them), so the first steps never wait for a process. Until step 1 is out only the partition asked
first runs; then the other partitions start here and the workers start: started sooner, on few
cores, they would slow the thread that gives it. When a worker is ready, each of its
partitions' threads is asked to finish (:meth:`Prefetch.finish`): it stops after the batch it is
making, the batches it made are still handed out, and the worker is started from the state after
the last of them, restoring while they are taken. No batch is made twice (a partition is one
deterministic stream wherever it runs). A partition whose worker died runs here again until its
new worker is ready.

The parent keeps each partition's state after the last batch it handed out. A worker that dies
(killed, out of memory) is restarted from those states, so the stream goes on exactly; after
:data:`MAX_RESTARTS` deaths of one worker the stream fails with a :class:`FeedlineError` naming it.
A worker that exits with an error before it is ready (its start failed: almost always a script
that makes its Loader at import time, which each worker runs again) fails the stream at once,
naming the fix; a worker running a script's top level refuses to start workers of its own.
An error raised by a partition's pipeline (a bad spec, a missing file) is raised here as it was,
with the worker's traceback as its cause (:mod:`feedline._partitions.remote`); a ``SystemExit`` in
user code fails the stream the same way, without restarts. A worker that falls silent (stopped,
hung holding the interpreter: a live one says so every second) is named in a warning after a
quarter of ``parallel.hang_timeout`` (at most 30 s) and killed after all of it, then restarted
from its partitions' states like one that died. The processes themselves, their inbox and that
watch are the :class:`~feedline._partitions.pool.WorkerPool`'s; this class keeps the partitions.
Workers exit when the parent dies, even by SIGKILL, and ignore Ctrl-C (the parent stops them).
"""

from __future__ import annotations

from collections import deque
from typing import Any

from feedline._core.cores import usable_cores
from feedline._core.dataset import State
from feedline._core.deferred import materialize
from feedline._core.prefetch import Prefetch
from feedline._partitions.launch import DEAD, pickled
from feedline._partitions.placement import Make, Part, Placement
from feedline._partitions.pool import WorkerPool
from feedline._partitions.remote import with_remote
from feedline._spec import ParallelSpec

__all__ = ["MAX_RESTARTS", "ProcessPlacement"]


#: Deaths of one worker process that are restarted before the stream fails.
MAX_RESTARTS = 3
_END = object()
# Where a partition's batches come from: a thread here (its worker not ready yet), a thread here
# handing out what it made before it stopped (its worker then starts after them), the worker.
_LOCAL, _FINISHING, _WORKER = "local", "finishing", "worker"


def warm_start(setting: bool | str, workers: int) -> bool:
    """Whether partitions run on threads here until their workers are ready (``parallel.warm_start``).

    ``auto``: when the machine has a core for each worker to start on beside two for this process
    (its partition threads meanwhile, and the consumer). With fewer, the workers' start (imports,
    the tokenizer: ~1 CPU second each) and their restore from the threads' states take the cores
    the threads serve from: on 2 cores with K = 2, the first batch came at 0.2 s warm against
    0.7 s cold, but by 3 s cold had delivered 18-19 M tokens of clm-short against 8-12 M
    (docs/benchmarks.md).

        >>> warm_start("auto", 14) == (usable_cores() >= 16), warm_start(False, 1)
        (True, False)
    """
    if isinstance(setting, bool):
        return setting
    return usable_cores() >= workers + 2


def _local(make: Make, p: int, prefetch: int, state: State | None) -> Prefetch:
    """Partition ``p`` on a thread here, from ``state`` (detached: a handover never waits for it)."""
    stage = Prefetch(lambda: iter(make(p)), prefetch, name=f"feedline-partition-{p}", detach=True)
    if state is not None:
        stage.set_state(materialize(state))
    return stage


class ProcessPlacement(Placement):
    """Partitions in worker processes, on threads here until each worker is ready (see the module docstring)."""

    def __init__(self, make: Make, k: int, options: ParallelSpec) -> None:
        super().__init__(make, k, options)
        self.workers = min(k, options.processes or usable_cores())
        self.warm = warm_start(options.warm_start, self.workers)
        self.pool = WorkerPool(k, self.workers, options)   # (stops its workers when collected, if never closed)
        self._queues: list[deque[Any]] = [deque() for _ in range(k)]
        self._local: list[Prefetch | None] = [None] * k
        self._out = False   # a batch was handed out (warm start: until step 1 is out, only its partition runs)
        self._gen = -1
        self.restarts = self.pool.restarts   # each worker's restarts so far (deaths and silences)
        self.pids = self.pool.pids           # the worker processes running now (for tests and monitoring)
        self._credit_every = max(1, options.prefetch // 2)
        self._reset([None] * k)

    def _reset(self, states: list[State | None]) -> None:
        """Every partition at ``states``, nothing of the last start kept (a new generation)."""
        self._gen += 1
        self._taken = list(states)   # each partition's state after the last batch handed out
        self._ended = [False] * self.k
        self._end: list[State | None] = [None] * self.k   # each partition's state at its end (see end_state)
        self._failed: list[BaseException | None] = [None] * self.k  # a partition's error, raised again when asked
        self._owed = [0] * self.k   # batches taken since the partition's worker was last given credit
        self._mode = [_LOCAL] * self.k  # without warm_start, a partition waits for its worker
        self._started = False  # the threads here started (at the first ask after a start or restore)
        for p in range(self.k):
            self._close_local(p)
            self._queues[p].clear()

    # ----------------------------------------------------------------- workers
    def _wait(self, p: int | None = None) -> None:
        """Handle the next message of any worker (waits for one, watching for silent workers and for partition ``p``)."""
        self._handle(*self.pool.wait(p))

    def _drain(self) -> None:
        """Handle every message already received from any worker (never waits)."""
        for w, msg in self.pool.pending():
            self._handle(w, msg)

    def _handle(self, w: int, msg: tuple[Any, ...]) -> None:
        kind = msg[0]
        if kind == DEAD:
            self._restart(w)
            return
        if kind == "ready":
            self._ready(w)
            return
        if kind == "many":  # several messages the worker had ready at once: all kept, then any error raised
            failure = None
            for one in msg[1]:
                try:
                    self._handle(w, one)
                except Exception as e:
                    failure = failure or e
            if failure is not None:
                raise failure
            return
        if msg[1] != self._gen:
            return  # from before the last restore
        p = msg[2]
        if self._ended[p]:
            return
        if kind == "batch":
            self._queues[p].append((msg[3], msg[4]))
        elif kind == "end":
            self._queues[p].append((_END, msg[3]))
        else:
            self._failed[p] = with_remote(msg[3], msg[4])
            raise self._failed[p]

    def _ready(self, w: int) -> None:
        worker = self.pool.get(w)
        worker.ready = True
        start = {}
        for p in worker.owned:
            local = self._local[p]
            if self._ended[p]:
                continue
            if local is not None and local.running:   # it finishes first: the worker starts after its last batch
                local.finish()
                self._mode[p] = _FINISHING
                continue
            self._close_local(p)
            self._mode[p], self._owed[p] = _WORKER, 0   # a start gives the worker its whole credit again
            start[p] = materialize(self._taken[p])
        worker.send(("start", self._gen, start))

    def _restart(self, w: int) -> None:
        worker = self.pool.died(w, MAX_RESTARTS)
        for p in worker.owned:  # what it sent and was not taken is made again, here until the new worker is ready
            self._queues[p].clear()
            if self._mode[p] == _FINISHING:   # a thread finishing for the dead worker: a fresh one goes on
                self._close_local(p)
            self._mode[p], self._owed[p] = _LOCAL, 0
            if self.warm and not self._ended[p]:
                self._local_stage(p).start()
        self.pool.get(w)

    # ----------------------------------------------------------------- local threads
    def _local_stage(self, p: int) -> Prefetch:
        stage = self._local[p]
        if stage is None:
            stage = self._local[p] = _local(self.make, p, self.options.prefetch, self._taken[p])
        return stage

    def _close_local(self, p: int) -> None:
        stage, self._local[p] = self._local[p], None
        if stage is not None:
            stage.close()

    # ----------------------------------------------------------------- placement
    def next(self, p: int) -> tuple[Part, State] | None:
        if self._ended[p]:
            return None
        failed = self._failed[p]
        if failed is not None:  # its worker stopped the partition: asking again must not wait forever
            raise failed
        if self.pool.make_bytes is None:
            self.pool.make_bytes = pickled(self.make)  # a spec that cannot go raises here, before anything starts
        if not self.warm:
            for v in range(self.workers):
                self.pool.get(v)
        elif self._out and not self._started:
            self._start_rest()
        return self._next(p)

    def _start_rest(self) -> None:
        """Warm start, at the first ask after step 1 is out (made by the partition asked first alone:
        on few cores, K - 1 more pipelines and K processes starting would slow it): every other
        partition here and the workers, so none waits for its turn to start."""
        self._started = True
        for q in range(self.k):
            if self._mode[q] != _WORKER and not self._ended[q]:
                self._local_stage(q).start()
        for v in range(self.workers):
            self.pool.get(v)

    def _next(self, p: int) -> tuple[Part, State] | None:
        self._drain()  # hears "ready"s, batches, deaths
        w = self.pool.owner(p)
        while True:
            if not self.warm:
                while not self.pool.get(w).ready:
                    self._wait()
            if self._mode[p] != _WORKER:
                return self._next_local(p)
            while not self._queues[p] and self._mode[p] == _WORKER:
                self._wait(p)
            if self._mode[p] == _WORKER:
                break  # else its worker died meanwhile: restarted, and here (warm start) until it is ready
        batch, state = self._queues[p].popleft()
        self._out = True
        if batch is _END:
            self._ended[p], self._end[p] = True, state
            return None
        self._taken[p] = state
        self._owed[p] += 1
        if self._owed[p] >= self._credit_every:  # credit in bulk: fewer messages, the worker stays ahead
            self.pool.get(w).send(("credit", self._gen, p, self._owed[p]))
            self._owed[p] = 0
        return batch, state

    def _next_local(self, p: int) -> tuple[Part, State] | None:
        try:
            got = next(self._local_stage(p), None)
        except BaseException as e:
            self._failed[p] = e
            self._close_local(p)
            raise
        self._out = True
        if got is None:
            stage = self._local_stage(p)
            self._close_local(p)
            if stage.finished:   # every batch it made was handed out: its worker starts after the last
                self._mode[p], self._owed[p] = _WORKER, 0
                self.pool.get(self.pool.owner(p)).send(("start", self._gen, {p: materialize(self._taken[p])}))
                return self._next(p)
            self._ended[p] = True
            self._end[p] = stage.end_state
            return None
        self._taken[p] = got[1]
        return got

    def end_state(self, p: int) -> State | None:
        return self._end[p]

    def set_states(self, states: list[State | None]) -> None:
        self._reset(states)
        for worker in self.pool.procs:
            if worker is not None and worker.ready:
                for p in worker.owned:
                    self._mode[p] = _WORKER
                worker.send(("start", self._gen, {p: states[p] for p in worker.owned}))

    def close(self) -> None:
        self.pool.close()
        for p in range(self.k):
            self._close_local(p)
            self._queues[p].clear()
