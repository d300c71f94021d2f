"""Counter-based randomness: every random choice is a pure function of its coordinates.

Nothing random in feedline depends on history, so a resume needs no RNG state and the output
does not depend on batch composition, prefetch depth or thread count::

    >>> g = sample_rng(1234, 0, (0, 3, 1024))       # seed, epoch, record key
    >>> float(g.random()) == float(sample_rng(1234, 0, (0, 3, 1024)).random())
    True
    >>> 0.0 <= uniform(1234, 7, 42) < 1.0
    True
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

__all__ = ["mix64", "permutation", "sample_rng", "uniform"]

_MASK = (1 << 64) - 1


def mix64(*values: int) -> int:
    """Hash integers to a 64-bit integer (splitmix64 finaliser chained over the values)."""
    h = 0x9E3779B97F4A7C15
    for v in values:
        h = (h ^ (v & _MASK)) & _MASK
        h = (h + 0x9E3779B97F4A7C15) & _MASK
        z = h
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK
        h = z ^ (z >> 31)
    return h


def uniform(*values: int) -> float:
    """A uniform float in [0, 1) determined by the integers given."""
    return (mix64(*values) >> 11) * (1.0 / (1 << 53))


def sample_rng(seed: int, epoch: int, key: Sequence[int], sub: int = 0, stream: int = 0) -> np.random.Generator:
    """A Philox generator keyed by (seed, epoch, sample key, sub-example, stream)."""
    k = mix64(seed, epoch, *key, sub, stream)
    k2 = mix64(k, 0x5EED)
    return np.random.Generator(np.random.Philox(key=(k << 64) | k2))


def permutation(n: int, *values: int) -> list[int]:
    """A permutation of ``range(n)`` determined by the integers given."""
    g = np.random.Generator(np.random.Philox(key=mix64(*values)))
    return [int(i) for i in g.permutation(n)]
