"""Where partitions run: a placement opens each partition as a *stage*, and ``threads`` is the first.

A placement is one factory: :meth:`Placement.open` ``(p, state)`` returns partition ``p``'s
stream of batches positioned at ``state`` (``None``: its start) as a :class:`PartitionStage`, an
iterator with the stage protocol, the one :class:`~feedline._core.prefetch.Prefetch` has:

- ``next(stage)``: the partition's next batch with the state after it, ``(batch, state)``;
  ``StopIteration`` at its end, after which ``stage.end_state`` is its state there (what it
  rejected after its last batch counts), ``None`` where it is not known;
- ``get_state()`` / ``set_state(state)``: the state after the last batch taken (the stream's
  start before any) / the next batch is the one after ``state``;
- ``start()``: begin making batches now rather than at the first ``next``; ``close()``.

Where it runs is the stage's business: ``threads`` is a ``Prefetch`` over the partition's
pipeline; ``processes`` a worker-stream stage (:mod:`feedline._partitions.streams`), under a
handover stage while a warm start runs it here; ``ray`` an actor-stream stage
(:mod:`feedline._ray.placement`). Each stage is tested alone with
:func:`~feedline.testing.assert_stage_resumes`. Placement is never identity: every stage hands
out the same batches and states, because each partition is the same deterministic stream
wherever it runs. Placements register by name (:func:`register_placement`): ``threads`` is this
module's own; the package root installs ``processes`` and ``ray``.

    >>> import feedline; sorted(PLACEMENTS)            # doctest: +SKIP
    ['processes', 'ray', 'threads']
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any, Protocol

from feedline._batching.base import Batch
from feedline._batching.compact import CompactBatch
from feedline._core.dataset import Dataset, DatasetIterator, State
from feedline._core.deferred import materialize
from feedline._core.options import close_match
from feedline._core.prefetch import Prefetch
from feedline._spec import ParallelSpec
from feedline.errors import SpecError

__all__ = ["PLACEMENTS", "Make", "Part", "PartitionStage", "Placement", "ThreadPlacement", "placement_class",
           "register_placement"]

#: A partition's batch: laid out, or compact where the consumer lays batches out itself.
Part = Batch | CompactBatch
#: A picklable factory of partition ``p``'s stream of batches (compact ones where asked for:
#: :class:`~feedline._partitions.compose.CompactBatches`).
Make = Callable[[int], Dataset[Part]]


class PartitionStage(Iterator[tuple[Part, State]], Protocol):
    """A partition's stream wherever it runs (see the module docstring)."""

    end_state: State | None

    def get_state(self) -> State: ...

    def set_state(self, state: Mapping[str, Any]) -> None: ...

    def start(self) -> None: ...

    def close(self) -> None: ...


class Placement:
    """Opens partitions ``0..k-1`` of ``make`` as stages (see the module docstring); :meth:`close`
    stops what the placement shares between its stages (worker processes)."""

    #: Every partition starts at the first ask (where they do not share the cores step 1 is made
    #: on: Ray actors, and worker processes that start together anyway), not after step 1.
    together = False
    #: Every batch's state is read (the service's steps, set by the composing stage): a placement
    #: that can leave states where they are made until read sends each with its batch instead.
    eager = False

    def __init__(self, make: Make, k: int, options: ParallelSpec) -> None:
        self.make, self.k, self.options = make, k, options

    def open(self, p: int, state: State | None) -> PartitionStage:
        """Partition ``p``'s stage, positioned at ``state`` (``None``: its start); not started."""
        raise NotImplementedError

    def replay(self, p: int, state: State | None) -> Part:
        """Partition ``p``'s batch after ``state`` (a restore's carried rows); here, by default."""
        return replay(self.make, p, state)

    def close(self) -> None:
        """Stop what the stages share. Idempotent; opening a stage again restarts it."""


class ThreadPlacement(Placement):
    """Each partition on its own thread in this process: a :class:`Prefetch` over its pipeline."""

    def open(self, p: int, state: State | None) -> Prefetch:
        make = self.make
        stage = Prefetch(lambda: iter(make(p)), self.options.prefetch, name=f"feedline-partition-{p}")
        if state is not None:
            stage.set_state(materialize(state))
        return stage


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
