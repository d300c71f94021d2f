"""``with_format("numpy" | "torch")``: rows as ``datasets``' formatters give them (read from files).

    >>> formatter("numpy")({"ids": [1, 2], "label": 3, "text": "hi"})
    {'ids': array([1, 2]), 'label': np.int64(3), 'text': np.str_('hi')}

``torch``: numbers become tensors (integers ``int64``, floats ``float32``, booleans ``bool``),
rectangular lists of numbers one tensor, ragged ones a list of tensors; strings and lists of
strings stay Python. ``numpy``: top-level scalars become numpy scalars (``int64``, ``float64``,
``str_``; a boolean a 0-d array), lists arrays (integers ``int64``, floats ``float32``; strings,
ragged lists and dicts ``object`` arrays), and scalars inside dicts 0-d arrays.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from feedline.errors import SpecError

__all__ = ["FORMATS", "formatter"]

FORMATS = ("numpy", "np", "torch", "pt", "python")

Row = dict[str, Any]


def _np_value(v: Any, top: bool) -> Any:
    if v is None or isinstance(v, (str, bytes)):
        return np.str_(v) if top and isinstance(v, str) else v
    if isinstance(v, Mapping):
        return {k: _np_value(x, False) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        items = [_np_value(x, False) for x in v]
        if items and all(isinstance(x, np.ndarray) and x.dtype != object and x.shape == items[0].shape
                         and x.dtype == items[0].dtype for x in items):
            return np.stack(items)
        out = np.empty(len(items), dtype=object)
        out[:] = items
        return out
    if top and isinstance(v, bool):
        return np.asarray(v)
    if top and isinstance(v, int):
        return np.int64(v)
    if top and isinstance(v, float):
        return np.float64(v)
    arr = np.asarray(v)
    if np.issubdtype(arr.dtype, np.floating):
        arr = arr.astype(np.float32)
    elif np.issubdtype(arr.dtype, np.integer):
        arr = arr.astype(np.int64)
    return arr


def _to_numpy(row: Mapping[str, Any]) -> Row:
    out: Row = {}
    for k, v in row.items():
        if isinstance(v, (list, tuple)) and v and all(isinstance(x, (str, type(None))) for x in v):
            arr = np.empty(len(v), dtype=object)
            arr[:] = list(v)
            out[k] = arr
        elif isinstance(v, (list, tuple)) and v and all(isinstance(x, Mapping) for x in v):
            arr = np.empty(len(v), dtype=object)
            arr[:] = [_np_value(x, False) for x in v]
            out[k] = arr
        elif isinstance(v, (list, tuple)) and not v:
            out[k] = np.asarray([], dtype=np.int64)
        else:
            out[k] = _np_value(v, True)
    return out


def _torch_value(v: Any, torch: Any) -> Any:
    if v is None or isinstance(v, (str, bytes)):
        return v
    if isinstance(v, Mapping):
        return {k: _torch_value(x, torch) for k, x in v.items()}
    if isinstance(v, bool):
        return torch.tensor(v)
    if isinstance(v, int):
        return torch.tensor(v, dtype=torch.int64)
    if isinstance(v, float):
        return torch.tensor(v, dtype=torch.float32)
    if isinstance(v, (list, tuple)):
        items = [_torch_value(x, torch) for x in v]
        if not items:
            return torch.tensor([], dtype=torch.int64)
        if all(isinstance(x, torch.Tensor) and x.shape == items[0].shape and x.dtype == items[0].dtype for x in items):
            return torch.stack(items)
        return items
    return v


def formatter(kind: str | None) -> Callable[[Row], Any]:
    """The row converter of a format (``None``/``python``: rows as they are)."""
    if kind in (None, "python"):
        return lambda row: row
    if kind in ("numpy", "np"):
        return _to_numpy
    if kind in ("torch", "pt"):
        from feedline._core.optional import require

        torch = require("torch", "torch")
        return lambda row: {k: _torch_value(v, torch) for k, v in row.items()}
    raise SpecError(f"with_format({kind!r}): feedline formats rows as 'numpy', 'torch' or python (None); for "
                    "other formats convert the numpy rows yourself")
