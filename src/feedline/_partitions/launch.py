"""One partition worker process as the parent sees it: started in the background, its pipe, the inbox it feeds.

A :class:`WorkerProcess` starts its process on a thread of its own, so that starting ``N`` workers
never waits for one after another (a spawned child reads its arguments only once it has imported
what unpickling them needs, and the parent's ``start`` blocks until then), and the same thread
then receives the worker's messages into ``inbox`` (one queue for all the workers of a placement,
each message as ``(worker, message)``, so the parent waits on one queue whichever worker speaks
next); ``("dead",)`` is the last message when the worker's pipe closes (it died, or it was stopped).
The thread notes when the worker was last heard from (:attr:`WorkerProcess.heard`; its heartbeats,
``("alive",)``, go no further), which is how the placement tells a silent worker from a slow one.

Workers are started with ``forkserver`` where the platform has it, with the heavy third-party
modules preloaded (:data:`PRELOAD`: a fork of a server that already imported numpy, pyarrow and
the tokenizers saves most of a fresh interpreter's imports), and ``spawn`` elsewhere. Neither
forks the parent, which holds threads and Rayon pools: the fork server is a fresh single-threaded
process. feedline itself is not preloaded: the fork server imports its preloads with the
interpreter's default ``sys.path``, not the parent's (CPython 3.10-3.13), so a parent running a
checkout put on ``sys.path`` by a script, beside an installed feedline, would get workers running
the installed one; a worker imports feedline after the fork, from the parent's path.
The factory travels pickled once, as bytes (:func:`pickled`), so a spec that cannot cross to a
process fails in the caller, with the fix, before anything starts.
"""

from __future__ import annotations

import multiprocessing
import pickle
import queue
import sys
import threading
import time
from multiprocessing.context import BaseContext
from typing import Any

from feedline._partitions.frames import FrameReader
from feedline._partitions.worker import run_worker
from feedline.errors import FeedlineError, SpecError

__all__ = ["DEAD", "MAIN_GUARD", "PRELOAD", "WorkerProcess", "context", "importing_main", "pickled"]

DEAD = "dead"
ALIVE = "alive"
#: Modules the fork server imports before it forks workers, those of them this process has imported.
PRELOAD = ("numpy", "pyarrow", "pyarrow.parquet", "tokenizers", "fastokens", "zstandard", "orjson", "msgpack",
           "yaml", "sentencepiece")


#: What a script that starts a processes Loader at import time must do.
MAIN_GUARD = ("worker processes import the script's main module: a script that makes and iterates its Loader at "
              "import time needs `if __name__ == '__main__':` around that code (or parallel: threads)")


def importing_main() -> bool:
    """Whether this process is a worker still importing its parent's main module
    (``multiprocessing``'s bootstrap: a Loader made at import time, without a main guard)."""
    return bool(getattr(multiprocessing.current_process(), "_inheriting", False))


def context() -> BaseContext:
    """``forkserver`` (preloading :data:`PRELOAD`) where the platform has it, else ``spawn``."""
    if "forkserver" in multiprocessing.get_all_start_methods():
        ctx = multiprocessing.get_context("forkserver")
        # heeded when the server starts (the first worker of this process); never feedline: see the module docstring
        ctx.set_forkserver_preload([m for m in PRELOAD if m in sys.modules])
        return ctx
    return multiprocessing.get_context("spawn")


def pickled(make: Any) -> bytes:
    """``make`` as the bytes a worker unpickles, or the :class:`SpecError` saying why it cannot go."""
    try:
        return pickle.dumps(make, protocol=pickle.HIGHEST_PROTOCOL)
    except Exception as e:  # an iterable source, a lambda, a local function
        raise SpecError(f"parallel.placement: processes cannot start a worker ({type(e).__name__}: {str(e).strip()[:200]}); "
                        "a spec with Python objects in it (iterable sources, callables) runs with placement: threads, "
                        "and a script that starts a Loader at import time needs `if __name__ == '__main__':`") from e


class WorkerProcess:
    """Worker ``index`` serving partitions ``owned``, started at once in the background."""

    def __init__(self, ctx: BaseContext, index: int, make: bytes, owned: list[int], prefetch: int, threads: int,
                 inbox: queue.Queue[tuple[WorkerProcess, Any]], beat: float = 1.0) -> None:
        if importing_main():  # a worker running the script's top level: stop here, not one level deeper
            raise FeedlineError(f"a feedline worker process was asked to start workers of its own: {MAIN_GUARD}")
        self.owned = owned
        self.ready = False  # set by the placement when the worker says it is ("ready",)
        self.heard = time.monotonic()   # when the worker last said anything (its start, before it did)
        self.spoke = False              # it said something (its heartbeat runs)
        self.named = 0.0                # the silence a warning named last (the placement's)
        self.conn, child = ctx.Pipe(duplex=True)
        self.reader = FrameReader(self.conn)   # what the worker sends (this end sends on the Connection)
        self.process = ctx.Process(target=run_worker, args=(child, make, owned, prefetch, threads, beat),  # type: ignore[attr-defined]
                                   name=f"feedline-partitions-{index}", daemon=True)
        self.inbox = inbox
        self.lock = threading.Lock()
        self._child = child
        self.started = threading.Event()  # start() returned (or failed)
        self.receiver = threading.Thread(target=self._run, name=f"feedline-partitions-recv-{index}", daemon=True)
        self.receiver.start()

    def _run(self) -> None:
        try:
            try:
                self.process.start()
            finally:
                self._child.close()
                self.started.set()
            while True:
                msg = self.reader.recv()
                self.heard, self.spoke = time.monotonic(), True
                if msg[0] != ALIVE:
                    self.inbox.put((self, msg))
        except Exception:  # EOF/OSError: the worker is gone (or never started: counted as a death)
            self.inbox.put((self, (DEAD,)))
        finally:
            self.reader.close()

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
        self.reader.close()
        self.receiver.join(timeout=5)
