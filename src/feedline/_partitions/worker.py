"""The body of a partition worker process (spawned by :class:`~feedline._partitions.processes.ProcessPlacement`).

The worker owns some partitions and runs each one's stream (``make(p)``), sending every batch with
the state after it, as far ahead as the parent's credit allows (``prefetch`` per partition, one
more per batch the parent takes). Messages, all tuples over one duplex pipe:

    parent -> worker: ("start", gen, {p: state or None}) | ("credit", gen, p, n) | ("stop",)
    worker -> parent: ("batch", gen, p, batch, state) | ("end", gen, p) | ("error", gen, p, exception)

``gen`` numbers the parent's restores: anything of an older one is dropped on arrival. The worker
ignores SIGINT (the parent stops it: a Ctrl-C reaches the whole process group), and exits at once
when its parent dies (it watches the parent's sentinel), so no worker outlives a killed parent.
"""

from __future__ import annotations

import os
import pickle
import signal
import threading
from collections.abc import Callable
from multiprocessing.connection import Connection, wait
from typing import Any

__all__ = ["run_worker"]


def _watch_parent() -> None:
    import multiprocessing

    parent = multiprocessing.parent_process()
    if parent is None:
        return
    wait([parent.sentinel])
    os._exit(0)  # the parent is gone: nothing to deliver to, and nothing to clean up that the OS does not


def _portable(error: BaseException) -> BaseException:
    """The error itself when it survives pickling, else a FeedlineError with its text."""
    try:
        pickle.loads(pickle.dumps(error))
        return error
    except Exception:
        from feedline.errors import FeedlineError

        return FeedlineError(f"{type(error).__name__}: {error}")


def run_worker(conn: Connection, make: Callable[[int], Any], owned: list[int], prefetch: int, threads: int) -> None:
    """Serve partitions ``owned`` over ``conn`` until told to stop or the parent goes away."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    threading.Thread(target=_watch_parent, name="feedline-parent-watch", daemon=True).start()
    if threads:
        os.environ["RAYON_NUM_THREADS"] = str(threads)  # the tokenizer's pool (tokenizers, sentencepiece): this worker's share of the cores
    its: dict[int, Any] = {}
    credit = dict.fromkeys(owned, 0)
    ended: set[int] = set()
    gen = 0
    try:
        while True:
            live = [p for p in owned if credit[p] > 0 and p not in ended and p in its]
            if not live or conn.poll():
                msg = conn.recv()
                if msg[0] == "stop":
                    return
                if msg[0] == "credit":
                    if msg[1] == gen:
                        credit[msg[2]] += msg[3]
                    continue
                _, gen, states = msg  # "start"
                for p, state in states.items():
                    old = its.pop(p, None)
                    if old is not None:
                        old.close()
                    credit[p] = prefetch
                    ended.discard(p)
                    try:
                        it = iter(make(p))
                        if state is not None:
                            it.set_state(state)
                        its[p] = it
                    except Exception as e:
                        conn.send(("error", gen, p, _portable(e)))
                        ended.add(p)
                continue
            for p in live:
                it = its[p]
                try:
                    batch = next(it)
                    state = it.get_state()
                except StopIteration:
                    conn.send(("end", gen, p))
                    ended.add(p)
                    continue
                except Exception as e:
                    conn.send(("error", gen, p, _portable(e)))
                    ended.add(p)
                    continue
                conn.send(("batch", gen, p, batch, state))
                credit[p] -= 1
    except (EOFError, OSError, BrokenPipeError):
        return  # the parent closed the pipe
    finally:
        for it in its.values():
            it.close()
