"""A partition in a worker process as a stage: :class:`WorkerStream`, and :class:`Handover` for warm start.

:class:`WorkerStream` is partition ``p`` of a :class:`~feedline._partitions.processes.ProcessPlacement`
(its :class:`Router`: it routes the workers' messages to the partitions' streams): started from its state (``("start", gen, {p: state})``),
it receives its batches with the states after them into a queue of its own, returns credit to the
worker (at most ``parallel.prefetch`` batches made and not yet taken here: each
batch taken is counted in the worker's shared memory, :meth:`RingReader.took`, which wakes the
worker's sender by message only where it waits for credit; without shared memory, by message,
``prefetch // 2`` batches at a time), and keeps the state after the last batch it handed out. Its
generation (``gen``, new at every open and ``set_state``) tells its messages from those of an
earlier start of the partition, which are dropped. When its worker dies the stream begins again
from that state once the new worker is ready, so the stream goes on exactly.

:class:`Handover` is warm start: the partition runs on a thread here (a :class:`Prefetch` over its
pipeline) only while it is asked for and its worker is not ready; a partition whose worker is
ready when it is first asked for (or restored) never runs here. The moment its worker says it is
ready, the thread is cut (:meth:`Prefetch.cut`): the batches it had queued are still handed out,
and the worker starts at once from the state after the last of them, restoring while they are
taken. The batch the thread was making then is dropped, never handed out (the worker makes it:
at most one batch's work per partition made twice), and the thread is not waited for: the
handovers of all partitions start together, none waits for a thread here that shares this
process's interpreter with K others. When the worker dies, the partition runs here again (when
asked for) until the new one is ready.
"""

from __future__ import annotations

import functools
from collections import deque
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from feedline._core.dataset import State
from feedline._core.deferred import Deferred, materialize
from feedline._core.prefetch import Prefetch
from feedline._partitions.placement import Part
from feedline._partitions.worker import KEEP, refill_of
from feedline._spec import ParallelSpec

__all__ = ["Handover", "Router", "WorkerStream"]

END = object()   # a queued end: (END, the state at the end, ...)
#: A worker sends a batch's state with it every this many batches (where states are not read at
#: every step); the parent asks for another when it is read, or makes it again from the last sent.
#: As many as the worker keeps (:data:`~feedline._partitions.worker.KEEP`): a state read is of a batch
#: just handed out, which the worker still keeps, so an anchor serves only a restart (which makes
#: again at most this many batches). A pack window's state is ~80 KB to pickle (~0.18 ms in a worker):
#: every 16 batches it cost ~0.01 ms a batch, ~2 % of a documents batch.
ANCHOR_EVERY = KEEP


class Router(Protocol):
    """What a worker stream asks of its placement (:class:`~feedline._partitions.processes.ProcessPlacement`)."""

    options: ParallelSpec
    eager: bool   # every batch's state is read (the service's steps): sent with each batch

    def generation(self) -> int: ...   # a number no start of any partition had
    def attach(self, stream: WorkerStream) -> None: ...   # its partition's messages go to it; its worker starts
    def attached(self, stream: WorkerStream) -> bool: ...
    def detach(self, stream: WorkerStream) -> None: ...
    def worker_ready(self, p: int) -> bool: ...
    def send(self, p: int, msg: tuple[Any, ...]) -> None: ...   # to partition p's worker
    def credit(self, p: int, gen: int) -> bool: ...   # a batch taken: counted in its worker's memory (False: no ring)
    def start_state(self, p: int) -> State: ...
    def remote_error(self, msg: tuple[Any, ...]) -> BaseException: ...
    def ask_state(self, p: int, gen: int, seq: int) -> State | None: ...   # of the worker; None: not kept
    def replay_state(self, p: int, base: State | None, n: int) -> State: ...   # here: n batches after base
    def wait(self, p: int | None = None) -> None: ...   # handle the next message of any worker
    def idle(self) -> None: ...   # wait for a worker's message or a local thread's batch (the ``wake`` of both)
    def drain(self) -> None: ...   # handle those already received


class _Handback(Exception):
    """A handed-over stream's worker died: its handover runs the partition here again."""


class WorkerStream:
    """Partition ``p`` in its worker process, from ``state`` (see the module docstring)."""

    def __init__(self, router: Router, p: int, state: State | None) -> None:
        self.router, self.p = router, p
        self.owner: Handover | None = None   # a warm start's handover: it begins the stream, not a ready worker
        self.credit_every = refill_of(router.options.prefetch)
        self._reset(state)

    def _reset(self, state: State | None) -> None:
        self.gen = self.router.generation()
        self.took(state)
        self.anchor, self.anchor_seq = state, -1   # the last state the worker sent, and its batch's number
        self.queue: deque[tuple[Any, Any, State | None, int]] = deque()   # (batch, state, base, n): see took
        self.owed = 0        # batches taken since the worker was last given credit
        self.begun = False   # the worker was told to start the partition (this generation, this worker)
        self.ended = False
        self.end_state: State | None = None
        self.failed: BaseException | None = None   # raised again when asked (never waited for)

    # ----------------------------------------------------------------- the router's calls
    def took(self, state: State | None, base: State | None = None, n: int = 0) -> None:
        """The state after the last batch handed out (the opening state before any), which is
        ``n`` batches after ``base`` (the last state the worker sent; ``n`` 0: ``state`` itself)."""
        self.taken = state
        self.base, self.n = (state, 0) if n == 0 else (base, n)

    def receive(self, msg: tuple[Any, ...]) -> None:
        """A message of this generation: ``batch``, ``end`` or ``error``."""
        if msg[0] == "batch":
            state, seq = msg[4], msg[5]
            if state is None:   # kept by the worker: asked for when read (rarely), else made again from the anchor
                n = seq - self.anchor_seq
                lazy = Deferred(functools.partial(self._state_of, self.gen, seq, self.anchor, n))
                self.queue.append((msg[3], lazy, self.anchor, n))
            else:
                self.anchor, self.anchor_seq = state, seq
                self.queue.append((msg[3], state, state, 0))
        elif msg[0] == "end":
            self.queue.append((END, msg[3], msg[3], 0))
        else:
            self.failed = self.router.remote_error(msg)
            raise self.failed

    def on_ready(self) -> None:
        """Its worker is ready."""
        if self.owner is not None:
            self.owner.ready()
        elif not self.begun and not self.ended:
            self.begin()

    def on_lost(self) -> None:
        """Its worker died: what it sent and was not taken is made again, by the next worker."""
        self.queue.clear()
        self.begun, self.owed = False, 0
        if self.owner is not None:
            self.owner.lost()

    def worker_ready(self) -> bool:
        return self.router.worker_ready(self.p)

    def begin(self, after: State | None = None) -> None:
        """Start the partition in its worker from the state after the last batch handed out (the
        worker makes again and drops the batches after the last state it sent, if any), or from
        ``after`` (a handover's cut: the batches before it are handed out from here meanwhile)."""
        self.begun, self.owed = True, 0   # a start gives the worker its whole credit again
        self.gen = self.router.generation()   # (the batches' numbers start again)
        base, n = (self.base, self.n) if after is None else (after, 0)
        self.anchor, self.anchor_seq = base, -1 - n
        every = 1 if self.router.eager else ANCHOR_EVERY
        self.router.send(self.p, ("start", self.gen, {self.p: (materialize(base), n)}, every))

    def _state_of(self, gen: int, seq: int, anchor: State | None, n: int) -> State:
        """The state after batch ``seq`` of start ``gen``, ``n`` batches after ``anchor``: the worker's,
        or made again here where it no longer keeps it (its worker restarted, or it is old)."""
        got = self.router.ask_state(self.p, gen, seq)
        return got if got is not None else self.router.replay_state(self.p, anchor, n)

    # ----------------------------------------------------------------- stage
    def start(self) -> None:
        """Start its worker (registered with the router: its messages come here)."""
        self.router.attach(self)
        if self.worker_ready():
            self.on_ready()

    def __iter__(self) -> WorkerStream:
        return self

    def __next__(self) -> tuple[Part, State]:
        if self.ended:
            raise StopIteration
        if self.failed is not None:   # its worker stopped the partition: asking again must not wait forever
            raise self.failed
        if not self.router.attached(self):
            self.start()
        if self.queue:   # hears "ready"s, batches, deaths (with nothing queued, the wait below does: no look first)
            self.router.drain()
        while not self.queue:
            if not self.begun:
                if self.owner is not None:
                    raise _Handback
                if self.worker_ready():
                    self.begin()
            self.router.wait(self.p)
        batch, state, base, n = self.queue.popleft()
        if batch is END:
            self.ended, self.end_state = True, state
            raise StopIteration
        self.took(state, base, n)
        shared = self.router.credit(self.p, self.gen)   # its credit, in the worker's shared memory: no message
        if not shared:
            self.owed += 1
        # by message, in bulk (fewer messages, the worker stays ahead); what was owed before the ring came goes at once
        if self.owed >= self.credit_every or (shared and self.owed):
            self.router.send(self.p, ("credit", self.gen, self.p, self.owed))
            self.owed = 0
        return batch, state

    def get_state(self) -> State:
        if self.taken is None:
            self.took(self.router.start_state(self.p))
        return materialize(self.taken)  # type: ignore[no-any-return]

    def set_state(self, state: Mapping[str, Any]) -> None:
        begun = self.begun
        self._reset(dict(state))
        if begun and self.owner is None:   # the worker restarts the partition there (a handover decides itself)
            self.begin()

    def close(self) -> None:
        self.router.detach(self)
        self.queue.clear()


class Handover:
    """Warm start: partition ``p`` on a thread here while ``remote``'s worker is not ready, then there (see the module docstring)."""

    def __init__(self, local: Callable[[State | None], Prefetch], remote: WorkerStream) -> None:
        self._make_local, self.remote = local, remote
        remote.owner = self
        self.local: Prefetch | None = None   # the thread here; once cut, what it made, handed out first
        self.mode = "local"      # local | remote (the worker begun) | ending (the thread's end or error is queued)
        self.end_state: State | None = None
        self.failed: BaseException | None = None

    def _close_local(self) -> None:
        local, self.local = self.local, None
        if local is not None:
            local.close()

    def ready(self) -> None:
        """The worker is ready: it begins at once, after the last batch the thread here queued (if it ran)."""
        if self.mode != "local":
            return
        after = self.local.cut() if self.local is not None else None
        if self.local is not None and after is None:   # the thread's end (or error) is queued: it ends here
            self.mode = "ending"
            return
        self.mode = "remote"
        self.remote.begin(after)

    def lost(self) -> None:
        """The worker died: its partition runs here again (from the last batch handed out) until the next one is ready."""
        if self.mode != "remote" or self.remote.ended:
            return
        self._close_local()   # (what a cut kept and was not handed out is made again)
        self.mode = "local"

    def start(self) -> None:
        """Start the worker (the thread here starts only when a batch is asked for before it is ready)."""
        self.remote.start()

    def __iter__(self) -> Handover:
        return self

    def __next__(self) -> tuple[Part, State]:
        if self.failed is not None:
            raise self.failed
        if self.remote.ended:
            raise StopIteration
        router = self.remote.router
        while True:
            if not router.attached(self.remote) and self.remote.worker_ready():
                self.start()   # (a stage opened, or restored, while its worker is ready: it never runs here)
            if router.attached(self.remote):
                router.drain()   # hears "ready"s, batches, deaths
                if self.mode == "local" and self.remote.worker_ready():   # (ready before this stage was attached)
                    self.ready()
            if self.mode == "remote" and self.local is None:
                try:
                    return next(self.remote)
                except _Handback:
                    continue
                except StopIteration:
                    self.end_state = self.remote.end_state
                    raise
            if self.local is None:
                self.local = self._make_local(self.remote.taken)
            local = self.local
            try:
                got = local.poll()
            except StopIteration:
                self._close_local()
                if local.finished:   # cut, and every batch it had made was handed out: the worker's from here
                    continue
                self.remote.ended, self.end_state = True, local.end_state
                raise
            except BaseException as e:
                self.failed = e
                self._close_local()
                raise
            if got is None:   # not made yet: wait for it or for the worker's "ready", whichever comes first
                router.idle()
                continue
            self.remote.took(got[1])
            return got

    def get_state(self) -> State:
        return self.remote.get_state()

    def set_state(self, state: Mapping[str, Any]) -> None:
        self._close_local()
        self.mode, self.end_state, self.failed = "local", None, None
        self.remote.set_state(state)

    def close(self) -> None:
        self._close_local()
        self.remote.close()
