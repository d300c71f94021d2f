"""Rejected-record accounting shared by every stage that can reject a record.

A :class:`Rejections` counts rejections by reason (the counts are part of the resume state),
logs the first few with file and line, and raises :class:`~feedline.errors.RecordError`
instead when the spec says ``on_error: raise``.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

from feedline.core.record import Rejection
from feedline.errors import RecordError

__all__ = ["Rejections"]

log = logging.getLogger("feedline")

_LOG_FIRST = 5


class Rejections:
    """Counts by reason; the first few of each reason are logged and kept as samples."""

    def __init__(self, on_error: str = "skip") -> None:
        self.on_error = on_error
        self.counts: dict[str, int] = {}
        self.samples: list[str] = []

    def add(self, rejection: Rejection) -> None:
        """Count one rejection, or raise it with ``on_error: raise``."""
        if self.on_error == "raise":
            raise RecordError(
                f"{rejection.describe()}; set on_error: skip to skip and count such records",
                path=rejection.path, line=rejection.line, reason=rejection.reason,
            )
        n = self.counts.get(rejection.reason, 0) + 1
        self.counts[rejection.reason] = n
        if n <= _LOG_FIRST:
            self.samples.append(rejection.describe())
            log.warning("skipped record: %s", rejection.describe())

    def get_state(self) -> dict[str, int]:
        return dict(self.counts)

    def set_state(self, counts: Mapping[str, int]) -> None:
        self.counts = {str(k): int(v) for k, v in counts.items()}

    @property
    def total(self) -> int:
        return sum(self.counts.values())
