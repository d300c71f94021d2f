"""Where partitions run: the :class:`Placement` interface, the registry by name, and ``threads``.

A placement runs ``K`` partition streams (each a recipe of batches, built by a picklable factory
``make(p)``) and hands the composing stage each partition's next batch with the state after it.
Placement is never identity: every placement hands out the same batches and states, because each
partition is the same deterministic stream wherever it runs. Placements register by name
(:func:`register_placement`): ``threads`` is this module's own; the package root installs
``processes`` (:mod:`feedline._partitions.processes`) and ``ray`` (with the Ray helpers), the way
it installs the task and batcher registries.

    >>> import feedline; sorted(PLACEMENTS)            # doctest: +SKIP
    ['processes', 'ray', 'threads']
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from typing import Any

from feedline._batching.base import Batch
from feedline._batching.compact import CompactBatch
from feedline._core.dataset import Dataset, DatasetIterator, State
from feedline._core.options import close_match
from feedline._core.prefetch import Prefetch
from feedline._spec import ParallelSpec
from feedline.errors import SpecError

__all__ = ["PLACEMENTS", "Make", "Part", "Placement", "ThreadPlacement", "placement_class", "register_placement"]

#: A partition's batch: laid out, or compact where the consumer lays batches out itself.
Part = Batch | CompactBatch
#: A picklable factory of partition ``p``'s stream of batches (compact ones where asked for:
#: :class:`~feedline._partitions.compose.CompactBatches`).
Make = Callable[[int], Dataset[Part]]


class Placement(ABC):
    """Runs partitions ``0..k-1`` of ``make``; see the module docstring.

    ``states`` hold each partition's position (``None``: its start); :meth:`next` returns the
    partition's next batch and the state after it (``None`` at its end).
    """

    def __init__(self, make: Make, k: int, options: ParallelSpec) -> None:
        self.make, self.k, self.options = make, k, options

    @abstractmethod
    def next(self, p: int) -> tuple[Part, State] | None:
        """Partition ``p``'s next batch and its state after it; ``None`` when it has ended."""

    def end_state(self, p: int) -> State | None:
        """Partition ``p``'s state at its end, once :meth:`next` returned ``None`` (``None``: not
        known). It counts what the partition read after its last batch (rejections), which the
        composing stage keeps as the partition's state from then on."""
        return None

    @abstractmethod
    def set_states(self, states: list[State | None]) -> None:
        """Position every partition at its state (``None``: its start); nothing prefetched survives."""

    @abstractmethod
    def close(self) -> None:
        """Stop everything this placement started. Idempotent; using it again restarts."""

    def replay(self, p: int, state: State | None) -> Part:
        """Partition ``p``'s batch after ``state`` (a restore's carried rows); here, by default."""
        return replay(self.make, p, state)


class ThreadPlacement(Placement):
    """Each partition on its own thread in this process (a :class:`Prefetch` over its stream)."""

    def __init__(self, make: Make, k: int, options: ParallelSpec) -> None:
        super().__init__(make, k, options)
        self._stages = [self._stage(p) for p in range(k)]
        self._started = False   # every partition started
        self._out = False       # step 1 (or the first step after a restore) handed out

    def _stage(self, p: int) -> Prefetch:
        return Prefetch(lambda: iter(self.make(p)), self.options.prefetch, name=f"feedline-partition-{p}")

    def next(self, p: int) -> tuple[Part, State] | None:
        if self._out and not self._started:  # the first ask (or the first after a restore) started the
            self._started = True  # partition asked alone: step 1 waited for it, not for K pipelines built
            for stage in self._stages:  # and sharing the cores; at the next ask the others start, not
                stage.start()  # when their turn comes
        self._out = True
        return next(self._stages[p], None)

    def end_state(self, p: int) -> State | None:
        return self._stages[p].end_state

    def set_states(self, states: list[State | None]) -> None:
        self._started = self._out = False
        for p, (stage, state) in enumerate(zip(self._stages, states, strict=True)):
            if state is None:
                stage.close()
                self._stages[p] = self._stage(p)
            else:
                stage.set_state(state)

    def close(self) -> None:
        for stage in self._stages:
            stage.close()


PLACEMENTS: dict[str, Callable[[Make, int, ParallelSpec], Placement]] = {"threads": ThreadPlacement}


def register_placement(name: str, factory: Callable[[Make, int, ParallelSpec], Placement]) -> None:
    """Make ``parallel: {placement: name}`` run partitions with ``factory(make, k, options)``."""
    PLACEMENTS[name] = factory


def placement_class(name: str) -> Callable[[Make, int, ParallelSpec], Placement]:
    """The placement registered as ``name``."""
    found = PLACEMENTS.get(name)
    if found is None:
        hint = " (the ray placement is installed by `import feedline`)" if name == "ray" else ""
        raise SpecError(f"parallel.placement: {name!r} is not a placement{close_match(name, sorted(PLACEMENTS))}"
                        f" (placements: {', '.join(sorted(PLACEMENTS))}){hint}")
    return found


def replay(make: Make, p: int, state: Mapping[str, Any] | None) -> Part:
    """Partition ``p``'s batch after ``state`` (``None``: its first), computed here (a restore's carried rows)."""
    it: DatasetIterator[Part] = iter(make(p))
    try:
        if state is not None:
            it.set_state(state)
        return next(it)
    finally:
        it.close()
