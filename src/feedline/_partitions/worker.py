"""The body of a partition worker process (started by :class:`~feedline._partitions.processes.ProcessPlacement`).

The worker unpickles its factory (``make``, sent as bytes), warms it up (``make.warm()`` where it
has one: the tokenizer loaded), says it is ready, and then runs the streams (``make(p)``) of the
partitions it is told to start, each from a state and a number of batches to make again and drop
after it (a restart from the last state the parent holds). It makes a batch only for a partition
with credit (``prefetch`` at its start, one more per batch the parent takes or drops), so at most
``prefetch`` batches per partition are made ahead of the parent. A batch's state goes with it only
every ``every`` batches (1: every batch, where the consumer reads each state: the service); the
others are numbered, and the worker keeps their states (the last :data:`KEEP`) to send when
asked, which is rare (a checkpoint). Messages, all tuples over one duplex pipe (the parent's on
its ``Connection``, the worker's as frames with their arrays out of band: :mod:`.frames`):

    parent -> worker: ("start", gen, {p: (state or None, batches to drop)}, every) | ("credit", gen, p, n)
                      | ("state", gen, p, seq) | ("stop",)
    worker -> parent: ("ready",) | ("batch", gen, p, batch, state or None, seq) | ("end", gen, p, state at the end)
                      | ("error", gen, p, exception, its formatted traceback: :mod:`.remote`)
                      | ("alive",)
                      | ("state", gen, p, seq, the state after batch seq, or None: not kept)

``gen`` numbers the parent's starts of a partition (its stream's generation): anything of an
older one is dropped on arrival.

The pipelines run on the worker's main thread (:class:`_Serving`), which reads the parent's
messages between batches (without waiting while a partition has credit; waiting for one when
none has) and sends each batch as soon as it is made: the worker has no thread the same pipeline
in the parent's process would not have, besides two that sleep. A worker's partitions take turns,
a batch each (its process is one core's worth of work). From its first moment the worker says
``("alive",)`` every ``beat`` seconds on a thread of its own, so a worker that falls silent
(stopped, or hung with the interpreter held) is told from one whose pipeline is slow
(``parallel.hang_timeout``). The worker ignores SIGINT (the parent stops it: a Ctrl-C reaches
the whole process group), and exits at once when its parent dies (it watches the parent's
sentinel), so no worker outlives a killed parent.
"""

from __future__ import annotations

import os
import pickle
import signal
import threading
import time
from collections import deque
from collections.abc import Callable
from multiprocessing.connection import Connection, wait
from typing import Any

from feedline._core.deferred import materialize
from feedline._partitions.frames import FrameWriter
from feedline._partitions.remote import portable

__all__ = ["KEEP", "run_worker"]

#: States of unsent batches a worker keeps per partition for the parent to ask for (a consumer's
#: checkpoint reads the state of a batch at most its prefetch depths behind the newest sent).
KEEP = 64


def _watch_parent() -> None:
    import multiprocessing

    parent = multiprocessing.parent_process()
    if parent is None:
        return
    wait([parent.sentinel])
    os._exit(0)  # the parent is gone: nothing to deliver to, and nothing to clean up that the OS does not


def _beat(send: Callable[[Any], None], every: float) -> None:
    try:
        while True:
            time.sleep(every)
            send(("alive",))
    except (OSError, ValueError):
        return  # the pipe is closed: the worker is stopping


class _Stop(Exception):
    """The parent said stop, or closed the pipe."""


class _Serving:
    """The partitions ``owned`` of one worker, run on its main thread (see the module docstring)."""

    def __init__(self, conn: Connection, make: Callable[[int], Any], owned: list[int], prefetch: int,
                 send: Callable[[Any], None]) -> None:
        self.conn, self.make, self.prefetch, self.send = conn, make, prefetch, send
        self.running: dict[int, Any] = {}   # each started partition's iterator (its pipeline)
        self.turns = deque(owned)           # whose batch is made next, among those with credit
        self.credit = dict.fromkeys(owned, 0)
        self.gens = dict.fromkeys(owned, -1)   # each partition's start, as the parent numbered it
        self.drop = dict.fromkeys(owned, 0)    # batches still to make again and drop (a restart's replay)
        self.seqs = dict.fromkeys(owned, 0)    # the number of the partition's next batch sent
        self.every = 1
        self.kept: dict[int, deque[tuple[int, Any]]] = {p: deque(maxlen=KEEP) for p in owned}

    def serve(self) -> None:
        """Until told to stop: the parent's messages first, then a batch of the next partition with credit."""
        try:
            while True:
                p = self._next()
                if self.conn.poll(None if p is None else 0):   # (EOF too: recv raises it)
                    self._command(self.conn.recv())
                elif p is not None:
                    self._make(p)
        except (_Stop, EOFError, OSError):
            return   # (OSError: the pipe broke, the parent is gone)
        finally:
            for it in self.running.values():
                it.close()

    def _next(self) -> int | None:
        for _ in range(len(self.turns)):
            p = self.turns[0]
            self.turns.rotate(-1)
            if p in self.running and (self.credit[p] > 0 or self.drop[p]):
                return p
        return None

    def _command(self, msg: tuple[Any, ...]) -> None:
        if msg[0] == "stop":
            raise _Stop
        if msg[0] == "credit":
            if msg[1] == self.gens[msg[2]]:
                self.credit[msg[2]] += msg[3]
        elif msg[0] == "state":
            _, gen, p, seq = msg
            found = next((st for n, st in self.kept[p] if n == seq), None) if gen == self.gens[p] else None
            self.send(("state", gen, p, seq, found))
        elif msg[0] == "start":
            self.every = msg[3]
            for p, (state, skip) in msg[2].items():
                self._start(p, msg[1], state, skip)

    def _start(self, p: int, gen: int, state: Any, skip: int) -> None:
        self.gens[p], self.drop[p], self.seqs[p], self.credit[p] = gen, skip, 0, self.prefetch
        self.kept[p].clear()
        self._close(p)
        try:   # building the pipeline may fail (a missing file, a bad spec): the parent raises it
            it = self.running[p] = iter(self.make(p))
            if state is not None:
                it.set_state(state)
        except BaseException as e:   # SystemExit from user code too: reported, never a death
            self._close(p)
            self.send(("error", gen, p, *portable(e)))

    def _close(self, p: int) -> None:
        it = self.running.pop(p, None)
        if it is not None:
            it.close()

    def _make(self, p: int) -> None:
        """Partition ``p``'s next batch, sent (or dropped: a restart's replay), or its end, or its error."""
        it, gen = self.running[p], self.gens[p]
        snapshot = getattr(it, "snapshot", it.get_state)
        try:
            batch = next(it)
            state = snapshot()
        except StopIteration:
            try:
                end = materialize(snapshot())
            except Exception:   # the state is a courtesy here: the end is what matters
                end = None
            self._close(p)
            self.send(("end", gen, p, end))
            return
        except BaseException as e:   # SystemExit from user code too: reported, never a death
            self._close(p)
            self.send(("error", gen, p, *portable(e)))
            return
        if self.drop[p]:   # made again after a restart, up to the parent's last state
            self.drop[p] -= 1
            return
        seq = self.seqs[p]
        self.seqs[p] = seq + 1
        if seq % self.every:   # kept here until asked for (rarely), not pickled and sent
            self.kept[p].append((seq, state))
            state = None
        self.credit[p] -= 1
        self.send(("batch", gen, p, batch, state, seq))   # a snapshot: pickled as the state, in one pass


def run_worker(conn: Connection, make_bytes: bytes, owned: list[int], prefetch: int, threads: int,
               beat: float = 1.0) -> None:
    """Serve partitions ``owned`` over ``conn`` until told to stop or the parent goes away (see the module docstring)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    threading.Thread(target=_watch_parent, name="feedline-parent-watch", daemon=True).start()
    writer = FrameWriter(conn)   # batches with their arrays out of band (see frames.py)
    lock = threading.Lock()

    def send(msg: Any) -> None:
        with lock:   # the main thread's messages and the heartbeat's
            writer.send(msg)

    threading.Thread(target=_beat, args=(send, beat), name="feedline-worker-beat", daemon=True).start()
    if threads:
        os.environ["RAYON_NUM_THREADS"] = str(threads)  # the tokenizer's pool (tokenizers, sentencepiece): this worker's share of the cores
    make: Callable[[int], Any] = pickle.loads(make_bytes)
    warm = getattr(make, "warm", None)
    if warm is not None:
        try:
            warm()
        except Exception:  # the partition's own start reports it, as the parent's would
            pass
    try:
        send(("ready",))
        _Serving(conn, make, owned, prefetch, send).serve()
    except OSError:
        return  # the parent closed the pipe
    finally:
        with lock:
            writer.close()
