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
from typing import Any

import numpy as np

__all__ = ["mix64", "mix64_array", "permutation", "philox_raw", "sample_generator", "sample_keys", "sample_rng", "uniform"]

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


# ------------------------------------------------------------------ many samples at once
_U64 = np.uint64


def _u64(v: int | np.ndarray, n: int) -> np.ndarray:
    if isinstance(v, np.ndarray):
        return v.astype(np.int64, copy=False).view(np.uint64) if v.dtype.kind == "i" else v.astype(np.uint64)
    return np.full(n, v & _MASK, dtype=np.uint64)


def mix64_array(n: int, *values: int | np.ndarray) -> np.ndarray:
    """:func:`mix64` of ``n`` tuples at once: each value is an int (the same for all) or an array of ``n``.

        >>> int(mix64_array(2, 7, np.array([1, 2]))[1]) == mix64(7, 2)
        True
    """
    h = np.full(n, 0x9E3779B97F4A7C15, dtype=np.uint64)
    c0, c1, c2 = _U64(0x9E3779B97F4A7C15), _U64(0xBF58476D1CE4E5B9), _U64(0x94D049BB133111EB)
    s30, s27, s31 = _U64(30), _U64(27), _U64(31)
    with np.errstate(over="ignore"):
        for v in values:
            h ^= _u64(v, n)
            h += c0
            z = (h ^ (h >> s30)) * c1
            z = (z ^ (z >> s27)) * c2
            h = z ^ (z >> s31)
    return h


def sample_keys(seed: int, epochs: np.ndarray, keys: np.ndarray, subs: np.ndarray, stream: int = 0) -> np.ndarray:
    """The Philox keys of :func:`sample_rng` for ``n`` samples at once, as an ``[n, 2]`` uint64 array (low, high words).

    ``keys`` is ``[n, 3]`` (source, file, position); ``epochs`` and ``subs`` are ``[n]``.

        >>> k = sample_keys(1234, np.array([0]), np.array([[0, 3, 1024]]), np.array([0]))
        >>> float(sample_generator(k[0]).random()) == float(sample_rng(1234, 0, (0, 3, 1024)).random())
        True
    """
    n = len(keys)
    keys = np.asarray(keys, dtype=np.int64).reshape(n, 3)
    hi = mix64_array(n, seed, np.asarray(epochs), keys[:, 0], keys[:, 1], keys[:, 2], np.asarray(subs), stream)
    lo = mix64_array(n, hi, 0x5EED)
    return np.stack([lo, hi], axis=1)


def sample_generator(key: np.ndarray) -> np.random.Generator:
    """The generator of one row of :func:`sample_keys` (the same as :func:`sample_rng`'s)."""
    return np.random.Generator(np.random.Philox(key=(int(key[1]) << 64) | int(key[0])))


def philox_raw(keys: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """The first ``counts[i]`` raw 64-bit outputs of each key's generator, concatenated.

    The same words :func:`sample_generator` would consume: ``random()`` turns one word ``w`` into
    ``(w >> 11) * 2**-53``; a 32-bit draw takes the low half of a fresh word, then its high half.
    One bit generator is re-keyed per row (building a Philox object per sample costs 5x more).
    """
    bg = np.random.Philox(key=0)
    zeros = np.zeros(4, dtype=np.uint64)
    state: dict[str, Any] = {"bit_generator": "Philox", "state": {"counter": zeros, "key": zeros[:2]},
                             "buffer": zeros, "buffer_pos": 4, "has_uint32": 0, "uinteger": 0}
    parts = []
    for key, c in zip(keys, counts.tolist(), strict=True):
        if c:
            state["state"]["key"] = key
            bg.state = state  # type: ignore[assignment]
            parts.append(bg.random_raw(c))
    return np.concatenate(parts) if parts else np.zeros(0, dtype=np.uint64)


def permutation(n: int, *values: int) -> list[int]:
    """A permutation of ``range(n)`` determined by the integers given."""
    g = np.random.Generator(np.random.Philox(key=mix64(*values)))
    return [int(i) for i in g.permutation(n)]
