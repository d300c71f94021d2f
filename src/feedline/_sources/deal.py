"""Dealing a source's splits to ``K`` partitions, cutting finer where needed.

Every partition gets a near-equal share of every source. Where each split of a source has a known
extent that its reader can cut (byte ranges of plain line files, row ranges of Parquet and Arrow,
token ranges of flat files, document ranges of Megatron files), the splits are laid end to end and
cut at ``K`` equal points: partition ``p`` reads positions ``[p * T / K, (p + 1) * T / K)`` of the
``T`` in all, as pieces of the splits it covers (at most ``K - 1`` splits are cut, so a single
10 MB JSON Lines file feeds every partition). Where any split cannot be cut (a compressed stream,
a whole JSON document, a dataset read through ``datasets``), or the extents add up to nothing,
every split of the source is dealt whole, round robin in order (split ``i`` to partition
``i mod K``), so a source of fewer splits than ``K`` leaves some partitions without a share of it.

    >>> from feedline._sources.reader import Split
    >>> [[(s.start, s.end) for s in part] for part in deal([Split(0, "a", 0, 10)], [(0, 10)], 3)]
    [[(0, 3)], [(3, 6)], [(6, 10)]]
    >>> [[s.file for s in part] for part in deal([Split(i, "f") for i in range(5)], [None] * 5, 2)]
    [[0, 2, 4], [1, 3]]

The deal is a pure function of the splits and ``K``; positions inside a piece are the file's, so
record keys (and what a state names) mean the same as without partitions. Cut by size, the deal
moves when a file shrinks or grows: a partition's state names its share (:func:`fingerprint`), and
a resume on another share is refused (:func:`moved_share`) rather than repeating or losing records.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Sequence

from feedline._core.rng import mix64
from feedline._sources.reader import Split
from feedline.errors import SourceError

__all__ = ["deal", "fingerprint", "moved_share", "partition_seed"]

_SALT = 0x9A27


def partition_seed(seed: int, partition: int, partitions: int) -> int:
    """The seed of partition ``partition`` of ``partitions`` (the spec's seed when there is one)."""
    return seed if partitions == 1 else mix64(seed, _SALT, partition) >> 1


def deal(splits: Sequence[Split], extents: Sequence[tuple[int, int] | None], k: int) -> list[list[Split]]:
    """The splits of each of ``k`` partitions (see the module docstring); ``extents[i]`` is the
    ``[start, end)`` that split ``i`` may be cut in, or ``None`` when it cannot be cut."""
    if k == 1:
        return [list(splits)]
    known = [e for e in extents if e is not None]
    if splits and len(known) == len(splits):
        total = sum(b - a for a, b in known)
        if total > 0:
            return _cut(splits, known, k, total)
    return [list(splits[p::k]) for p in range(k)]


def _cut(splits: Sequence[Split], extents: Sequence[tuple[int, int]], k: int, total: int) -> list[list[Split]]:
    out: list[list[Split]] = [[] for _ in range(k)]
    bounds = [p * total // k for p in range(k + 1)]
    offset = 0
    for sp, (a, b) in zip(splits, extents, strict=True):
        lo, hi = offset, offset + (b - a)
        for p in range(k):
            s, e = max(lo, bounds[p]), min(hi, bounds[p + 1])
            if s < e:
                out[p].append(sp if (s, e) == (lo, hi) and (sp.start, sp.end) == (a, b)
                              else dataclasses.replace(sp, start=a + s - lo, end=a + e - lo))
        offset = hi
    return out


def fingerprint(share: Sequence[Split]) -> str:
    """A short fingerprint of a partition's share: its pieces' files and ranges (not paths: a
    ``root:`` moved elsewhere is the same share; not sizes: a whole file dealt round robin resumes
    where it was, as with one partition)."""
    return hashlib.blake2b(repr([(sp.file, sp.start, sp.end) for sp in share]).encode(), digest_size=8).hexdigest()


def moved_share(label: str, partition: int, k: int) -> SourceError:
    """The error of a partition resumed on another share than its state was read from."""
    return SourceError(
        f"source {label!r}: partition {partition} of {k} cannot resume: its files changed since the state was saved "
        "(one shrank, grew, or was added or removed), so the share of them the state was read from is cut elsewhere "
        "now and records would repeat or be lost. Restore the files as they were, or start over without the state "
        "(with partitions: 1 a changed file resumes where it was)")
