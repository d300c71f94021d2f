"""The composing stage: the global stream built from K partitions taking turns.

    partition 0: sources' share ─► mix ─► shuffle ─► task ─► batcher (batch_size rows) ─┐
    partition 1: ...                                                                   ├─► Composed ─► GlobalStream
    partition K-1: ...                                                                 ─┘

Each partition is the whole pipeline over its share of the splits, seeded by ``(seed, partition)``,
making whole batches of ``batch_size`` rows. The partitions take turns: the global row stream is
partition 0's first batch, partition 1's first batch, ..., partition K-1's, then everyone's second,
and so on, a partition that has ended losing its turns; global batches are cut from it every
``batch_size`` rows. While every partition delivers full batches, step ``s`` is exactly partition
``(s - 1) % K``'s batch, untouched: a partition does all the work of its steps (no step is glued
from K slivers, whose per-batch costs would grow with K) and the first step waits for one
partition, not for all. A partition's last batch may be short; the rows after it then straddle
two partition batches, so only the global stream's very last batch is short (the remainder rule
applies to it, as without partitions).

State (the stage's own; under the global stream's ``pipeline``)::

    {"partitions": [<partition 0's batcher state, or null before its first batch; once it has
                     ended, its state at the end (what it read after its last batch counts)>, ...],
     "ended": [false, ...],
     "turn": <the partition asked next>,
     "carry": [[p, <p's state before a batch>, rows of it already used], ...]}

``carry`` is empty while every batch is full; after a short one it names the rows taken beyond the
step, rebuilt on restore by re-running that one batch. A state of another ``K`` is refused, and so
is one without ``turn`` (written when a step took ``batch_size / K`` rows of every partition: another
stream). Where partitions run (threads, processes, Ray actors) is the :class:`Placement`'s
business and never changes a batch or a state: each partition is a stage it opens from the
partition's state (:meth:`Placement.open`); a restore closes the stages and each reopens from its
state at its first ask, and a carried batch is replayed by the placement.

One partition (``partitions: 1``) placed in a process or an actor (``parallel: {placement:
processes}``) is the plain pipeline moved there: each step is its batch, and the state is the
pipeline's own (not the composed form above), so such a state and a plain loader's resume each other.

A consumer that lays batches out itself (the service's producer, through
:meth:`ComposedIterator.next_compact`) gets them compact: when its first request is for a compact
batch and the factory can (``make.compacted()``), the partitions send their ``pack`` batches as
:class:`~feedline._batching.compact.CompactBatch` (:class:`CompactBatches`: ~65 KB a step instead
of ~270 KB through the workers' pipes, no layout in the workers) and the composing stage cuts
and joins their rows' pieces where it must. Laid out, they are the same rows; the states are the same.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Mapping
from functools import cached_property
from typing import Any

from feedline._batching.base import Batch
from feedline._batching.compact import CompactBatch
from feedline._core.dataset import Dataset, DatasetIterator, State
from feedline._core.deferred import materialize
from feedline._partitions.placement import Make, PartitionStage, Placement, placement_class
from feedline._partitions.rows import join_rows, row_count, take_rows
from feedline._spec import ParallelSpec
from feedline._state import refuse_row_dealt
from feedline.errors import SourceError, StateError

__all__ = ["CompactBatches", "Composed", "ComposedIterator"]


class Composed(Dataset[Batch]):
    """Global batches of ``batch_size`` rows from ``k`` partition streams (``make(p)``) run by a placement."""

    def __init__(self, make: Make, k: int, batch_size: int, options: ParallelSpec,
                 pad_values: Callable[[], Mapping[str, Any]]) -> None:
        self.make, self.k, self.batch_size = make, k, batch_size
        self.options = options
        self.placement = options.resolve(k)
        self._pad_values = pad_values  # asked when rows are first joined (it may load the tokenizer)

    @cached_property
    def pad_values(self) -> dict[str, Any]:
        return dict(self._pad_values())

    def __iter__(self) -> ComposedIterator:
        return ComposedIterator(self)


class _Pads(Mapping[str, Any]):
    """A composed stream's pad values, resolved when first read: only steps that join rows of
    different lengths read them (in the tail, after a partition's short last batch), so no step
    waits for this process to load the tokenizer and build the task. A thread resolves them when
    the tail comes near (:meth:`warm`: a partition ended, or gave a short batch), while the other
    partitions' last batches are still taken; an endless stream never loads the tokenizer here
    (with partitions in workers or actors, this process never encodes)."""

    def __init__(self, ds: Composed) -> None:
        self.ds = ds
        self._warmed = False

    def warm(self) -> None:
        if not self._warmed:
            self._warmed = True
            threading.Thread(target=self._resolve, name="feedline-pad-values", daemon=True).start()

    def _resolve(self) -> None:
        try:
            _ = self.ds.pad_values
        except Exception:  # raised again where they are read
            pass

    def __getitem__(self, key: str) -> Any:
        return self.ds.pad_values[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self.ds.pad_values)

    def __len__(self) -> int:
        return len(self.ds.pad_values)


class ComposedIterator(DatasetIterator[Batch]):
    """Cursor over :class:`Composed` (see the module docstring for the rule and the state): the
    turn-taking and the carried rows over ``K`` partition stages (:meth:`Placement.open`)."""

    NAME = "partitions"
    STATE_KEYS = ("partitions", "ended", "turn", "carry")

    def __init__(self, ds: Composed) -> None:
        self.ds = ds
        self.runner: Placement = placement_class(ds.placement)(ds.make, ds.k, ds.options)
        self._decided = False   # laid-out or compact partition batches: settled by the first request
        self.stages: list[PartitionStage | None] = [None] * ds.k   # opened at their first ask
        self.states: list[State | None] = [None] * ds.k  # each partition's state after its last batch taken
        self.given = False   # a step was composed (from this stream's start or the state restored)
        self.ended = [False] * ds.k
        self.turn = 0                       # the partition asked next
        self.carry: list[list[Any]] = []   # [p, state before the batch, rows used]
        self._carried: list[Batch | CompactBatch] = []    # those batches
        self._pads = _Pads(ds)
        self._start: State | None = None
        self._out = False   # a batch was taken since the start or the last restore
        self._all = False   # every partition opened and started

    def _settle(self, compact: bool) -> None:
        """At the first request: compact partition batches if it asks for them and the factory can
        (the placement, with no stage opened yet, is replaced by one over the compact factory)."""
        if self._decided:
            return
        self._decided = True
        compacted = getattr(self.ds.make, "compacted", None)
        if compact and compacted is not None:
            self.runner.close()
            self.runner = placement_class(self.ds.placement)(compacted(), self.ds.k, self.ds.options)
            self._carried = [self.runner.replay(p, before) for p, before, _ in self.carry]
        self.runner.eager = compact   # the service reads every step's state

    def _stage(self, p: int) -> PartitionStage:
        """Partition ``p``'s stage. The partition asked first makes step 1 alone (on few cores, K - 1
        more pipelines starting would slow it); at the next ask every other one starts, so none
        waits for its turn to start (a placement whose partitions start ``together``: all at the
        first ask). Placements and restores follow this one rule."""
        if (self._out or self.runner.together) and not self._all:
            self._all = True
            for q in range(self.ds.k):
                if not self.ended[q]:
                    self._open(q).start()
        return self._open(p)

    def _open(self, p: int) -> PartitionStage:
        stage = self.stages[p]
        if stage is None:
            state = self.states[p]
            stage = self.stages[p] = self.runner.open(p, None if state is None else materialize(state))
        return stage

    def _close_stages(self) -> None:
        for p, stage in enumerate(self.stages):
            self.stages[p] = None
            if stage is not None:
                stage.close()
        self._out = self._all = False

    def __next__(self) -> Batch:
        self._settle(False)
        batch = self._compose()
        return batch.expand() if isinstance(batch, CompactBatch) else batch

    def next_compact(self) -> Batch | CompactBatch:
        """:meth:`__next__`, compact where the partitions' batcher can (see the module docstring)."""
        self._settle(True)
        return self._compose()

    def _compose(self) -> Batch | CompactBatch:
        need = self.ds.batch_size
        parts: list[Batch | CompactBatch] = []
        rows = 0
        while rows < need:
            if not self.carry:
                if all(self.ended):
                    break
                whole = self._take_turn(need - rows)
                if whole is not None:
                    if not parts:  # the usual step: one partition's full batch, as it came
                        self.given = True
                        return whole
                    parts.append(whole)
                    rows = need
                continue
            entry, batch = self.carry[0], self._carried[0]
            used, n = entry[2], row_count(batch)
            m = min(n - used, need - rows)
            parts.append(take_rows(batch, used, used + m) if (used, m) != (0, n) else batch)
            rows += m
            if used + m == n:
                del self.carry[0], self._carried[0]
            else:
                entry[2] = used + m
        if not rows:
            if self.ds.k > 1 and not self.given:  # no partition ever gave a batch
                error = SourceError(f"the spec's sources delivered no record to any of its {self.ds.k} partitions: they "
                                    "are empty, or every record was rejected; check the path and format: of each "
                                    "source (with partitions: 1 the error names the rejections)")
                error.at_end = True  # type: ignore[attr-defined]
                raise error
            raise StopIteration
        self.given = True
        return join_rows(parts, self._pads)

    def _take_turn(self, need: int) -> Batch | CompactBatch | None:
        """The next batch of the partitions in turn (those ended skipped): returned when it has
        exactly the ``need`` rows the step still lacks, else carried (``None``)."""
        k = self.ds.k
        for _ in range(k):
            p = self.turn
            self.turn = (p + 1) % k
            if self.ended[p]:
                continue
            stage = self._stage(p)
            try:
                batch, state = next(stage)
            except StopIteration:
                self._out = True
                self._pads.warm()   # the tail is near: rows may be joined from now on
                self.ended[p], self.stages[p] = True, None
                end = stage.end_state if k > 1 else None   # K = 1: the plain pipeline's states
                stage.close()
                if end is not None:   # its rejections after its last batch (or with none) count too
                    self.states[p] = end
                continue
            self._out = True
            before, self.states[p] = self.states[p], state
            n = row_count(batch)
            if n == need:
                return batch
            self._pads.warm()
            if n:
                self.carry.append([p, before, 0])
                self._carried.append(batch)
            return None
        return None

    # ----------------------------------------------------------------- state
    def get_state(self) -> State:
        return materialize(self.snapshot())  # type: ignore[no-any-return]

    def snapshot(self) -> State:
        return self.own_state()

    def own_state(self) -> State:
        if self.ds.k == 1:  # one partition placed elsewhere: the pipeline's own state (see _start_state)
            return self.states[0] if self.states[0] is not None else self._start_state()
        return {"partitions": list(self.states), "ended": list(self.ended), "turn": self.turn,
                "carry": [list(c) for c in self.carry]}

    def _start_state(self) -> State:
        """The pipeline's state before its first batch (one partition), as a plain loader's reads."""
        if self._start is None:
            it = iter(self.ds.make(0))
            try:
                self._start = materialize(it.get_state())
            finally:
                it.close()
        return self._start

    def restore(self, own: Mapping[str, Any]) -> None:
        states, k = own["partitions"], self.ds.k
        if not isinstance(states, list) or len(states) != k:
            n = len(states) if isinstance(states, list) else "no"
            raise StateError(f"partitions: this state holds {n} partition states but the spec has partitions: {k}; "
                             f"another number of partitions is another stream: resume with partitions: {n}")
        ended = [bool(e) for e in own["ended"]]
        carry = [[int(p), before, int(used)] for p, before, used in own["carry"]]
        turn = int(own["turn"])
        if len(ended) != k or not 0 <= turn < k or any(not 0 <= c[0] < k for c in carry):
            raise StateError(f"partitions: malformed state (ended {own['ended']!r:.60}, turn {turn}, carry partitions "
                             f"{[c[0] for c in carry]}) for partitions: {k}")
        self._close_stages()   # each reopened from its state at its first ask
        self.states, self.ended, self.turn = list(states), ended, turn
        self.given = any(s is not None for s in states)
        self.carry = carry
        self._carried = [self.runner.replay(p, before) for p, before, _ in carry]

    def set_state(self, state: Mapping[str, Any]) -> None:
        if self.ds.k == 1:  # the pipeline's own state: its one partition starts there (a step holds no carry)
            self._close_stages()
            self.states, self.ended, self.carry, self._carried = [dict(state)], [False], [], []
            return
        refuse_row_dealt(state)
        self.restore({k: state[k] for k in self.STATE_KEYS})

    def release(self) -> None:
        self._close_stages()
        self.runner.close()


class CompactBatches(Dataset[Batch | CompactBatch]):
    """A partition's batches, compact where its batcher can (``next_compact``), with the same states."""

    def __init__(self, inner: Dataset[Batch]) -> None:
        self.inner = inner

    def __iter__(self) -> _CompactIterator:
        return _CompactIterator(iter(self.inner))


class _CompactIterator(DatasetIterator[Batch | CompactBatch]):
    """The batcher's iterator, stepped with ``next_compact``; its state is the batcher's own."""

    def __init__(self, it: DatasetIterator[Batch]) -> None:
        self.parent = it
        self._next = getattr(it, "next_compact", it.__next__)

    def __next__(self) -> Batch | CompactBatch:
        return self._next()  # type: ignore[no-any-return]

    def get_state(self) -> State:
        return self.parent.get_state()

    def snapshot(self) -> State:
        return self.parent.snapshot()

    def set_state(self, state: Mapping[str, Any]) -> None:
        self.parent.set_state(state)
