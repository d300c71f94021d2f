"""Rejected-record accounting shared by every stage that can reject a record.

A :class:`Rejections` counts rejections by reason (the counts are part of the resume state),
logs the first few with file and line, and raises :class:`~feedline.errors.RecordError`
instead when the spec says ``on_error: raise``. A rejection that carries only a record key (from
a task) is located first with ``locate`` (key to file and line; only for the ones reported).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Mapping

from feedline.core.record import Key, Rejection
from feedline.errors import RecordError

__all__ = ["Rejections", "rejected_along"]

log = logging.getLogger("feedline")

_LOG_FIRST = 5


class Rejections:
    """Counts by reason; the first few of each reason are logged and kept as samples."""

    def __init__(self, on_error: str = "skip", locate: Callable[[Key], tuple[str, int | None]] | None = None) -> None:
        self.on_error = on_error
        self.locate = locate
        self.counts: dict[str, int] = {}
        self.samples: list[str] = []

    def add(self, rejection: Rejection) -> None:
        """Count one rejection, or raise it with ``on_error: raise``."""
        if self.on_error == "raise":
            rejection = self._located(rejection)
            raise RecordError(
                f"{rejection.describe()}; set on_error: skip to skip and count such records",
                path=rejection.path, line=rejection.line, reason=rejection.reason,
            )
        n = self.counts.get(rejection.reason, 0) + 1
        self.counts[rejection.reason] = n
        if n <= _LOG_FIRST:
            rejection = self._located(rejection)
            self.samples.append(rejection.describe())
            log.warning("skipped record: %s", rejection.describe())

    def _located(self, rejection: Rejection) -> Rejection:
        if rejection.key is None or self.locate is None:
            return rejection
        try:
            path, line = self.locate(rejection.key)
        except Exception:  # a report must never fail because the file moved: keep the key
            return rejection
        return dataclasses.replace(rejection, path=path, line=line)

    def get_state(self) -> dict[str, int]:
        return dict(self.counts)

    def set_state(self, counts: Mapping[str, int]) -> None:
        self.counts = {str(k): int(v) for k, v in counts.items()}

    @property
    def total(self) -> int:
        return sum(self.counts.values())



def rejected_along(it: object) -> dict[str, int]:
    """Sum the ``rejected`` counts of an iterator and of every parent below it (task and sources).

    Walks ``.parent`` links; each stage reports only its own rejections, so a task's summary
    alone misses the lines its sources skipped.
    """
    out: dict[str, int] = {}
    seen: set[int] = set()
    while it is not None and id(it) not in seen:
        seen.add(id(it))
        for reason, n in (getattr(it, "rejected", None) or {}).items():
            out[str(reason)] = out.get(str(reason), 0) + int(n)
        it = getattr(it, "parent", None)
    return dict(sorted(out.items()))
