"""Weighted, seeded mixtures of sources, with per-source epochs and a stopping rule.

Step ``i`` draws a source with probability proportional to its weight among the sources still
active, using ``uniform(seed, salt, i)``, so the choice sequence needs no RNG state. Stopping
rules (``mix.stopping``):

- ``all_exhausted``: a source leaves the mixture when its epochs are done; the mixture ends
  when all have left. Every record is delivered once per epoch.
- ``first_exhausted``: the mixture ends as soon as any source is exhausted.
- ``cycle``: sources restart as needed so proportions follow the weights; the mixture ends when
  every source has completed its epochs at least once.
- ``concat``: the sources one after another, in spec order (weights are ignored): a list of
  files read as ``datasets`` reads ``data_files``.

State: ``{"step": i, "active": [bool...], "done": [bool...], "sources": [state...],
"counts": [records delivered per source]}``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from feedline._core.dataset import Dataset, DatasetIterator, State
from feedline._core.documents import join_records
from feedline._core.record import Key, Record
from feedline._core.rng import uniform
from feedline._sources.source import FileSource, FileSourceIterator
from feedline.errors import StateError

__all__ = ["Mixture"]

_SALT = 0x4D1C


class Mixture(Dataset[Record]):
    """Interleave several :class:`FileSource` by weight; one source passes straight through."""

    def __init__(self, sources: Sequence[FileSource], weights: Sequence[float], *, seed: int,
                 stopping: str = "all_exhausted", epochs: int | None = 1) -> None:
        self.sources = list(sources)
        self.weights = [float(w) for w in weights]
        self.seed = seed
        self.stopping = stopping
        self.epochs = epochs

    def fetch(self, keys: Sequence[Key]) -> dict[Key, dict[str, Any]]:
        """Re-read records by key from their sources."""
        out: dict[Key, dict[str, Any]] = {}
        by_src: dict[int, list[Key]] = {}
        for k in keys:
            by_src.setdefault(k[0], []).append(k)
        for s, ks in by_src.items():
            out.update(self.sources[s].fetch(ks))
        return out

    def locate(self, key: Key) -> tuple[str, int | None]:
        """The file and 1-based line (or row) of the record ``key`` (scans that file; for reports)."""
        source = self.sources[key[0]]
        if hasattr(source, "locate"):
            return source.locate(key)  # type: ignore[no-any-return]
        return f"source {key[0]} record {tuple(key)}", None

    def __iter__(self) -> MixtureIterator:
        return MixtureIterator(self)


class MixtureIterator(DatasetIterator[Record]):
    """Cursor over a :class:`Mixture`; its parents are the sources' iterators (states under ``sources``)."""

    NAME = "mixture"
    STATE_KEYS = ("step", "active", "done", "counts", "sources")

    def __init__(self, mix: Mixture) -> None:
        self.mix = mix
        # List every source and tell its format now: a wrong path or an unknown extension fails
        # before the other sources are read for minutes.
        _readers = [source.reader for source in mix.sources]
        self.its: list[FileSourceIterator] = [iter(s) for s in mix.sources]
        n = len(self.its)
        self.step = 0
        self.active = [True] * n
        self.done = [False] * n
        self.counts = [0] * n

    def _pick(self) -> int:
        if self.mix.stopping == "concat":
            return self.active.index(True)
        total = sum(w for w, a in zip(self.mix.weights, self.active, strict=True) if a)
        u = uniform(self.mix.seed, _SALT, self.step) * total
        last = 0
        for i, (w, a) in enumerate(zip(self.mix.weights, self.active, strict=True)):
            if a:
                last = i
                u -= w
                if u < 0:
                    return i
        return last

    def __next__(self) -> Record:
        while True:
            if not any(self.active):
                raise StopIteration
            i = self._pick() if len(self.its) > 1 else 0
            self.step += 1
            rec = next(self.its[i], None)
            if rec is not None:
                if self.mix.stopping == "cycle" and self.mix.epochs is not None and rec.epoch >= self.mix.epochs:
                    self.done[i] = True
                    if all(self.done):
                        raise StopIteration
                self.counts[i] += 1
                return rec
            # Source i is exhausted (in cycle mode sources are endless, so it was empty).
            if self.mix.stopping == "first_exhausted":
                self.active = [False] * len(self.active)
                raise StopIteration
            self.active[i] = False

    def take(self, n: int) -> Sequence[Record]:
        """One source (outside ``cycle``) passes its records straight through: many at a time."""
        if self.mix.stopping == "concat" and any(self.active):
            i = self.active.index(True)
            out = self.its[i].take(n)
            self.step += len(out)
            self.counts[i] += len(out)
            if len(out) < n:  # source i is exhausted; the next source continues the chunk
                self.step += 1
                self.active[i] = False
                return join_records([out, self.take(n - len(out))])
            return out
        if len(self.its) > 1 or self.mix.stopping == "cycle" or not self.active[0]:
            return super().take(n)
        out = self.its[0].take(n)
        self.step += len(out)
        self.counts[0] += len(out)
        if len(out) < n:  # the source is exhausted: as next() finds it
            self.step += 1
            self.active[0] = False
        return out

    def chunk_plan(self, most: int, budget: int) -> int | None:
        """One source passed straight through: its own plan (see :meth:`take`)."""
        if len(self.its) > 1 or self.mix.stopping == "cycle" or not self.active[0]:
            return None
        return self.its[0].chunk_plan(most, budget)

    def run_sizes(self, most: int) -> Any:
        """One source passed straight through: the sizes of its current run's next records."""
        if len(self.its) > 1 or self.mix.stopping == "cycle" or not self.active[0]:
            return None
        return self.its[0].run_sizes(most)

    def run_states(self, counts: Sequence[int]) -> list[State]:
        """The states after taking each of ``counts`` records (within what :meth:`run_sizes` gave)."""
        flags = {"active": list(self.active), "done": list(self.done)}
        return [{"step": self.step + k, **flags, "counts": [self.counts[0] + k], "sources": [s]}
                for k, s in zip(counts, self.its[0].run_states(counts), strict=True)]

    def get_state(self) -> State:
        return {"step": self.step, "active": list(self.active), "done": list(self.done),
                "counts": list(self.counts), "sources": [it.get_state() for it in self.its]}

    def set_state(self, state: Mapping[str, Any]) -> None:
        if len(state["sources"]) != len(self.its):
            raise StateError(f"mixture: state has {len(state['sources'])} sources, the spec has {len(self.its)}")
        self.step = int(state["step"])
        self.active = [bool(a) for a in state["active"]]
        self.done = [bool(a) for a in state["done"]]
        self.counts = [int(c) for c in state["counts"]]
        for it, st in zip(self.its, state["sources"], strict=True):
            it.set_state(st)

    def parents(self) -> tuple[DatasetIterator[Any], ...]:
        return tuple(self.its)

    @property
    def proportions(self) -> list[float]:
        """The realised share of records delivered from each source so far."""
        total = sum(self.counts)
        return [c / total if total else 0.0 for c in self.counts]

    @property
    def rejected(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for it in self.its:
            for k, v in it.rejections.counts.items():
                out[k] = out.get(k, 0) + v
        return out

