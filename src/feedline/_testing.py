"""The test helpers behind :mod:`feedline.testing` (exact-resume conformance, small corpora)."""

from __future__ import annotations

import dataclasses
import json
import os
import random
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from feedline._core.deferred import Deferred, materialize
from feedline._loader import Loader
from feedline._spec import Spec
from feedline._state import epochs_in

__all__ = ["assert_batches_equal", "assert_resumes_exactly", "assert_stage_resumes", "collect", "make_corpus", "same_shape", "state_shape"]


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


def assert_resumes_exactly(spec: Spec | Mapping[str, Any] | str, *, rank: int = 0, world_size: int = 1,
                           every: int | None = None, check: int = 3, limit: int | None = None) -> int:
    """Check that resuming from saved states reproduces the stream bit for bit.

    The reference run prefetches as the spec says; each restored loader but the last makes its
    batches in the caller's thread (``prefetch=0``: only the batches it compares).

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
        if epochs_in(states[i]) != epochs_in(states[i - 1]):
            points |= {i, i + 1} - {n}
    last = max(points)
    for p in sorted(points):
        state = states[p - 1] if p > 0 else None
        # batches made in the caller's thread, as many as compared (a prefetching loader makes up to
        # ``prefetch`` more); the last point keeps the spec's prefetch, so a restore under it is checked too
        loader = Loader(spec, rank, world_size, state=state, prefetch=None if p == last else 0)
        try:
            want = batches[p:p + check] if check else batches[p:]
            got = collect(loader, limit=len(want)) if want else collect(loader)
            assert_batches_equal(want, got, where=f"resume at step {p}")
        finally:
            loader.close()
    return len(points)


def state_shape(state: Any) -> Any:
    """The structure of a state: its mapping keys, recursively.

    Lists (buffers, per-source lists) and mappings of numbers (counters keyed by reason) are
    leaves whose size may change; scalars are leaves whose value may change; ``None`` (an
    optional field not set yet) is ``"null"``, which matches any leaf (see :func:`same_shape`).

        >>> state_shape({"step": 3, "parent": {"pos": None, "rejected": {"bad_json": 2}}, "buffer": [1, 2]})
        {'buffer': 'list', 'parent': {'pos': 'null', 'rejected': 'counts'}, 'step': '*'}
    """
    if state is None:
        return "null"
    if isinstance(state, Mapping):
        if all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in state.values()):
            return "counts"
        return {k: state_shape(state[k]) for k in sorted(state)}
    if isinstance(state, (list, tuple)):
        return "list"
    return "*"


def same_shape(a: Any, b: Any) -> bool:
    """Whether two :func:`state_shape` results agree (``"null"`` matches any leaf).

        >>> same_shape({"carry": "null"}, {"carry": "list"}), same_shape({"a": "*"}, {"b": "*"})
        (True, False)
    """
    if isinstance(a, dict) or isinstance(b, dict):
        return isinstance(a, dict) and isinstance(b, dict) and a.keys() == b.keys() and all(same_shape(a[k], b[k]) for k in a)
    return a == b or "null" in (a, b)


def _same(a: Any, b: Any) -> bool:
    """Deep equality that understands numpy arrays (dtype, shape, values), dataclasses and
    snapshots (a :class:`~feedline._core.deferred.Deferred` part compares as its value)."""
    if type(a) is Deferred or type(b) is Deferred:
        return _same(materialize(a), materialize(b))
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        u, v = np.asarray(a), np.asarray(b)
        return u.dtype == v.dtype and u.shape == v.shape and bool(np.array_equal(u, v))
    if dataclasses.is_dataclass(a) and not isinstance(a, type):
        return type(a) is type(b) and all(_same(getattr(a, f.name), getattr(b, f.name)) for f in dataclasses.fields(a))
    if isinstance(a, Mapping):
        return isinstance(b, Mapping) and sorted(a) == sorted(b) and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return isinstance(b, (list, tuple)) and len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return bool(a == b)


def _json(state: Any) -> Any:
    return json.loads(json.dumps(state))


def assert_stage_resumes(stage: Any, *, max_steps: int | None = None, check: int = 4, every: int = 1) -> int:
    """Check that a stage restored from any of its states continues exactly.

    Runs ``iter(stage)`` once (to the end, or ``max_steps`` elements) recording the JSON
    round-tripped state before the first element and after each one, then, for the initial
    state, every ``every``-th step and the last one (so every epoch edge when ``every`` is 1):

    - a fresh iterator given the state returns it unchanged from ``get_state()``;
    - its next ``check`` elements, and the states after them, equal the reference run's; at the
      end of the stream it raises ``StopIteration``;
    - every state has the shape of the first (:func:`state_shape`).

    Args:
        stage: a recipe (``iter(stage)`` makes a fresh iterator) or a zero-argument factory of
            iterators (e.g. ``lambda: Prefetch(iter(ds), 2)``).
        max_steps: stop the reference run after this many elements (for endless stages).
        check: elements compared after each restore.
        every: restore at every ``every``-th step.

    Returns:
        The number of restore points checked.

    Raises:
        AssertionError: naming the step and what differed.
    """
    make: Callable[[], Any] = stage if callable(stage) and not hasattr(stage, "__iter__") else lambda: iter(stage)
    it = make()
    try:
        states = [_json(it.get_state())]
        elements: list[Any] = []
        ended = False
        while max_steps is None or len(elements) < max_steps:
            try:
                elements.append(next(it))
            except StopIteration:
                ended = True
                break
            states.append(_json(it.get_state()))
    finally:
        it.close()
    shape = state_shape(states[0])
    for i, st in enumerate(states):
        if not same_shape(state_shape(st), shape):
            raise AssertionError(f"the state's shape changed after step {i}: {state_shape(st)} vs {shape}")
    n = len(elements)
    points = sorted(set(range(0, n + 1, every)) | {n})
    for p in points:
        r = make()
        try:
            r.set_state(states[p])
            got = _json(r.get_state())
            if got != states[p]:
                raise AssertionError(f"get_state() after set_state(state at step {p}) differs: {got} vs {states[p]}")
            for i in range(p, min(n, p + check)):
                try:
                    el = next(r)
                except StopIteration:
                    raise AssertionError(f"restored at step {p}: the stream ended at step {i}, expected {n}") from None
                if not _same(el, elements[i]):
                    raise AssertionError(f"restored at step {p}: element {i} differs: {el!r} vs {elements[i]!r}")
                st = _json(r.get_state())
                if st != states[i + 1]:
                    raise AssertionError(f"restored at step {p}: state after element {i} differs: {st} vs {states[i + 1]}")
            if ended and p + check >= n:
                try:
                    extra = next(r)
                except StopIteration:
                    pass
                else:
                    raise AssertionError(f"restored at step {p}: an element after the end of the stream: {extra!r}")
        finally:
            r.close()
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
