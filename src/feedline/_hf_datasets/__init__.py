"""``feedline.load_dataset`` and ``feedline.interleave_datasets``: ``datasets``' streaming API, resumable exactly.

    load.py        load_dataset: builders, data files, split slicing; IterableDatasetDict
    dataset.py     IterableDataset: the recipe (a root and the methods called), iteration, state
    roots.py       FileRoot: one split's files through feedline's pipeline; shard
    builders.py    BuilderRoot: files read as datasets' builders read them, for options the readers lack
    interleave.py  interleave_datasets' stage and root (datasets' draws and stopping strategies)
    stages.py      RowOp (map, filter, column methods, batch) and Slice (take, skip)
    functions.py   what datasets' row methods do to rows
    features.py    features/column_names; JSON rows typed as datasets types them
    formats.py     with_format("numpy" | "torch")
    workers.py     torch DataLoader workers: each reads its share of the files, as datasets shares them
    to_loader.py   IterableDataset.to_loader: the recipe as a Loader spec; a missing text field refused
    calls.py       pickling: a dataset as its root and the method calls that built it
"""

from __future__ import annotations

import secrets
from collections.abc import Sequence
from typing import Any

from feedline._hf_datasets.dataset import IterableDataset
from feedline._hf_datasets.interleave import STOPPING, InterleaveRoot
from feedline._hf_datasets.load import IterableDatasetDict, load_dataset
from feedline.errors import SpecError

__all__ = ["IterableDataset", "IterableDatasetDict", "interleave_datasets", "load_dataset"]


def interleave_datasets(datasets: Sequence[IterableDataset], probabilities: Sequence[float] | None = None,
                        seed: int | None = None, stopping_strategy: str = "first_exhausted") -> IterableDataset:
    """``datasets.interleave_datasets`` for ``feedline.load_dataset`` streams, row for row.

    Without ``probabilities`` the datasets take turns; with them each row's dataset is drawn with
    ``numpy.random.default_rng(seed)`` as ``datasets`` draws it. ``stopping_strategy``:
    ``first_exhausted`` (stop when one runs out), ``all_exhausted`` (restart the exhausted ones
    until every one has run out once) or ``all_exhausted_without_replacement``. ``seed=None``
    picks a seed now (kept in the state, so a resume continues with it).
    """
    children = tuple(datasets)
    if not children:
        raise SpecError("interleave_datasets: give at least one dataset")
    for i, c in enumerate(children):
        if not isinstance(c, IterableDataset):
            raise SpecError(f"interleave_datasets: datasets[{i}] is a {type(c).__name__}, not a feedline.load_dataset "
                            "stream; load every dataset with feedline.load_dataset")
    if stopping_strategy not in STOPPING:
        raise SpecError(f"stopping_strategy: {stopping_strategy!r} is not one of {', '.join(STOPPING)}")
    _check_aligned(children)
    if probabilities is not None:
        if len(probabilities) != len(children):
            raise SpecError(f"probabilities: {len(probabilities)} given for {len(children)} datasets")
        if abs(sum(probabilities) - 1.0) > 1e-8 or any(p < 0 for p in probabilities):
            raise SpecError(f"probabilities: {list(probabilities)} must be >= 0 and sum to 1 (as numpy's choice needs)")
    root = InterleaveRoot(children, None if probabilities is None else tuple(float(p) for p in probabilities),
                          0 if probabilities is None else secrets.randbits(32) if seed is None else int(seed),
                          stopping_strategy)
    return IterableDataset(root)


def _check_aligned(children: Sequence[IterableDataset]) -> None:
    """Refuse, as ``datasets`` does, a column whose known type differs between the datasets (a string
    column interleaved with an integer one), rather than rows of mixed types in one column."""
    seen: dict[str, tuple[int, Any]] = {}
    for i, c in enumerate(children):
        try:
            features = c.features
        except ImportError:  # datasets absent: types unknown
            return
        for name, kind in (features or {}).items():
            if getattr(kind, "dtype", None) == "null":
                continue
            if name in seen and seen[name][1] != kind:
                j, other = seen[name]
                raise SpecError(f"interleave_datasets: column {name!r} is {other} in datasets[{j}] but {kind} in "
                                f"datasets[{i}]; the rows cannot be aligned (datasets refuses them too): cast one, "
                                f"e.g. .map(lambda r: {{{name!r}: str(r[{name!r}])}}, features=...), or rename it")
            seen.setdefault(name, (i, kind))
