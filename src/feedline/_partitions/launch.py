"""One partition worker process as the parent sees it: started in the background, its pipe, the stage receiving its messages.

A :class:`WorkerProcess` starts its process on a thread of its own, so that starting ``N`` workers
never waits for one after another (a spawned child reads its arguments only once it has imported
what unpickling them needs, and the parent's ``start`` blocks until then), and the same thread
then receives the worker's messages: it is a :class:`~feedline._core.prefetch.Prefetch` stage over
them (the package's one thread-and-queue stage), whose ``wake`` tells the pool that a worker spoke
(:meth:`WorkerProcess.take` never waits); ``("dead",)`` is the last message when the worker's pipe
closes (it died, or it was stopped). The thread notes when the worker was last heard from
(:attr:`WorkerProcess.heard`; its heartbeats, ``("alive",)``, go no further), which is how the
placement tells a silent worker from a slow one.

Workers start from the process's one fork server (:mod:`feedline._core.forkserver`), which
preloads the heavy third-party modules and, where it would import this very copy, the feedline
modules a worker runs (registered below); ``spawn`` where the platform has no fork server.
The factory travels pickled once, as bytes (:func:`pickled`), so a spec that cannot cross to a
process fails in the caller, with the fix, before anything starts.
"""

from __future__ import annotations

import multiprocessing
import pickle
import threading
import time
from collections.abc import Callable
from multiprocessing.context import BaseContext
from typing import Any

from feedline._core.forkserver import context, preload_own
from feedline._core.prefetch import Prefetch
from feedline._partitions.frames import FrameReader
from feedline._partitions.worker import run_worker
from feedline.errors import FeedlineError, SpecError

__all__ = ["DEAD", "MAIN_GUARD", "WorkerProcess", "context", "importing_main", "pickled"]

DEAD = "dead"
ALIVE = "alive"
STATE = "state"
#: Messages of one worker received and not yet taken, at most (its batches are fewer: credit bounds them).
RECEIVED = 1024
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


class _Messages:
    """A worker's messages, as its receiving stage reads them: the process is started at the first
    read, and heartbeats are noted (:attr:`WorkerProcess.heard`) and skipped."""

    def __init__(self, worker: WorkerProcess) -> None:
        self.worker = worker

    def __iter__(self) -> _Messages:
        return self

    def __next__(self) -> tuple[Any, ...]:
        w = self.worker
        if not w.started.is_set():
            try:
                w.process.start()
            finally:
                w.child.close()
                w.started.set()
        try:
            while True:
                msg = w.reader.recv()   # EOF/OSError: raised to the pool, which counts the worker dead
                w.heard, w.spoke = time.monotonic(), True
                if msg[0] == STATE:
                    w.answer(msg)
                elif msg[0] != ALIVE:
                    return msg  # type: ignore[no-any-return]
        except BaseException:
            w.answer(None)   # nobody waits for an answer from a worker that is gone
            raise

    def get_state(self) -> dict[str, Any]:
        return {}   # (a stream of messages is not resumed)

    def close(self) -> None:
        self.worker.reader.close()


class WorkerProcess:
    """Worker ``index`` serving partitions ``owned``, started at once in the background; ``wake``
    is called when it has said something into an empty queue (see :meth:`take`)."""

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
        self.process = ctx.Process(target=run_worker, args=(self.child, make, owned, prefetch, threads, beat),  # type: ignore[attr-defined]
                                   name=f"feedline-partitions-{index}", daemon=True)
        self.lock = threading.Lock()
        self.started = threading.Event()  # start() returned (or failed)
        self.asked: dict[tuple[int, int, int], list[Any]] = {}   # states asked for: (gen, p, seq) -> [Event, state]
        self.messages = Prefetch(_Messages(self), RECEIVED, wake=wake, name=f"feedline-partitions-recv-{index}")
        self.messages.start()

    def ask(self, key: tuple[int, int, int], wait: float) -> Any:
        """The state after batch ``seq`` of partition ``p``'s start ``gen`` (``key``), asked of the
        worker (its answer is taken off the pipe by the receiving stage, so any thread may ask);
        ``None`` when it no longer keeps it, is gone, or says nothing for ``wait`` seconds."""
        box: list[Any] = [threading.Event(), None]
        self.asked[key] = box
        self.send((STATE, *key))
        deadline = time.monotonic() + wait
        while not box[0].wait(0.2):
            if not self.messages.running or time.monotonic() > deadline:
                break
        self.asked.pop(key, None)
        return box[1]

    def answer(self, msg: tuple[Any, ...] | None) -> None:
        """The worker's answer to :meth:`ask` (``None``: every question, unanswered: it is gone)."""
        for key in [tuple(msg[1:4])] if msg is not None else list(self.asked):
            box = self.asked.get(key)  # type: ignore[arg-type]
            if box is not None:
                box[1] = msg[4] if msg is not None else None
                box[0].set()

    def take(self) -> tuple[Any, ...] | None:
        """The worker's next message, if one came (``("dead",)`` once its pipe closed); never waits."""
        try:
            got = self.messages.poll()
        except BaseException:  # EOF/OSError: the worker is gone (or never started: counted as a death)
            return (DEAD,)
        return None if got is None else got[0]  # type: ignore[no-any-return]

    @property
    def exitcode(self) -> int | None:
        return self.process.exitcode if self.process.pid is not None else None

    @property
    def pid(self) -> int | None:
        return self.process.pid

    def send(self, msg: tuple[Any, ...]) -> None:
        with self.lock:
            try:
                self.conn.send(msg)
            except (OSError, ValueError):
                pass  # a dead worker: its receiver reports it

    def kill(self) -> None:
        if self.process.pid is not None and self.process.is_alive():
            self.process.kill()

    def stop(self) -> None:
        """Ask the worker to stop, then kill it if it does not within 5 s; close the pipe."""
        self.send(("stop",))
        self.started.wait(timeout=60)  # it may still be starting
        if self.process.pid is not None:
            self.process.join(timeout=5)
            if self.process.is_alive():
                self.process.kill()
                self.process.join(timeout=5)
        self.conn.close()
        self.reader.close()   # its receiving thread leaves recv() with EOFError
        self.messages.close()
