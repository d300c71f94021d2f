"""Public test helpers: exact-resume conformance and small corpora.

    >>> from feedline.testing import assert_resumes_exactly
    >>> assert_resumes_exactly(spec)                      # doctest: +SKIP

:func:`assert_resumes_exactly` runs the whole stream once, then restores a fresh loader from
the state saved at many points (the start, every ``every``-th step, each step where an epoch
changes, the last step) after a JSON round trip, and checks that every following batch is
bit-identical. Use it on custom tasks and batchers too.
"""

from __future__ import annotations

import json
import os
import random
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from feedline.loader import Loader
from feedline.spec import Spec

__all__ = ["assert_batches_equal", "assert_resumes_exactly", "collect", "make_corpus"]


def collect(loader: Iterable[Mapping[str, np.ndarray]], with_states: bool = False, limit: int | None = None) -> Any:
    """All batches of a loader (and the state after each, when asked)."""
    batches, states = [], []
    for b in loader:
        batches.append({k: np.array(v) for k, v in b.items()})
        if with_states:
            states.append(json.loads(json.dumps(loader.state_dict())))  # type: ignore[attr-defined]
        if limit is not None and len(batches) >= limit:
            break
    return (batches, states) if with_states else batches


def assert_batches_equal(a: Sequence[Mapping[str, np.ndarray]], b: Sequence[Mapping[str, np.ndarray]], where: str = "") -> None:
    """Assert two batch lists are identical: same length, fields, dtypes, shapes and values."""
    if len(a) != len(b):
        raise AssertionError(f"{where}: {len(a)} batches vs {len(b)}")
    for i, (x, y) in enumerate(zip(a, b, strict=True)):
        if sorted(x) != sorted(y):
            raise AssertionError(f"{where}: batch {i} fields {sorted(x)} vs {sorted(y)}")
        for k in x:
            u, v = np.asarray(x[k]), np.asarray(y[k])
            if u.dtype != v.dtype or u.shape != v.shape or not np.array_equal(u, v):
                raise AssertionError(f"{where}: batch {i} field {k!r} differs ({u.dtype}{u.shape} vs {v.dtype}{v.shape})")


def _epochs_in(state: Any) -> list[int]:
    found: list[int] = []
    if isinstance(state, Mapping):
        for k, v in state.items():
            if k == "epoch" and isinstance(v, int):
                found.append(v)
            else:
                found.extend(_epochs_in(v))
    elif isinstance(state, list):
        for v in state:
            found.extend(_epochs_in(v))
    return found


def assert_resumes_exactly(spec: Spec | Mapping[str, Any] | str, *, rank: int = 0, world_size: int = 1,
                           every: int | None = None, check: int = 3, limit: int | None = None) -> int:
    """Check that resuming from saved states reproduces the stream bit for bit.

    Args:
        spec: the spec to test.
        rank, world_size: the consumer to test.
        every: restore every ``every`` steps (default: about 8 points over the stream).
        check: batches compared after each restore (all remaining ones for the last points).
        limit: stop the reference run after this many batches.

    Returns:
        The number of restore points checked.
    """
    spec = Spec.load(spec)
    ref_loader = Loader(spec, rank, world_size)
    try:
        batches, states = collect(ref_loader, with_states=True, limit=limit)
    finally:
        ref_loader.close()
    n = len(batches)
    if n == 0:
        raise AssertionError("the spec yields no batches; nothing to check")
    every = every or max(1, n // 8)
    points = set(range(0, n, every)) | {n - 1}
    for i in range(1, n):
        if _epochs_in(states[i]) != _epochs_in(states[i - 1]):
            points |= {i, i + 1} - {n}
    for p in sorted(points):
        state = states[p - 1] if p > 0 else None
        loader = Loader(spec, rank, world_size, state=state)
        try:
            want = batches[p:p + check] if check else batches[p:]
            got = collect(loader, limit=len(want)) if want else collect(loader)
            assert_batches_equal(want, got, where=f"resume at step {p}")
        finally:
            loader.close()
    return len(points)


_WORDS = ("the of and to in is was for on that with as by at from his her an which were are this be had it "
          "river stone garden letter window morning music paper island winter engine forest market bridge "
          "quickly slowly under over between before after during without across against").split()


def make_corpus(directory: str | os.PathLike[str], *, files: int = 3, docs: int = 40, fmt: str = "jsonl",
                seed: int = 0, min_words: int = 5, max_words: int = 120) -> list[str]:
    """Write a small synthetic corpus (``jsonl`` or ``text``; ``.gz``/``.zst`` by suffix of ``fmt``).

    Returns the file paths. Documents are reproducible from ``seed``.
    """
    import gzip

    rng = random.Random(seed)
    os.makedirs(directory, exist_ok=True)
    base, _, codec = fmt.partition(".")
    paths = []
    for f in range(files):
        lines = []
        for d in range(docs):
            words = [rng.choice(_WORDS) for _ in range(rng.randint(min_words, max_words))]
            text = f"Document {f}-{d}: " + " ".join(words) + "."
            lines.append(json.dumps({"text": text, "id": f"{f}-{d}"}) if base == "jsonl" else text)
        data = ("\n".join(lines) + "\n").encode()
        path = os.path.join(directory, f"part-{f:03d}.{fmt}")
        if codec == "gz":
            data = gzip.compress(data, mtime=0)
        elif codec == "zst":
            import zstandard

            data = zstandard.ZstdCompressor().compress(data)
        with open(path, "wb") as fh:
            fh.write(data)
        paths.append(path)
    return paths
