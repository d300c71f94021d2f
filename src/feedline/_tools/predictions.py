"""Pair a model's predictions with the records they were made for (after an ``infer`` run).

    >>> rows = join_predictions(spec, np.concatenate(keys), np.concatenate(preds))   # doctest: +SKIP
    >>> rows[0]                                                                       # doctest: +SKIP
    {'key': (0, 0, 0), 'record': {'text': ...}, 'prediction': ...}

Records are re-read by key through the spec's sources, so no text travels in the batches.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from feedline._core.record import Key
from feedline._pipeline import Pipeline

__all__ = ["join_predictions"]


def join_predictions(spec: Any, keys: np.ndarray | Sequence[Sequence[int]], preds: Sequence[Any] | np.ndarray) -> list[dict[str, Any]]:
    """Pair predictions with their records, re-read by key; rows with key ``-1`` (fill) are skipped.

    Returns one ``{"key", "record", "prediction"}`` dict per real row, in row order.
    """
    keys = np.asarray(keys, dtype=np.int64).reshape(-1, 3)
    if len(keys) != len(preds):
        raise ValueError(f"join_predictions: {len(keys)} keys but {len(preds)} predictions")
    real = [i for i in range(len(keys)) if keys[i, 0] >= 0]
    wanted: list[Key] = [tuple(int(x) for x in keys[i]) for i in real]  # type: ignore[misc]
    found = Pipeline(spec).fetch(wanted)
    return [{"key": k, "record": found[k], "prediction": preds[i]} for i, k in zip(real, wanted, strict=True)]
