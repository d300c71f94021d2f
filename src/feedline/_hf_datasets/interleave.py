"""``feedline.interleave_datasets``: ``datasets.interleave_datasets`` for streams, row for row, with exact state.

The semantics are ``datasets``' (5.x):

- no ``probabilities``: the datasets in turn (0, 1, 2, 0, 1, ...); with them, dataset ``i`` is
  drawn with probability ``probabilities[i]`` from ``numpy.random.default_rng(seed)``, 1,000
  draws at a time (``rng.choice(n, size=1000, p=probabilities)``), so the choices equal
  ``datasets``' for the same seed.
- a dataset counts as exhausted as soon as its last row is returned (one row is looked ahead).
  ``first_exhausted`` stops at the next draw after the first exhaustion; ``all_exhausted``
  restarts exhausted datasets until every one has been exhausted once; and
  ``all_exhausted_without_replacement`` skips exhausted ones until all are.

State: ``{"drawn": n, "exhausted": [bool...], "sources": [state...]}``: the draws made, and each
dataset's state after the rows it returned (a restart's state once it restarted). Draws are
re-made from the seed on restore, so the state holds no generator. Keys carry the dataset's
index in the source field (``source * n + i`` for ``n`` datasets, so interleaves nest) so a
shuffle buffer above re-reads its rows.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from feedline._core.dataset import Dataset, DatasetIterator, State
from feedline._core.record import Key, Record
from feedline._hf_datasets.functions import rows_to_batch
from feedline.errors import SpecError, StateError

__all__ = ["STOPPING", "Interleave", "InterleaveRoot"]

STOPPING = ("first_exhausted", "all_exhausted", "all_exhausted_without_replacement")
_DRAWS = 1000  # datasets' random_batch_size


class Interleave(Dataset[Record]):
    """Rows of ``children`` interleaved as ``datasets.interleave_datasets`` does."""

    def __init__(self, children: Sequence[Dataset[Record]], *, probabilities: Sequence[float] | None, seed: int,
                 stopping: str, epoch: int = 0, columns: Sequence[str] | None = None, worker: int | None = None) -> None:
        if stopping not in STOPPING:
            raise SpecError(f"stopping_strategy: {stopping!r} is not one of {', '.join(STOPPING)}")
        if probabilities is not None and len(probabilities) != len(children):
            raise SpecError(f"probabilities: {len(probabilities)} given for {len(children)} datasets")
        self.children = list(children)
        self.probabilities = None if probabilities is None else [float(p) for p in probabilities]
        self.seed = seed
        self.stopping = stopping
        self.epoch = epoch
        self.columns = None if columns is None else list(columns)
        self.worker = worker

    def align(self, data: dict[str, Any]) -> dict[str, Any]:
        """A row with every dataset's columns (``None`` where its dataset lacks one), as ``datasets`` aligns them."""
        return data if self.columns is None else {c: data.get(c) for c in self.columns}

    def draws(self, start: int) -> Any:
        """The dataset index of every draw from ``start`` on (endless)."""
        n = len(self.children)
        if self.probabilities is None:
            i = start
            while True:
                yield i % n
                i += 1
        rng = np.random.default_rng(self.seed)
        if self.epoch:  # datasets' set_epoch: a generator seeded from the first one's draw, less the epoch
            rng = np.random.default_rng(int(rng.integers(0, 1 << 63)) - self.epoch)
        if self.worker is not None:  # in a DataLoader worker: datasets shifts the generator by the worker's id
            rng = np.random.default_rng(int(rng.integers(0, 1 << 63)) - self.worker)
        block = start // _DRAWS
        for _ in range(block):  # the draws before: re-made, not kept in the state
            rng.choice(n, size=_DRAWS, p=self.probabilities)
        offset = start - block * _DRAWS
        while True:
            for i in rng.choice(n, size=_DRAWS, p=self.probabilities)[offset:]:
                yield int(i)
            offset = 0

    def fetch(self, keys: Sequence[Key]) -> dict[Key, dict[str, Any]]:
        n = len(self.children)
        by_child: dict[int, list[Key]] = {}
        for k in keys:
            by_child.setdefault(k[0] % n, []).append((k[0] // n, k[1], k[2]))
        out: dict[Key, dict[str, Any]] = {}
        for c, ks in by_child.items():
            for (s, f, p), data in self.children[c].fetch(ks).items():
                out[(s * n + c, f, p)] = self.align(data)
        return out

    def __iter__(self) -> InterleaveIterator:
        return InterleaveIterator(self)


_END = object()


class InterleaveIterator(DatasetIterator[Record]):
    """Cursor over an :class:`Interleave`."""

    NAME = "interleave"
    STATE_KEYS = ("drawn", "exhausted", "sources")

    def __init__(self, ds: Interleave) -> None:
        self.ds = ds
        self.its: list[DatasetIterator[Record]] = [iter(c) for c in ds.children]
        self.states: list[State] = [it.get_state() for it in self.its]  # after the rows returned
        self.ahead: list[Any] = [None] * len(self.its)  # the looked-ahead row (None: not read yet)
        self.exhausted = [False] * len(self.its)
        self.drawn = 0
        self._draws = ds.draws(0)

    def _read(self, i: int) -> Any:
        return next(self.its[i], _END)

    def __next__(self) -> Record:
        ds = self.ds
        stop_all = ds.stopping != "first_exhausted"
        while True:
            if (all if stop_all else any)(self.exhausted):
                raise StopIteration
            i = next(self._draws)
            self.drawn += 1
            if self.exhausted[i] and ds.stopping == "all_exhausted_without_replacement":
                continue
            if self.ahead[i] is None:
                self.ahead[i] = self._read(i)
            result = self.ahead[i]
            self.states[i] = self.its[i].get_state()
            self.ahead[i] = self._read(i)
            if self.ahead[i] is _END:
                self.exhausted[i] = True
                if ds.stopping != "all_exhausted_without_replacement":
                    self.its[i].close()
                    self.its[i] = iter(ds.children[i])
                    self.states[i] = self.its[i].get_state()
                    self.ahead[i] = None
            if result is not _END:
                s, f, p = result.key
                return Record((s * len(self.its) + i, f, p), result.epoch, ds.align(result.data))

    def get_state(self) -> State:
        return {"drawn": self.drawn, "exhausted": list(self.exhausted), "sources": [dict(s) for s in self.states]}

    def set_state(self, state: Mapping[str, Any]) -> None:
        if len(state["sources"]) != len(self.its):
            raise StateError(f"interleave: the state has {len(state['sources'])} datasets, this one {len(self.its)}")
        self.drawn = int(state["drawn"])
        self.exhausted = [bool(x) for x in state["exhausted"]]
        self._draws = self.ds.draws(self.drawn)
        for i, st in enumerate(state["sources"]):
            self.its[i].set_state(st)
            self.states[i] = st
            self.ahead[i] = None

    def parents(self) -> tuple[DatasetIterator[Any], ...]:
        return tuple(self.its)


@dataclass(frozen=True)
class InterleaveRoot:
    """The root of ``interleave_datasets(children, ...)`` (children are ``feedline.IterableDataset``)."""

    children: tuple[Any, ...]
    probabilities: tuple[float, ...] | None
    seed: int
    stopping: str
    worker: int | None = None  # the DataLoader worker reading it (its draws are shifted, as datasets')
    builder = "interleave"

    @property
    def split(self) -> str:
        return str(self.children[0].split)

    def describe(self) -> str:
        parts = ", ".join(c.describe() for c in self.children)
        worker = "" if self.worker is None else f", worker={self.worker}"
        return (f"interleave([{parts}], probabilities={self.probabilities}, seed={self.seed}, "
                f"stopping={self.stopping}{worker})")

    def columns(self, epoch: int = 0) -> list[str]:
        """Every dataset's columns in order: its known ones, else those of its first 5 rows (as datasets)."""
        out: dict[str, None] = {}
        for c in self.children:
            names = c.column_names
            if names is None:
                it = iter(c.stage(epoch))
                try:
                    names = list(rows_to_batch([r.data for r in it.take(5)]))
                finally:
                    it.close()
            out.update(dict.fromkeys(names))
        return list(out)

    def stage(self, epoch: int) -> Interleave:
        return Interleave([c.stage(epoch) for c in self.children], probabilities=self.probabilities, seed=self.seed,
                          stopping=self.stopping, epoch=epoch, columns=self.columns(epoch), worker=self.worker)

    def shard(self, num_shards: int, index: int, contiguous: bool) -> InterleaveRoot:
        return InterleaveRoot(tuple(c.shard(num_shards, index, contiguous) for c in self.children), self.probabilities,
                              self.seed, self.stopping)

    def in_worker(self, index: int) -> InterleaveRoot:
        """This root as DataLoader worker ``index`` reads it (draws shifted by ``index``, as ``datasets``)."""
        return InterleaveRoot(self.children, self.probabilities, self.seed, self.stopping, worker=index)

    def keyed(self) -> bool:
        return all(c.keyed() for c in self.children)

    def n_shards(self) -> int:
        return min(int(c.n_shards) for c in self.children)
