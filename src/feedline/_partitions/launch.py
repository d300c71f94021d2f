"""One partition worker process as the parent sees it: started in the background, and its pipe, read by the composing stage.

A :class:`WorkerProcess` starts its process on a thread of its own, so that starting ``N`` workers
never waits for one after another (a spawned child reads its arguments only once it has imported
what unpickling them needs, and the parent's ``start`` blocks until then). Its messages are read
by the composing thread itself when the pool's wait (:mod:`.waker`) says its pipe has one
(:meth:`WorkerProcess.take`): no thread and no queue between a worker's pipe and the composing
stage, so a batch costs this process one wake-up, not two. A thread asking for a state
(:meth:`WorkerProcess.ask`: a checkpoint, while the composing thread may be waiting for its
consumer) reads the pipe itself meanwhile, keeping what else comes for the composing stage.
``("dead",)`` is the last message when the worker's pipe closes (it died, or it was stopped).
Reading notes when the worker was last heard from (:attr:`WorkerProcess.heard`; its heartbeats,
``("alive",)``, go no further), which is how the placement tells a silent worker from a slow one
(a pipe is read before a silence is judged).

Workers start from the process's one fork server (:mod:`feedline._core.forkserver`), which
preloads the heavy third-party modules and, where it would import this very copy, the feedline
modules a worker runs (registered below); ``spawn`` where the platform has no fork server.
The factory travels pickled once, as bytes (:func:`pickled`), so a spec that cannot cross to a
process fails in the caller, with the fix, before anything starts.
"""

from __future__ import annotations

import logging
import multiprocessing
import pickle
import threading
import time
from collections import deque
from collections.abc import Callable
from multiprocessing.context import BaseContext
from typing import Any

from feedline._core.forkserver import context, preload_own
from feedline._partitions.frames import FrameReader
from feedline._partitions.waker import Readable
from feedline._partitions.worker import run_worker
from feedline.errors import FeedlineError, SpecError

__all__ = ["DEAD", "MAIN_GUARD", "WorkerProcess", "context", "importing_main", "pickled"]

DEAD = "dead"
ALIVE = "alive"
STATE = "state"
WARN = "warn"   # ("warn", text): the worker's warning, logged here
log = logging.getLogger("feedline")
#: A worker runs these; the fork server preloads them where it would import this copy of feedline.
preload_own("feedline._partitions.worker", "feedline._pipeline", "feedline._loader")

#: What a script that starts a processes Loader at import time must do.
MAIN_GUARD = ("worker processes import the script's main module: a script that makes and iterates its Loader at "
              "import time needs `if __name__ == '__main__':` around that code (or parallel: threads)")


def importing_main() -> bool:
    """Whether this process is a worker still importing its parent's main module
    (``multiprocessing``'s bootstrap: a Loader made at import time, without a main guard)."""
    return bool(getattr(multiprocessing.current_process(), "_inheriting", False))


def pickled(make: Any) -> bytes:
    """``make`` as the bytes a worker unpickles, or the :class:`SpecError` saying why it cannot go."""
    try:
        return pickle.dumps(make, protocol=pickle.HIGHEST_PROTOCOL)
    except Exception as e:  # an iterable source, a lambda, a local function
        raise SpecError(f"parallel.placement: processes cannot start a worker ({type(e).__name__}: {str(e).strip()[:200]}); "
                        "a spec with Python objects in it (iterable sources, callables) runs with placement: threads, "
                        "and a script that starts a Loader at import time needs `if __name__ == '__main__':`") from e


class WorkerProcess:
    """Worker ``index`` serving partitions ``owned``, started at once in the background; ``wake``
    is called when a thread other than the composing one read its messages (see :meth:`take`)."""

    def __init__(self, ctx: BaseContext, index: int, make: bytes, owned: list[int], prefetch: int, threads: int,
                 wake: Callable[[], None], beat: float = 1.0) -> None:
        if importing_main():  # a worker running the script's top level: stop here, not one level deeper
            raise FeedlineError(f"a feedline worker process was asked to start workers of its own: {MAIN_GUARD}")
        self.owned = owned
        self.ready = False  # set by the placement when the worker says it is ("ready",)
        self.heard = time.monotonic()   # when the worker last said anything (its start, before it did)
        self.spoke = False              # it said something (its heartbeat runs)
        self.named = 0.0                # the silence a warning named last (the placement's)
        self.conn, self.child = ctx.Pipe(duplex=True)
        self.reader = FrameReader(self.conn)   # what the worker sends (this end sends on the Connection)
        self.readable = Readable(self.conn)
        self.process = ctx.Process(target=run_worker, args=(self.child, make, owned, prefetch, threads, beat),  # type: ignore[attr-defined]
                                   name=f"feedline-partitions-{index}", daemon=True)
        self.lock = threading.Lock()      # sending
        self.reading = threading.Lock()   # reading: the composing thread, or one asking for a state
        self.read: deque[tuple[Any, ...]] = deque()   # read by an asking thread, for the composing one
        self.gone = False                 # its pipe closed, or it failed to start: (DEAD,) is its last message
        self.drained = False              # the last message's read took all the pipe had (see take)
        self.wake = wake
        self.started = threading.Event()  # start() returned (or failed)
        self.up = False                   # (the same, read at every message: no call)
        self.asked: dict[tuple[int, int, int], list[Any]] = {}   # states asked for: (gen, p, seq) -> [Event, state]
        threading.Thread(target=self._start, name=f"feedline-partitions-start-{index}", daemon=True).start()

    def _start(self) -> None:
        try:
            self.process.start()
        except BaseException:   # counted as a death (the placement says why)
            self.gone = True
            self.read.append((DEAD,))
        finally:
            self.child.close()
            self.up = True
            self.started.set()
            self.wake()

    def take(self) -> tuple[Any, ...] | None:
        """The worker's next message, if one is on its pipe (``("dead",)`` once its pipe closed); never
        waits for one (heartbeats are noted, :attr:`heard`, and states asked for answered on the way).
        Right after a message whose read took all the pipe had, the next ``take`` says ``None`` without
        looking (the pool's wait hears what comes later)."""
        if self.read:
            return self.read.popleft()
        if self.drained:
            self.drained = False
            return None
        if self.gone or not self.up:
            return None
        with self.reading:
            if self.read:   # (an asking thread read it meanwhile: in order)
                return self.read.popleft()
            return self._read(keep=False)

    def _read(self, keep: bool, timeout: float = 0.0) -> tuple[Any, ...] | None:
        """Read what is on the pipe (within ``timeout``), holding :attr:`reading`: the first message for
        the composing stage is returned, or, with ``keep``, every one is queued for it in :attr:`read`."""
        while not self.gone:
            try:   # EOF/OSError: the worker is gone (died, or was stopped)
                if keep:
                    if not self.reader.buffered() and not self.readable(timeout):
                        return None
                    msg = self.reader.recv()
                else:
                    msg = self.reader.recv_ready()
                    if msg is None:
                        return None
            except BaseException:
                self.gone, msg = True, (DEAD,)
                self.answer(None)   # nobody waits for an answer from a worker that is gone
            else:
                timeout = 0.0
                self.heard, self.spoke = time.monotonic(), True
                if msg[0] == STATE:
                    self.answer(msg)
                    continue
                if msg[0] == ALIVE:
                    continue
                if msg[0] == WARN:
                    log.warning("the worker process of partitions %s (pid %s): %s", self.owned, self.pid, msg[1])
                    continue
            if not keep:
                self.drained = self.reader.drained and not self.reader.buffered()
                return msg  # type: ignore[no-any-return]
            self.read.append(msg)
            self.wake()
        return None

    def listen(self) -> None:
        """Read what is on the pipe now (never waits), keeping its messages for the composing stage:
        its heartbeats are noted (:attr:`heard`) before anyone judges its silence."""
        if self.gone or not self.started.is_set() or not self.reading.acquire(timeout=0.05):
            return
        try:
            self._read(keep=True)
        finally:
            self.reading.release()

    def ask(self, key: tuple[int, int, int], wait: float) -> Any:
        """The state after batch ``seq`` of partition ``p``'s start ``gen`` (``key``), asked of the
        worker from any thread (which reads the pipe itself while the composing thread does not, keeping
        what else comes for it); ``None`` when it no longer keeps it, is gone, or says nothing for
        ``wait`` seconds."""
        box: list[Any] = [threading.Event(), None]
        self.asked[key] = box
        self.send((STATE, *key))
        deadline = time.monotonic() + wait
        while not box[0].is_set() and not self.gone and time.monotonic() < deadline:
            if self.started.is_set() and self.reading.acquire(timeout=0.05):
                try:
                    self._read(keep=True, timeout=0.05)
                finally:
                    self.reading.release()
            else:
                box[0].wait(0.05)
        self.asked.pop(key, None)
        return box[1]

    def answer(self, msg: tuple[Any, ...] | None) -> None:
        """The worker's answer to :meth:`ask` (``None``: every question, unanswered: it is gone)."""
        for key in [tuple(msg[1:4])] if msg is not None else list(self.asked):
            box = self.asked.get(key)  # type: ignore[arg-type]
            if box is not None:
                box[1] = msg[4] if msg is not None else None
                box[0].set()

    @property
    def exitcode(self) -> int | None:
        return self.process.exitcode if self.process.pid is not None else None

    @property
    def pid(self) -> int | None:
        return self.process.pid

    def send(self, msg: tuple[Any, ...]) -> None:
        """Put ``msg`` on the worker's pipe (pickled plainly: ``Connection.send``'s pickler copies its
        reducer table at every call, 1.9 us against 0.3 for a credit's wake; no message here needs its reducers)."""
        data = pickle.dumps(msg, protocol=pickle.HIGHEST_PROTOCOL)
        with self.lock:
            try:
                self.conn.send_bytes(data)
            except (OSError, ValueError):
                pass  # a dead worker: its pipe says so when read

    def kill(self) -> None:
        if self.process.pid is not None and self.process.is_alive():
            self.process.kill()

    def stop(self) -> None:
        """Ask the worker to stop, then kill it if it does not within 5 s; close the pipe.

        The pipe is shut as soon as the stop is on it: a worker blocked sending a batch this process
        will no longer read (arrays through the pipe where its ring was full) fails that send and
        stops at once, rather than at the kill."""
        self.send(("stop",))
        self.started.wait(timeout=60)  # it may still be starting
        self.reader.close()   # (the stop already on the pipe is read before its end)
        if self.process.pid is not None:
            self.process.join(timeout=5)
            if self.process.is_alive():
                self.process.kill()
                self.process.join(timeout=5)
        self.gone = True
        self.reader.close()   # a thread reading leaves recv() with EOFError
        self.conn.close()
