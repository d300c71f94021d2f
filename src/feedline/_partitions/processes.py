"""The ``processes`` placement: partitions in spawned worker processes, batches over pipes.

``parallel: {placement: processes, processes: N}`` spawns ``N`` workers (0: one per partition, at
most the cores); worker ``w`` owns partitions ``w, w + N, ...`` and runs each one's whole pipeline
(:mod:`feedline._partitions.worker`), the tokenizer's pool sized to its share of the cores
(``RAYON_NUM_THREADS``, which sentencepiece's ``num_threads`` follows too: :func:`~feedline._core.cores.pool_threads`). Each
batch crosses a pipe with the state after it; a thread per worker receives them into a queue, and
at most ``parallel.prefetch`` batches per partition are ahead of the composing stage (credit), so
memory is bounded.

The parent keeps each partition's state after the last batch it handed out. A worker that dies
(killed, out of memory) is restarted from those states, so the stream goes on exactly; after
:data:`MAX_RESTARTS` deaths of one worker the stream fails with a :class:`FeedlineError` naming it.
An error raised by a partition's pipeline (a bad spec, a missing file) is raised here as it was.
Workers exit when the parent dies, even by SIGKILL, and ignore Ctrl-C (the parent stops them).
"""

from __future__ import annotations

import multiprocessing
import queue
import threading
import weakref
from collections import deque
from typing import Any

from feedline._core.cores import usable_cores
from feedline._core.dataset import State
from feedline._partitions.placement import Make, Part, Placement
from feedline._partitions.worker import run_worker
from feedline._spec import ParallelSpec
from feedline.errors import FeedlineError, SpecError

__all__ = ["MAX_RESTARTS", "ProcessPlacement"]

#: Deaths of one worker process that are restarted before the stream fails.
MAX_RESTARTS = 3
_END = object()
_DEAD = "dead"


class _Worker:
    """One worker process, its pipe and the thread receiving from it."""

    def __init__(self, placement: ProcessPlacement, index: int, owned: list[int]) -> None:
        ctx = multiprocessing.get_context("spawn")
        self.owned = owned
        self.conn, child = ctx.Pipe(duplex=True)
        threads = max(1, usable_cores() // placement.workers)
        self.process = ctx.Process(target=run_worker, args=(child, placement.make, owned, placement.options.prefetch, threads),
                                   name=f"feedline-partitions-{index}", daemon=True)
        try:
            self.process.start()
        except Exception as e:  # pickling the spec (an iterable source, a lambda) or spawning
            self.conn.close()
            raise SpecError(f"parallel.placement: processes cannot start a worker ({type(e).__name__}: {str(e).strip()[:200]}); "
                            "a spec with Python objects in it (iterable sources, callables) runs with placement: threads, "
                            "and a script that starts a Loader at import time needs `if __name__ == '__main__':`") from e
        finally:
            child.close()
        self.inbox: queue.Queue[Any] = queue.Queue()
        self.lock = threading.Lock()
        self.receiver = threading.Thread(target=self._receive, name=f"feedline-partitions-recv-{index}", daemon=True)
        self.receiver.start()

    def _receive(self) -> None:
        try:
            while True:
                self.inbox.put(self.conn.recv())
        except (EOFError, OSError):
            self.inbox.put((_DEAD,))

    def send(self, msg: tuple[Any, ...]) -> None:
        with self.lock:
            try:
                self.conn.send(msg)
            except (OSError, ValueError):
                pass  # a dead worker: its receiver reports it

    def stop(self) -> None:
        self.send(("stop",))
        self.process.join(timeout=5)
        if self.process.is_alive():
            self.process.kill()
            self.process.join(timeout=5)
        self.conn.close()
        self.receiver.join(timeout=5)


def _kill_all(pool: list[_Worker | None]) -> None:
    for worker in pool:
        if worker is not None and worker.process.is_alive():
            worker.process.kill()


class ProcessPlacement(Placement):
    """Partitions in spawned worker processes (see the module docstring)."""

    def __init__(self, make: Make, k: int, options: ParallelSpec) -> None:
        super().__init__(make, k, options)
        self.workers = min(k, options.processes or usable_cores())
        self._pool: list[_Worker | None] = [None] * self.workers
        # A placement dropped without close() (a loader never closed) stops its workers when collected.
        weakref.finalize(self, _kill_all, self._pool)
        self._queues: list[deque[Any]] = [deque() for _ in range(k)]
        self._taken: list[State | None] = [None] * k   # each partition's state after the last batch handed out
        self._ended = [False] * k
        self._failed: list[BaseException | None] = [None] * k  # a partition's error, raised again when asked
        self._gen = 0
        self.restarts = [0] * self.workers

    def owner(self, p: int) -> int:
        return p % self.workers

    def _worker(self, w: int) -> _Worker:
        worker = self._pool[w]
        if worker is None:
            owned = list(range(w, self.k, self.workers))
            worker = self._pool[w] = _Worker(self, w, owned)
            worker.send(("start", self._gen, {p: self._taken[p] for p in owned if not self._ended[p]}))
        return worker

    def next(self, p: int) -> tuple[Part, State] | None:
        if self._ended[p]:
            return None
        failed = self._failed[p]
        if failed is not None:  # its worker stopped the partition: asking again must not wait forever
            raise failed
        for v in range(self.workers):  # all at once: they start (import, load the tokenizer) in parallel
            self._worker(v)
        w = self.owner(p)
        while not self._queues[p]:
            self._handle(w, self._worker(w).inbox.get())
        item = self._queues[p].popleft()
        if item is _END:
            self._ended[p] = True
            return None
        batch, state = item
        self._taken[p] = state
        self._worker(w).send(("credit", self._gen, p, 1))
        return batch, state

    def _handle(self, w: int, msg: tuple[Any, ...]) -> None:
        kind = msg[0]
        if kind == _DEAD:
            self._restart(w)
            return
        if msg[1] != self._gen:
            return  # from before the last restore
        p = msg[2]
        if kind == "batch":
            self._queues[p].append((msg[3], msg[4]))
        elif kind == "end":
            self._queues[p].append(_END)
        else:
            self._failed[p] = msg[3]
            raise msg[3]

    def _restart(self, w: int) -> None:
        worker = self._pool[w]
        assert worker is not None
        worker.process.join(timeout=5)
        code = worker.process.exitcode
        worker.stop()
        self._pool[w] = None
        self.restarts[w] += 1
        if self.restarts[w] > MAX_RESTARTS:
            raise FeedlineError(
                f"the worker process of partitions {worker.owned} died (exit code {code}) {self.restarts[w]} times; the "
                "stream stops. Workers are spawned and import the main module: a script that makes its Loader at import "
                "time needs `if __name__ == '__main__':`; a worker killed for memory needs a lower parallel.prefetch, "
                "smaller batches or fewer processes; parallel: threads runs the partitions in this process")
        for p in worker.owned:  # what it sent and was not taken is made again, from the states taken
            self._queues[p].clear()

    def set_states(self, states: list[State | None]) -> None:
        self._gen += 1
        self._taken = list(states)
        self._ended = [False] * self.k
        self._failed = [None] * self.k
        for q in self._queues:
            q.clear()
        for worker in self._pool:
            if worker is not None:
                worker.send(("start", self._gen, {p: states[p] for p in worker.owned}))

    def close(self) -> None:
        for w, worker in enumerate(self._pool):
            if worker is not None:
                self._pool[w] = None
                worker.stop()
        for q in self._queues:
            q.clear()

    def pids(self) -> list[int]:
        """The worker processes running now (for tests and monitoring)."""
        return [w.process.pid for w in self._pool if w is not None and w.process.pid is not None]

