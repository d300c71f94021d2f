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
"""

from __future__ import annotations

from collections import deque
from typing import Any

import numpy as np

from feedline._core.dataset import State
from feedline._partitions.placement import Make, Part, Placement
from feedline._partitions.remote import with_remote
from feedline._ray.runtime import connect
from feedline._spec import EngineSpec, ParallelSpec
from feedline.errors import FeedlineError

__all__ = ["MAX_RESTARTS", "PartitionActor", "RayPlacement"]

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

    def node(self) -> str:
        import ray

        return str(ray.get_runtime_context().get_node_id())


class RayPlacement(Placement):
    """Partitions as Ray actors (see the module docstring)."""

    def __init__(self, make: Make, k: int, options: ParallelSpec) -> None:
        super().__init__(make, k, options)
        self.ray = connect(EngineSpec(kind="ray", address=options.address))
        self._remote = self.ray.remote(PartitionActor)
        errors = self.ray.exceptions  # what a lost actor or node raises (an error of the pipeline is RayTaskError)
        self._lost = (errors.RayActorError, errors.ActorDiedError, errors.ActorUnavailableError, errors.WorkerCrashedError)
        self._actors: list[Any] = [None] * k
        self._pending: list[deque[Any]] = [deque() for _ in range(k)]
        self._taken: list[State | None] = [None] * k
        self._ended = [False] * k
        self._end: list[State | None] = [None] * k   # each partition's state at its end
        self.restarts = [0] * k

    def actor(self, p: int) -> Any:
        """Partition ``p``'s actor, started from its state when there is none."""
        if self._actors[p] is None:
            self._actors[p] = self._remote.options(num_cpus=self.options.num_cpus, max_restarts=0,
                                                   scheduling_strategy="SPREAD").remote(self.make, p, self._taken[p])
            self._pending[p].clear()
        return self._actors[p]

    def next(self, p: int) -> tuple[Part, State] | None:
        if self._ended[p]:
            return None
        for q in range(self.k):  # every actor starts building its pipeline now, not when first asked
            if self._actors[q] is None and not self._ended[q]:
                self.actor(q)
                self._fill(q)
        while True:
            self.actor(p)
            self._fill(p)
            try:
                got = self.ray.get(self._pending[p].popleft())
            except self._lost as e:
                self._lose(p, e)
                continue
            except self.ray.exceptions.RayTaskError as e:  # the pipeline's own error, raised as it was,
                cause = e.cause  # with the actor's traceback as its cause (feedline._partitions.remote)
                if not isinstance(cause, BaseException):
                    raise e.as_instanceof_cause() from None
                tb = vars(e).get("traceback_str") or str(e)  # (Ray's dual instance holds it only in its str)
                error = with_remote(cause, str(tb))
                raise error from error.__cause__   # (not in the context of Ray's wrapper)
            break
        batch, state = got
        if batch is None:
            self._ended[p], self._end[p] = True, state
            return None
        self._taken[p] = state
        return {k: v if v.flags.writeable else np.array(v) for k, v in batch.items()}, state

    def _fill(self, p: int) -> None:
        actor, pending = self._actors[p], self._pending[p]
        while len(pending) < self.options.prefetch:
            pending.append(actor.next.remote())

    def _lose(self, p: int, error: BaseException) -> None:
        self.restarts[p] += 1
        self._kill(p)
        if self.restarts[p] > MAX_RESTARTS:
            raise FeedlineError(f"the Ray actor of partition {p} was lost {self.restarts[p]} times (last: "
                                f"{type(error).__name__}: {str(error)[:200]}); check the cluster's health") from error

    def _kill(self, p: int) -> None:
        actor, self._actors[p] = self._actors[p], None
        self._pending[p].clear()
        if actor is not None:
            try:
                self.ray.kill(actor)
            except Exception:  # already gone with its node
                pass

    def set_states(self, states: list[State | None]) -> None:
        for p in range(self.k):
            self._kill(p)
        self._taken = list(states)
        self._ended = [False] * self.k
        self._end = [None] * self.k

    def end_state(self, p: int) -> State | None:
        return self._end[p]

    def close(self) -> None:
        for p in range(self.k):
            self._kill(p)

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
        """The node each partition's actor runs on (starting the actors; for tests and monitoring)."""
        return [str(n) for n in self.ray.get([self.actor(p).node.remote() for p in range(self.k)])]
