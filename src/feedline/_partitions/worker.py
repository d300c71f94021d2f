"""The body of a partition worker process (started by :class:`~feedline._partitions.processes.ProcessPlacement`).

The worker unpickles its factory (``make``, sent as bytes), warms it up (``make.warm()`` where it
has one: the tokenizer loaded), says it is ready, and then runs the streams (``make(p)``) of the
partitions it is told to start, each from a state and a number of batches to make again and drop
after it (a restart from the last state the parent holds), sending every batch as far ahead as the
parent's credit allows (``prefetch`` per partition, one more per batch the parent takes or drops).
It makes them itself, on its main thread, a batch of each partition in turn (the order the parent
takes them): credit bounds what is made ahead, so no thread or queue is needed between a partition
and the pipe, and no two partitions of a worker contend for its interpreter.
The parent counts the batches it takes in the worker's ring (:mod:`.ring`: no message per credit);
a worker out of credit for a partition writes there the count to be woken at (``prefetch // 2``
more), and the parent's take that reaches it sends a wake (``("credit", gen, p, 0)``). Without a
ring, credit comes by message.
A batch's state goes with it only every ``every`` batches (1: every batch, where the consumer reads
each state: the service); the others are numbered, and the worker keeps their states (the last
:data:`KEEP`) to send when asked, which is rare (a checkpoint). Messages, all tuples over one duplex
pipe (the parent's on its ``Connection``, the worker's as frames with their arrays out of band:
:mod:`.frames`):

    parent -> worker: ("start", gen, {p: (state or None, batches to drop)}, every) | ("credit", gen, p, n: 0 wakes)
                      | ("state", gen, p, seq) | ("stop",)
    worker -> parent: ("ready",) | ("batch", gen, p, batch, state or None, seq) | ("end", gen, p, state at the end)
                      | ("error", gen, p, exception, its formatted traceback: :mod:`.remote`)
                      | ("many", [several of the three before, in order]) | ("alive",) | ("warn", text: logged)
                      | ("state", gen, p, seq, the state after batch seq, or None: not kept)

``gen`` numbers the parent's starts of a partition (its stream's generation): anything of an
older one is dropped on arrival. From its
first moment the worker says ``("alive",)`` every ``beat`` seconds on a thread of its own, so a
worker that falls silent (stopped, or hung with the interpreter held) is told from one whose
pipeline is slow (``parallel.hang_timeout``). The worker
ignores SIGINT (the parent stops it: a Ctrl-C reaches the whole process group), and exits at once
when its parent dies (it watches the parent's sentinel), so no worker outlives a killed parent.

The process is the worker's own, so its cyclic garbage collector is tuned for a pipeline: what
lives once a partition has made its first batch (the modules, the tokenizer, the pipelines) is
frozen out of the collector's passes, and the young generation is collected every
:data:`GC_YOUNG` allocations, not 700. A pipeline of short records makes many small containers a
batch, nearly all freed by their counts; with the defaults its thread spent ~12 % in the collector
(~150 us a batch, half of it full passes over ~40,000 objects), ~40-55 us with these
(``bench/gc_cost.py``). Once a
pipeline is closed (a restart, an end), the next freeze collects first: frozen, its cycles never
would be.
"""

from __future__ import annotations

import functools
import gc
import os
import pickle
import signal
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from multiprocessing.connection import Connection, wait
from typing import Any

from feedline._core.deferred import materialize
from feedline._core.inline import Inline
from feedline._core.memory import providing
from feedline._partitions.blocks import MAX_BLOCKS
from feedline._partitions.frames import FrameWriter
from feedline._partitions.remote import portable
from feedline._partitions.ring import SLOTS
from feedline._partitions.waker import HAS_POLL, Readable

__all__ = ["KEEP", "refill_of", "run_worker"]

#: States of unsent batches a worker keeps per partition for the parent to ask for (a consumer's
#: checkpoint reads the state of a batch at most its prefetch depths behind the newest sent).
KEEP = 64
#: Allocations between collections of the young generation in a worker (CPython's default: 700).
GC_YOUNG = 10_000


def refill_of(prefetch: int) -> int:
    """The credit a partition's worker waits for once it has none (half its ``prefetch``, at least one:
    in bulk, fewer wake-ups), which the parent gives back in one message where credit goes by message."""
    return max(1, prefetch // 2)


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


class _Parent:
    """The parent's side of the pipe, as the worker's loop reads it: :meth:`wait` until it speaks,
    :meth:`commands` for what it said (:class:`~feedline._partitions.waker.Readable`: portable)."""

    def __init__(self, conn: Connection, poll: bool = HAS_POLL) -> None:
        self.conn = conn
        self.readable = Readable(conn, poll)

    def wait(self, timeout: float | None = None) -> bool:
        """Until the parent spoke (or closed the pipe), at most ``timeout`` seconds: whether it did."""
        return self.readable(timeout)

    def commands(self) -> Iterator[tuple[Any, ...]]:
        """The parent's messages already on the pipe; ``("stop",)`` where it closed it (EOF), or
        reading failed (the parent then restarts this worker)."""
        while self.readable():
            try:
                msg = self.conn.recv()
            except Exception:
                msg = ("stop",)
            yield msg
            if msg[0] == "stop":
                return


def run_worker(conn: Connection, make_bytes: bytes, owned: list[int], prefetch: int, threads: int,
               beat: float = 1.0) -> None:
    """Serve partitions ``owned`` over ``conn`` until told to stop or the parent goes away.

    The partitions run on this thread, in turn (an :class:`~feedline._core.inline.Inline`
    each): a pass makes one batch of each partition with credit left, in the order the parent takes
    them, and sends a batch at once where the parent has none of its partition's (it may be waiting
    for it), the rest of the pass in one message; the parent's messages are read between passes,
    and the loop sleeps on the pipe once no partition has credit (looking again after a heartbeat,
    should a wake never come). No partition shares the interpreter with another's thread, and no
    batch crosses a queue before it is sent (the figures: docs/benchmarks.md, partitions).
    """
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    threading.Thread(target=_watch_parent, name="feedline-parent-watch", daemon=True).start()
    # batches with their arrays out of band (frames.py), laid out in place where they can be (blocks.py)
    writer = FrameWriter(conn, blocks=min(MAX_BLOCKS, 2 * len(owned) + 1))
    lock = threading.Lock()

    def send(msg: Any, views: bool = False) -> None:
        with lock:   # this thread's messages and the heartbeat's
            writer.send(msg, views)

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
    gc.set_threshold(GC_YOUNG, *gc.get_threshold()[1:])
    gc.freeze()   # the modules and the tokenizer: see the module docstring
    settle = closed = False   # a partition started (or closed): what lives after the next pass is frozen
    parent = _Parent(conn)
    stages: dict[int, Inline] = {}   # the partitions started, in the order they are owned (the parent's turns)
    credit = dict.fromkeys(owned, 0)   # granted: at the start and by message (where there is no ring)
    base = dict.fromkeys(owned, 0)     # the parent's count of takes in the ring when the partition started
    sent = dict.fromkeys(owned, 0)     # batches sent since it started
    slot = {p: i for i, p in enumerate(owned) if i < SLOTS}   # its credit word in the ring

    def arena(p: int, nbytes: int) -> Any:   # partition p's next gather's memory (the writer's, as sending)
        with lock:
            return writer.arena(p, nbytes)

    def retire(p: int) -> None:
        with lock:
            writer.retire(p)

    arenas = {p: functools.partial(arena, p) for p in owned}

    def taken(p: int) -> int:   # the parent's takes since the start, counted in the ring (0 without one)
        ring = writer.ring
        return ring.taken(slot[p]) - base[p] if ring is not None and p in slot else 0

    def left(p: int) -> int:
        return credit[p] + taken(p) - sent[p]

    gens = dict.fromkeys(owned, -1)   # each partition's start, as the parent numbered it
    drop = dict.fromkeys(owned, 0)    # batches still to make again and drop (a restart's replay)
    seqs = dict.fromkeys(owned, 0)    # the number of the partition's next batch sent
    every = 1
    refill = refill_of(prefetch)
    kept: dict[int, deque[tuple[int, Any]]] = {p: deque(maxlen=KEEP) for p in owned}
    busy = False   # the last pass made something: the next one does not wait

    def flush(out: list[tuple[Any, ...]]) -> None:   # what the pass made so far, in one message
        if out:   # (batches without a state may reach the consumer as they lie in shared memory: frames.py)
            send(out[0] if len(out) == 1 else ("many", out), all(m[0] == "batch" and m[4] is None for m in out))
            out.clear()

    try:
        send(("ready",))
        while True:
            if not busy and not parent.wait(beat):   # a heartbeat without a word: look again (a safety net)
                missed = [p for p in stages if left(p) >= refill]   # its count reached, and no wake came
                if missed and not parent.wait(0.1):   # (nor is one just arriving): a bug, said, not a hang
                    send(("warn", f"credit came without a wake (partitions {missed}); it went on after a "
                                  "heartbeat's wait (a bug in feedline: please report it)"))
            out: list[tuple[Any, ...]] = []
            for msg in parent.commands():
                if msg[0] == "stop":
                    return
                if msg[0] == "credit" and msg[1] == gens[msg[2]]:
                    credit[msg[2]] += msg[3]
                elif msg[0] == "state":
                    _, gen, p, seq = msg
                    found = next((st for n, st in kept[p] if n == seq), None) if gen == gens[p] else None
                    send(("state", gen, p, seq, found))
                elif msg[0] == "start":
                    every, settle = msg[3], True
                    for p, (state, skip) in msg[2].items():
                        gens[p], drop[p], seqs[p], sent[p] = msg[1], skip, 0, 0
                        base[p] = taken(p) + base[p]   # (the takes so far were of earlier starts)
                        kept[p].clear()
                        old = stages.pop(p, None)
                        if old is not None:
                            old.close()
                            closed = True
                        retire(p)
                        credit[p] = prefetch
                        stage = Inline(functools.partial(_open, make, p))
                        try:   # building the pipeline may fail (a missing file, a bad spec): the parent raises it
                            if state is not None:
                                stage.set_state(state)
                            stage.start()
                        except BaseException as e:   # SystemExit from user code too: reported, never a death
                            stage.close()
                            closed = True
                            out.append(("error", msg[1], p, *portable(e)))
                            continue
                        stages[p] = stage
                    stages = {p: stages[p] for p in owned if p in stages}   # (turn order, whatever the start's)
            busy = False
            short: list[int] = []   # out of credit
            for p in list(stages):   # one batch of each partition with credit left
                if left(p) <= 0:
                    short.append(p)
                    continue
                busy = True
                try:
                    with providing(arenas[p]):   # a gather laid out in one of the blocks, if one is free
                        batch, state = next(stages[p])
                except StopIteration:
                    stage = stages.pop(p)
                    out.append(("end", gens[p], p, materialize(stage.end_state)))
                    stage.close()
                    retire(p)
                    settle = closed = True
                    continue
                except BaseException as e:   # SystemExit from user code too: reported, never a death
                    out.append(("error", gens[p], p, *portable(e)))
                    stages.pop(p).close()
                    retire(p)
                    settle = closed = True
                    continue
                if drop[p]:   # made again after a restart, up to the parent's last state
                    drop[p] -= 1
                    continue
                seq, seqs[p] = seqs[p], seqs[p] + 1
                if seq % every:   # kept here until asked for (rarely), not pickled and sent
                    kept[p].append((seq, state))
                    state = None
                out.append(("batch", gens[p], p, batch, state, seq))   # a snapshot: pickled as the state, in one pass
                sent[p] += 1
                if left(p) >= prefetch - 1:   # the parent had none of p's batches: it may be waiting for this one
                    flush(out)
            flush(out)   # the rest of the pass in one message: one pipe write, one wake-up of the parent
            if settle and busy:   # (a closed pipeline's cycles collected first: frozen, they never would be)
                gc.unfreeze()
                if closed:
                    gc.collect()
                gc.freeze()
                settle = closed = False
            if not busy:   # every partition out of credit: woken by the parent's take that gives a few more
                for p in short:   # (by message), or at once where it came meanwhile
                    if p in slot and writer.ring is not None and (
                            left(p) > 0 or not writer.ring.wake_at(slot[p], base[p] + sent[p] - credit[p] + refill)):
                        busy = True
    except (EOFError, OSError, BrokenPipeError):
        return  # the parent closed the pipe
    finally:
        for stage in stages.values():
            stage.close()
        with lock:
            writer.close()


def _open(make: Callable[[int], Any], p: int) -> Any:
    return iter(make(p))
