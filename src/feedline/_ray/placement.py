"""The ``ray`` placement: each partition a Ray actor, anywhere on a cluster; the driver only composes.

``parallel: {placement: ray, address: auto, num_cpus: 1}`` starts one actor per partition
(``num_cpus`` each, spread over the nodes), which builds the partition's whole pipeline from the
picklable factory and hands out its batches with the state after each. The driver keeps up to
``parallel.prefetch`` calls in flight per actor (an actor runs its calls in order, so batches come
back in order) and each partition's state after the last batch it took. An actor that is lost
(its node died, it was killed) is started again from that state on any node, so the stream goes
on exactly; after :data:`MAX_RESTARTS` losses of one partition the stream fails with a
:class:`FeedlineError`. Errors raised by a partition's pipeline are raised in the driver as they
were, with the actor's traceback as their cause. The actors are killed when the stream closes.
Each partition is an :class:`ActorStream`, a stage of the shape of the processes placement's
worker stream (:meth:`RayPlacement.open`).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from typing import Any

import numpy as np

from feedline._core.dataset import State
from feedline._partitions.placement import Make, Part, Placement
from feedline._partitions.remote import with_remote
from feedline._ray.runtime import connect
from feedline._spec import ParallelSpec
from feedline.errors import FeedlineError

__all__ = ["MAX_RESTARTS", "ActorStream", "PartitionActor", "RayPlacement"]

#: Losses of one partition's actor that are recovered before the stream fails.
MAX_RESTARTS = 3


class PartitionActor:
    """One partition's stream on a Ray worker (wrapped with ``ray.remote`` when first used)."""

    def __init__(self, make: Make, p: int, state: State | None) -> None:
        self.it = iter(make(p))
        if state is not None:
            self.it.set_state(state)

    def next(self) -> tuple[Part | None, State | None]:
        """The next batch and the state after it; ``(None, the state at the end)`` at the end."""
        try:
            batch = next(self.it)
        except StopIteration:
            try:
                return None, self.it.get_state()
            except Exception:  # the state is a courtesy here: the end is what matters
                return None, None
        return batch, self.it.get_state()

    def state(self) -> State:
        """The stream's state now (its start, before any batch)."""
        return self.it.get_state()

    def node(self) -> str:
        import ray

        return str(ray.get_runtime_context().get_node_id())


class ActorStream:
    """Partition ``p`` as a Ray actor, from ``state``: a stage of the same shape as a worker stream.

    The actor is started from the state after the last batch handed out (at :meth:`start` or the
    first ``next``); up to ``parallel.prefetch`` calls are in flight; a lost actor is started again
    from that state (counted in the placement's ``restarts``)."""

    def __init__(self, placement: RayPlacement, p: int, state: State | None) -> None:
        self.placement, self.p = placement, p
        self.actor: Any = None
        self.pending: deque[Any] = deque()
        self.taken = state
        self.ended = False
        self.end_state: State | None = None

    def start(self) -> None:
        if self.actor is None and not self.ended:
            self.actor = self.placement.spawn(self.p, self.taken)
            self.pending.clear()
            self._fill()

    def _fill(self) -> None:
        while len(self.pending) < self.placement.options.prefetch:
            self.pending.append(self.actor.next.remote())

    def __iter__(self) -> ActorStream:
        return self

    def __next__(self) -> tuple[Part, State]:
        if self.ended:
            raise StopIteration
        pl = self.placement
        while True:
            self.start()
            self._fill()
            try:
                got = pl.ray.get(self.pending.popleft())
            except pl.lost as e:
                pl.lose(self.p, e)
                self._kill()
                continue
            except pl.ray.exceptions.RayTaskError as e:  # the pipeline's own error, raised as it was,
                cause = e.cause  # with the actor's traceback as its cause (feedline._partitions.remote)
                if not isinstance(cause, BaseException):
                    raise e.as_instanceof_cause() from None
                tb = vars(e).get("traceback_str") or str(e)  # (Ray's dual instance holds it only in its str)
                error = with_remote(cause, str(tb))
                raise error from error.__cause__   # (not in the context of Ray's wrapper)
            break
        batch, state = got
        if batch is None:
            self.ended, self.end_state = True, state
            self._kill()
            raise StopIteration
        self.taken = state
        return {k: v if v.flags.writeable else np.array(v) for k, v in batch.items()}, state

    def get_state(self) -> State:
        if self.taken is None:
            self.taken = self.placement.start_state(self.p)
        return dict(self.taken)

    def set_state(self, state: Mapping[str, Any]) -> None:
        self._kill()
        self.taken, self.ended, self.end_state = dict(state), False, None

    def _kill(self) -> None:
        actor, self.actor = self.actor, None
        self.pending.clear()
        if actor is not None:
            try:
                self.placement.ray.kill(actor)
            except Exception:  # already gone with its node
                pass

    def close(self) -> None:
        self._kill()

    def node(self) -> str:
        """The node its actor runs on (starting it)."""
        self.start()
        return str(self.placement.ray.get(self.actor.node.remote()))


class RayPlacement(Placement):
    """Partitions as Ray actors (see the module docstring); every actor starts at the first ask."""

    together = True

    def __init__(self, make: Make, k: int, options: ParallelSpec) -> None:
        super().__init__(make, k, options)
        self.ray = connect(options)
        self._remote = self.ray.remote(PartitionActor)
        errors = self.ray.exceptions  # what a lost actor or node raises (an error of the pipeline is RayTaskError)
        self.lost = (errors.RayActorError, errors.ActorDiedError, errors.ActorUnavailableError, errors.WorkerCrashedError)
        self.restarts = [0] * k
        self.streams: dict[int, ActorStream] = {}   # the latest stream opened for each partition

    def open(self, p: int, state: State | None) -> ActorStream:
        stream = self.streams[p] = ActorStream(self, p, state)
        return stream

    def spawn(self, p: int, state: State | None) -> Any:
        """Partition ``p``'s actor, started from ``state``."""
        return self._remote.options(num_cpus=self.options.num_cpus, max_restarts=0,
                                    scheduling_strategy="SPREAD").remote(self.make, p, state)

    def lose(self, p: int, error: BaseException) -> None:
        self.restarts[p] += 1
        if self.restarts[p] > MAX_RESTARTS:
            raise FeedlineError(f"the Ray actor of partition {p} was lost {self.restarts[p]} times (last: "
                                f"{type(error).__name__}: {str(error)[:200]}); check the cluster's health") from error

    def start_state(self, p: int) -> State:
        """Partition ``p``'s state at its start, from a short-lived actor."""
        actor = self.spawn(p, None)
        try:
            return dict(self.ray.get(actor.state.remote()))
        finally:
            self.ray.kill(actor)

    def close(self) -> None:
        for stream in self.streams.values():
            stream.close()
        self.streams.clear()

    def replay(self, p: int, state: State | None) -> Part:
        """The batch after ``state`` from a short-lived actor (the driver may not hold the corpus)."""
        actor = self._remote.options(num_cpus=self.options.num_cpus, max_restarts=0).remote(self.make, p, state)
        try:
            got = self.ray.get(actor.next.remote())
        finally:
            self.ray.kill(actor)
        if got[0] is None:
            raise FeedlineError(f"partition {p} ended where the state says a batch of it was carried; the data changed")
        return {k: np.array(v) for k, v in got[0].items()}

    def nodes(self) -> list[str]:
        """The node each open partition's actor runs on (for tests and monitoring)."""
        return [stream.node() for stream in self.streams.values() if not stream.ended]
