"""Progress bars for the long-running commands (tqdm on standard error, on a terminal only).

Library calls show nothing unless asked; the command line turns bars on when standard error is
a terminal (``--no-progress`` turns them off)::

    >>> configure(False)
    >>> with progress("export", unit="rows") as bar:
    ...     bar.update(3)                  # a no-op when disabled
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

__all__ = ["configure", "enabled", "progress", "track"]

_enabled = False


def configure(on: bool | None) -> None:
    """Show bars (``True``), hide them (``False``), or show them when stderr is a terminal (``None``)."""
    global _enabled
    _enabled = sys.stderr.isatty() if on is None else bool(on)


def enabled() -> bool:
    return _enabled


class _Off:
    n = 0

    def update(self, n: int = 1) -> None:
        pass

    def set_postfix_str(self, s: str) -> None:
        pass


@contextmanager
def progress(desc: str, *, unit: str = "records", total: int | None = None) -> Iterator[Any]:
    """A tqdm bar (or a silent stand-in) with ``update(n)``; closed on exit."""
    if not _enabled:
        yield _Off()
        return
    from tqdm import tqdm

    bar = tqdm(desc=desc, unit=" " + unit, total=total, file=sys.stderr, mininterval=0.5, dynamic_ncols=True,
               leave=False)
    try:
        yield bar
    finally:
        bar.close()


def track(iterable: Any, desc: str, *, unit: str = "records", total: int | None = None) -> Any:
    """``iterable`` itself when bars are off, else the same items through a tqdm bar."""
    if not _enabled:
        return iterable
    from tqdm import tqdm

    return tqdm(iterable, desc=desc, unit=" " + unit, total=total, file=sys.stderr, mininterval=0.5,
                dynamic_ncols=True, leave=False)
