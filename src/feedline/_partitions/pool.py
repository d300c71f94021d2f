"""A placement's worker processes: started when first asked for, their messages taken in turn, silent ones named.

Worker ``w`` of ``N`` serves partitions ``w, w + N, ...`` (:class:`~feedline._partitions.launch.WorkerProcess`:
its process started in the background, its pipe). :meth:`WorkerPool.wait` waits on every worker's
pipe at once (a :class:`~feedline._partitions.waker.Waker`, which a warm start's threads here wake
too) and hands the placement the next message of a worker in the pool, read on the caller's thread
(taken from the workers that have one, in turn; a worker stopped since is no longer asked), and while it waits it watches the workers' heartbeats: a
worker silent for a quarter of ``parallel.hang_timeout`` (at most 30 s) is named in a warning with
its partitions and pid, and one silent for all of it is killed, so its pipe closes and the placement
restarts it like one that died. Workers exit with the pool (:meth:`WorkerPool.close`), and with a
pool dropped unclosed when it is collected. A wait for one partition's batch that hears nothing for
as long is named as well (the worker lives, its pipeline is slow or stuck: it is not killed).
"""

from __future__ import annotations

import functools
import logging
import time
import weakref
from collections import deque
from collections.abc import Iterator
from typing import Any

from feedline._core import notices
from feedline._core.cores import usable_cores
from feedline._partitions.launch import MAIN_GUARD, WorkerProcess, context
from feedline._partitions.waker import Waker
from feedline._spec import ParallelSpec
from feedline.errors import FeedlineError

__all__ = ["WorkerPool"]

log = logging.getLogger("feedline")


def _kill_all(procs: list[WorkerProcess | None]) -> None:
    for worker in procs:
        if worker is not None:
            worker.kill()


class WorkerPool:
    """``size`` worker processes for ``k`` partitions (see the module docstring)."""

    def __init__(self, k: int, size: int, options: ParallelSpec) -> None:
        self.k, self.size, self.options = k, size, options
        self.procs: list[WorkerProcess | None] = [None] * size
        weakref.finalize(self, _kill_all, self.procs)  # a pool dropped without close() stops its workers
        self.make_bytes: bytes | None = None   # the pickled factory every worker runs (set before the first get)
        self.restarts = [0] * size
        self.waker = Waker()   # every worker's pipe, and a wake (a warm start's thread queued a batch)
        # the workers whose pipes had something to read, in turn (one asked until it has nothing left):
        # a step asks only those, not every worker (the composer's cost per step does not grow with K)
        self._spoke: deque[int] = deque()
        self._watched = time.monotonic()   # when watch() last ran
        self._noted = False   # a notice was ever posted (until then a message has none to clear)
        self.beat = min(1.0, options.hang_timeout / 8)   # the workers' heartbeat, and how often silence is checked

    def owner(self, p: int) -> int:
        return p % self.size

    def get(self, w: int) -> WorkerProcess:
        """Worker ``w``, started now if it is not running."""
        worker = self.procs[w]
        if worker is None:
            assert self.make_bytes is not None
            owned = list(range(w, self.k, self.size))
            threads = max(1, usable_cores() // self.size)
            worker = self.procs[w] = WorkerProcess(context(), w, self.make_bytes, owned, self.options.prefetch,
                                                   threads, functools.partial(self._woke, w), self.beat)
            self.waker.add(worker.conn, w)
        return worker

    def wait(self, p: int | None = None) -> tuple[int, tuple[Any, ...]]:
        """The next message of a worker in the pool, as ``(w, message)`` (waits, watching for silent
        workers; waiting for partition ``p``'s batch, a quarter of ``hang_timeout`` without any message
        is named too, once per wait: its worker lives, but its pipeline is slow or stuck)."""
        since, named = 0.0, False
        while True:
            got = self._take()
            if got is None:
                since = since or time.monotonic()
                self._wait(self.beat)
                if not self._due():
                    continue
                waited = time.monotonic() - since
                if p is not None and not named and waited >= min(self.options.hang_timeout / 4, 30.0):
                    named, live = True, self.procs[self.owner(p)]
                    note = (f"waited {waited:.0f} s for a batch of partition {p} from its worker process (pid "
                            f"{live.pid if live is not None else '-'}), which is alive but sent none: its pipeline is "
                            "slow or stuck (a transform that never returns?)")
                    self._noted = True
                    notices.post((id(self), "wait", p), note)
                    log.warning("%s", note)
                continue
            w, msg = got
            if self._noted:
                notices.clear((id(self), w))
                if p is not None:
                    notices.clear((id(self), "wait", p))
            return w, msg

    def idle(self) -> None:
        """Wait until a worker's pipe has something to read or :attr:`wake` was called (a warm start's
        thread queued a batch), at most a heartbeat, watching for silent workers (the caller looks at
        everything after this; a wake meanwhile ends the next wait, so nothing is missed)."""
        self._wait(self.beat)
        self._due()

    def _due(self) -> bool:
        """:meth:`watch`, where a heartbeat passed since it last ran (the live workers' heartbeats are
        read and never end a wait: a stopped worker is told among busy ones)."""
        now = time.monotonic()
        if now - self._watched < self.beat:
            return False
        self._watched = now
        self.watch()
        return True

    def _wait(self, timeout: float) -> bool:
        """Wait for a pipe or a wake (``False``: ``timeout`` passed); the workers with something to read join the turn."""
        ready = self.waker.wait(timeout)
        if ready is None:
            return False
        self._spoke.extend(ready)  # type: ignore[arg-type]
        return True

    def wake(self) -> None:
        """End the composing thread's wait (a warm start's thread queued a batch; any thread)."""
        self.waker.wake()

    def _woke(self, w: int) -> None:
        """Worker ``w``'s messages were read by another thread (asking for a state), or it failed to start."""
        self._spoke.append(w)
        self.wake()

    def _take(self) -> tuple[int, tuple[Any, ...]] | None:
        """A message already received from a worker in the pool, from those that spoke, in turn
        (never waits). A worker leaves the turn only once its queue is empty; a message queued
        after that puts it back (its stage wakes the pool again), so none is missed."""
        while self._spoke:
            w = self._spoke[0]
            worker = self.procs[w]
            msg = worker.take() if worker is not None else None
            if msg is not None:
                return w, msg
            self._spoke.popleft()
        return None

    def pending(self) -> Iterator[tuple[int, tuple[Any, ...]]]:
        """The messages already on the workers' pipes, as :meth:`wait` gives them (never waits)."""
        self._wait(0)
        while (got := self._take()) is not None:
            yield got

    def watch(self) -> None:
        """Name a worker silent for a quarter of ``hang_timeout`` (at most 30 s); kill one silent for
        all of it (restarted when its pipe closes). Before its first word a worker may take 4 times
        as long (plus a minute; named after a quarter of that, at most 30 s): its start on a busy machine."""
        timeout, now = self.options.hang_timeout, time.monotonic()
        for worker in self.procs:
            if worker is None or worker.pid is None or worker.named < 0:
                continue
            limit = timeout if worker.spoke else 4 * timeout + 60
            if now - worker.heard >= min(limit / 4, 30.0):
                worker.listen()   # what waits on its pipe first: a caller away for a while has not read its heartbeats
            silent = now - worker.heard
            if silent >= min(limit / 4, 30.0) and worker.named != worker.heard:
                worker.named = worker.heard
                note = (f"the worker process of partitions {worker.owned} (pid {worker.pid}) has said nothing for "
                        f"{silent:.0f} s (stopped, or hung); it is killed and restarted from their states after "
                        f"{limit:.0f} s of silence (parallel.hang_timeout)")
                self._noted = True
                notices.post((id(self), self.owner(worker.owned[0])), note)
                log.warning("%s", note)
            if silent >= limit:
                worker.named = -1.0   # killed: once
                note = (f"killed the worker process of partitions {worker.owned} (pid {worker.pid}), silent for "
                        f"{silent:.0f} s; restarting it from their states")
                self._noted = True
                notices.post((id(self), self.owner(worker.owned[0])), note)
                log.warning("%s", note)
                worker.kill()

    def died(self, w: int, most: int) -> WorkerProcess:
        """Take worker ``w``, whose pipe closed, out of the pool (to be restarted) and count it.

        Raises:
            FeedlineError: it failed before its first word (its start: the same each time), or it
                died more than ``most`` times.
        """
        worker = self.procs[w]
        assert worker is not None
        self.waker.discard(w)
        worker.stop()
        self.procs[w] = None
        code = worker.exitcode
        if not worker.ready and code is not None and code > 0:  # an error before its first word, not a kill:
            raise FeedlineError(f"the worker process of partitions {worker.owned} failed to start (exit code {code}; "
                                f"its traceback is on stderr above). Usually: {MAIN_GUARD}")  # the same each time
        self.restarts[w] += 1
        if self.restarts[w] > most:
            raise FeedlineError(
                f"the worker process of partitions {worker.owned} died (exit code {code}) {self.restarts[w]} times; the "
                "stream stops. Workers import the main module: a script that makes its Loader at import "
                "time needs `if __name__ == '__main__':`; a worker killed for memory needs a lower parallel.prefetch, "
                "smaller batches or fewer processes; one killed for silence (logged) a longer parallel.hang_timeout; "
                "parallel: threads runs the partitions in this process")
        return worker

    def close(self) -> None:
        """Stop every worker: all told first, so they stop together; the wait's socket pair is
        closed (a pool used again waits on a new one)."""
        running = [w for w in self.procs if w is not None]
        self.procs[:] = [None] * self.size
        notices.clear_owner(id(self))
        for worker in running:
            worker.send(("stop",))
        for worker in running:
            worker.stop()
        self.waker.close()
        self.waker = Waker()

    def pids(self) -> list[int]:
        """The worker processes running now."""
        return [w.pid for w in self.procs if w is not None and w.pid is not None]
