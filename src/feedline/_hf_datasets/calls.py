"""How a ``feedline.load_dataset`` stream pickles: its root and the method calls that built it.

Ops hold local functions (the stages' builders), which do not pickle; the calls do when the
user's functions do, as with ``datasets``. :func:`recorded` keeps each method's call on the op it
adds; :func:`rebuilt` calls the methods again on the root (``IterableDataset.__reduce__``), so a
``DataLoader`` with ``multiprocessing_context="spawn"`` or ``"forkserver"`` (Python 3.14's
default on Linux) sends a dataset to its workers.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Sequence
from typing import Any, TypeVar, cast

__all__ = ["rebuilt", "recorded"]

F = TypeVar("F", bound=Callable[..., Any])


def recorded(method: F) -> F:
    """Keep the call that added an op, so a dataset pickles as its root and calls (see ``__reduce__``)."""
    @functools.wraps(method)
    def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
        out: Any = method(self, *args, **kwargs)
        if len(out.ops) == len(self.ops) + 1:
            call = (method.__name__, args, tuple(kwargs.items()))
            out.ops = (*out.ops[:-1], dataclasses.replace(out.ops[-1], call=call))
        return out

    return cast(F, wrapper)


def rebuilt(kind: type, root: Any, calls: Sequence[tuple[str, tuple[Any, ...], tuple[tuple[str, Any], ...]]],
            format: str | None, epoch: int, start: dict[str, Any] | None) -> Any:
    """A pickled dataset of class ``kind``: its root, the methods called again, its format, epoch and loaded state."""
    ds = kind(root, epoch=epoch)
    for name, args, kwargs in calls:
        ds = getattr(ds, name)(*args, **dict(kwargs))
    ds.format, ds._start = format, start
    return ds
