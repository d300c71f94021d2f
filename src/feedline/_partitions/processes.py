"""The ``processes`` placement: partitions in worker processes, batches over pipes.

``parallel: {placement: processes, processes: N}`` starts ``N`` workers (0: one per partition, at
most the cores; :mod:`feedline._partitions.launch`: all at once, in the background, forkserver
where there is one); worker ``w`` owns partitions ``w, w + N, ...`` and runs each one's whole
pipeline (:mod:`feedline._partitions.worker`), the tokenizer's pool sized to its share of the
cores (``RAYON_NUM_THREADS``, which sentencepiece's ``num_threads`` follows too:
:func:`~feedline._core.cores.pool_threads`). Each batch crosses a pipe (its arrays in the worker's
shared memory, :mod:`feedline._partitions.ring`, where the system has it), with
the state after it only every :data:`~feedline._partitions.streams.ANCHOR_EVERY` batches: the
others stay in the worker until a state is read (a checkpoint: asked of the worker, or made again
here from the last one sent where the worker no longer keeps it), so a batch's state is pickled
only when needed; where every step's state is read (the service) each batch carries its own. The
composing thread reads the workers' pipes itself (:mod:`feedline._partitions.pool`: one wait on
them all; no receiving thread per worker). At most ``parallel.prefetch``
batches per partition are made and not yet taken by the composing stage (credit; a worker makes
its partitions' batches in turn on its own thread), so memory is bounded.

**Warm start.** A worker needs a while before its first batch (a process, its imports, the
tokenizer): until it says it is ready, its partitions run here, on threads (as ``threads`` runs
them), so the first steps never wait for a process. Where the machine has a core for each worker
beside two for this process (``auto``'s rule), every worker starts at the first ask, as without
warm start, while step 1 is made here; on fewer cores they start once step 1 is out (started
sooner, they would slow the thread that gives it). A partition starts here only when it is asked
for and its worker is not ready yet (one whose worker is ready first never runs here). The moment a worker is ready, its partitions'
threads are cut (:meth:`Prefetch.cut`): the batches they had queued are still handed out, and
the worker starts at once from the state after the last of them, restoring while they are taken.
The batch a thread was making is dropped, never handed out, and not waited for (at most one
batch's work per partition is made twice): with K threads sharing this process's interpreter,
waiting for each one's batch in turn and then for each worker's restore in turn stalled a
16-core node for 3-6 s after the workers were ready. A partition is one deterministic stream
wherever it runs, so the batches and states are those of ``threads``. A partition whose worker
died runs here again (when asked for) until its new worker is ready.

The parent keeps each partition's state after the last batch it handed out (or the last state
sent and the batches after it). A worker that dies (killed, out of memory) is restarted from those
states (making again and dropping the batches after the last one sent), so the stream goes on exactly; after
:data:`MAX_RESTARTS` deaths of one worker the stream fails with a :class:`FeedlineError` naming it.
A worker that exits with an error before it is ready (its start failed: almost always a script
that makes its Loader at import time, which each worker runs again) fails the stream at once,
naming the fix; a worker running a script's top level refuses to start workers of its own.
An error raised by a partition's pipeline (a bad spec, a missing file) is raised here as it was,
with the worker's traceback as its cause (:mod:`feedline._partitions.remote`); a ``SystemExit`` in
user code fails the stream the same way, without restarts. A worker that falls silent (stopped,
hung holding the interpreter: a live one says so every second) is named in a warning after a
quarter of ``parallel.hang_timeout`` (at most 30 s) and killed after all of it, then restarted
from its partitions' states like one that died. The processes themselves, their messages and that
watch are the :class:`~feedline._partitions.pool.WorkerPool`'s; each partition is a stage of its own
(:mod:`feedline._partitions.streams`: a worker stream, under a handover while a warm start runs it
here), and this class opens them and routes each worker's messages to them.
Workers exit when the parent dies, even by SIGKILL, and ignore Ctrl-C (the parent stops them).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any

from feedline._core.cores import usable_cores
from feedline._core.dataset import State
from feedline._core.deferred import materialize
from feedline._core.prefetch import Prefetch
from feedline._partitions.launch import DEAD, pickled
from feedline._partitions.placement import Make, PartitionStage, Placement
from feedline._partitions.pool import WorkerPool
from feedline._partitions.remote import with_remote
from feedline._partitions.ring import SLOTS
from feedline._partitions.streams import Handover, WorkerStream
from feedline._spec import ParallelSpec

__all__ = ["MAX_RESTARTS", "ProcessPlacement", "starts_together"]


#: Deaths of one worker process that are restarted before the stream fails.
MAX_RESTARTS = 3


def warm_start(setting: bool | str, workers: int) -> bool:
    """Whether partitions run on threads here until their workers are ready (``parallel.warm_start``).

    ``auto``: when the machine has a core for each worker to start on beside two for this process
    (its partition threads meanwhile, and the consumer): :func:`spare_cores`. With fewer, the workers' start (imports,
    the tokenizer: ~1 CPU second each) and their restore from the threads' states take the cores
    the threads serve from: on 2 cores with K = 2, the first batch came at 0.2 s warm against
    0.7 s cold, but by 3 s cold had delivered 18-19 M tokens of clm-short against 8-12 M
    (docs/benchmarks.md).

        >>> warm_start("auto", 14) == (usable_cores() >= 16), warm_start(False, 1)
        (True, False)
    """
    if isinstance(setting, bool):
        return setting
    return spare_cores(workers)


def starts_together(options: ParallelSpec, k: int) -> bool:
    """Whether the workers of ``k`` partitions all start at the first ask (cold, or warm with a core
    for each); else step 1 is made here first and they start at the next ask."""
    workers = min(k, options.processes or usable_cores())
    return not warm_start(options.warm_start, workers) or spare_cores(workers)


def spare_cores(workers: int) -> bool:
    """Whether the machine has a core for each of ``workers`` worker processes beside two for this one."""
    return usable_cores() >= workers + 2


def _local(make: Make, p: int, prefetch: int, wake: Callable[[], None]) -> Callable[[State | None], Prefetch]:
    """Partition ``p`` on a thread here, from a state (detached: a handover never waits for it;
    ``wake``: a batch made wakes a composing stage waiting for it or for a worker)."""

    def open_here(state: State | None) -> Prefetch:
        stage = Prefetch(lambda: iter(make(p)), prefetch, name=f"feedline-partition-{p}", detach=True, wake=wake)
        if state is not None:
            stage.set_state(materialize(state))
        return stage

    return open_here


class ProcessPlacement(Placement):
    """Partitions in worker processes, on threads here until each worker is ready (see the module docstring)."""

    def __init__(self, make: Make, k: int, options: ParallelSpec) -> None:
        super().__init__(make, k, options)
        self.workers = min(k, options.processes or usable_cores())
        self.warm = warm_start(options.warm_start, self.workers)
        # every worker starts at the first ask: cold, or warm with a core for each (the workers' start
        # then takes no core from step 1's thread here: on the 16-core node, started after step 1
        # they were ready at ~1.0 s, against ~0.8 s started with it)
        self.together = starts_together(options, k)
        self.pool = WorkerPool(k, self.workers, options)   # (stops its workers when collected, if never closed)
        self.restarts = self.pool.restarts   # each worker's restarts so far (deaths and silences)
        self.pids = self.pool.pids           # the worker processes running now (for tests and monitoring)
        self.streams: dict[int, WorkerStream] = {}   # each partition's stream now (its worker's messages go there)
        self._gens = itertools.count()

    def open(self, p: int, state: State | None) -> PartitionStage:
        if self.pool.make_bytes is None:
            self.pool.make_bytes = pickled(self.make)  # a spec that cannot go raises here, before anything starts
        remote = WorkerStream(self, p, state)
        if not self.warm:
            return remote
        return Handover(_local(self.make, p, self.options.prefetch, self.pool.wake), remote)

    def serving(self) -> list[str]:
        """Where each partition's batches come from now: ``worker`` or ``local`` (for tests and monitoring)."""
        return ["worker" if (s := self.streams.get(p)) is not None and s.begun and (
            s.owner is None or (s.owner.mode == "remote" and s.owner.local is None)) else "local" for p in range(self.k)]

    # ----------------------------------------------------------------- the streams' calls
    def generation(self) -> int:
        return next(self._gens)

    def attach(self, stream: WorkerStream) -> None:
        """``stream`` receives its partition's messages; its worker starts (every worker, where they start together)."""
        self.streams[stream.p] = stream
        for w in range(self.workers) if self.together else [self.pool.owner(stream.p)]:
            self.pool.get(w)

    def attached(self, stream: WorkerStream) -> bool:
        return self.streams.get(stream.p) is stream

    def detach(self, stream: WorkerStream) -> None:
        if self.attached(stream):
            del self.streams[stream.p]

    def worker_ready(self, p: int) -> bool:
        worker = self.pool.procs[self.pool.owner(p)]
        return worker is not None and worker.ready

    def send(self, p: int, msg: tuple[Any, ...]) -> None:
        self.pool.get(self.pool.owner(p)).send(msg)

    def credit(self, p: int, gen: int) -> bool:
        """Count a batch of partition ``p`` taken in its worker's shared memory (its credit), waking its
        sender where it waits for credit; ``False`` where the worker has no ring (credit goes by message)."""
        worker = self.pool.procs[self.pool.owner(p)]
        ring = worker.reader.ring if worker is not None else None
        if worker is None or ring is None:
            return False
        slot = p // self.pool.size   # its place among the worker's partitions (``range(w, K, size)``), as it numbers them
        if slot >= SLOTS:
            return False
        if ring.took(slot):
            worker.send(("credit", gen, p, 0))   # (a wake: the count is the credit)
        return True

    def start_state(self, p: int) -> State:
        """Partition ``p``'s state at its start, read here."""
        it = iter(self.make(p))
        try:
            return it.get_state()
        finally:
            it.close()

    def ask_state(self, p: int, gen: int, seq: int) -> State | None:
        """The state after batch ``seq`` of partition ``p``'s start ``gen``, from its worker (any
        thread); ``None`` where the worker no longer keeps it or is gone."""
        worker = self.pool.procs[self.pool.owner(p)]
        if worker is None or not worker.ready:
            return None
        # (a worker that does not answer within seconds is stopped or stuck: the state is made here)
        return worker.ask((gen, p, seq), min(5.0, self.options.hang_timeout))  # type: ignore[no-any-return]

    def replay_state(self, p: int, base: State | None, n: int) -> State:
        """Partition ``p``'s state ``n`` batches after ``base``, made again here (exact: one
        deterministic stream wherever it runs)."""
        it = iter(self.make(p))
        try:
            if base is not None:
                it.set_state(materialize(base))
            for _ in range(n):
                next(it)
            return it.get_state()
        finally:
            it.close()

    @staticmethod
    def remote_error(msg: tuple[Any, ...]) -> BaseException:
        return with_remote(msg[3], msg[4])

    def wait(self, p: int | None = None) -> None:
        """Handle the next message of any worker (waits for one, watching for silent workers and for partition ``p``)."""
        self._handle(*self.pool.wait(p))

    def idle(self) -> None:
        """Wait until a worker says something or a thread here queues a batch (at most a heartbeat)."""
        self.pool.idle()

    def drain(self) -> None:
        """Handle every message already received from any worker (never waits)."""
        for w, msg in self.pool.pending():
            self._handle(w, msg)

    def _handle(self, w: int, msg: tuple[Any, ...]) -> None:
        kind = msg[0]
        if kind == DEAD:
            worker = self.pool.died(w, MAX_RESTARTS)
            for p in worker.owned:
                if p in self.streams:
                    self.streams[p].on_lost()
            self.pool.get(w)   # restarted: its streams begin again when it is ready
        elif kind == "ready":
            self.pool.get(w).ready = True
            for p in self.pool.get(w).owned:
                if p in self.streams:
                    self.streams[p].on_ready()
        elif kind == "many":  # several messages the worker had ready at once: all kept, then any error raised
            failure = None
            for one in msg[1]:
                try:
                    self._handle(w, one)
                except Exception as e:
                    failure = failure or e
            if failure is not None:
                raise failure
        else:
            stream = self.streams.get(msg[2])
            if stream is not None and stream.gen == msg[1]:  # else of an earlier start of the partition
                stream.receive(msg)

    def close(self) -> None:
        self.pool.close()
        self.streams.clear()
