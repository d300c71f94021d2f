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
from typing import Any

from feedline._core.record import TEXT_FIELD_ADVICE, Key, Rejection
from feedline.errors import RecordError

__all__ = ["FILTERED", "Rejections", "add_counts", "likely_fix", "nothing_delivered", "rejected_along", "sum_rejected"]

log = logging.getLogger("feedline")

#: The reason under which the spec's ``filter`` transforms count the records they drop. They ride
#: in the ``rejected`` tables so every stage carries them exactly like rejections (a task map
#: counts them the moment it reads them), but ``Loader.stats()`` reports them apart, as
#: ``filtered``: a filtered record is not a bad one.
FILTERED = "filtered"

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


def add_counts(into: dict[str, int], counts: Mapping[str, int], sign: int = 1) -> dict[str, int]:
    """Add (or with ``sign=-1`` subtract) ``counts`` into ``into``, dropping zeros; returns ``into``."""
    for reason, n in counts.items():
        v = into.get(reason, 0) + sign * n
        if v:
            into[reason] = v
        else:
            into.pop(reason, None)
    return into


def sum_rejected(state: Any, into: dict[str, int] | None = None) -> dict[str, int]:
    """Sum every ``"rejected": {reason: n}`` table of a nested pipeline state.

    Lists are entered only when they hold mappings (a shuffle buffer's key lists are skipped),
    so this is cheap enough to run once per task chunk.

        >>> sum_rejected({"rejected": {"empty": 1}, "parent": {"sources": [{"rejected": {"empty": 2}}]}})
        {'empty': 3}
    """
    out: dict[str, int] = {} if into is None else into
    if isinstance(state, Mapping):
        for k, v in state.items():
            if k == "rejected" and isinstance(v, Mapping):
                add_counts(out, {str(r): n for r, n in v.items() if isinstance(n, int)})
            elif isinstance(v, (Mapping, list)):
                sum_rejected(v, out)
    elif isinstance(state, list) and state and isinstance(state[0], Mapping):
        for v in state:
            sum_rejected(v, out)
    return out


# The most likely fix for a stream whose records are all rejected for one reason.
_FIXES = {
    "missing_field": "set the source's text: to the field holding the text (text: null keeps records whole, for chat data)",
    "not_string": "set the source's text: to a field holding a string",
    "not_object": "the records are not JSON objects; check the source's format:",
    "empty": "the text field is empty in these records; check the source's text: field",
    "bad_json": "the file is not JSON Lines; check the source's format: (text, csv, json...)",
    "bad_utf8": "the file is not UTF-8 text; check the source's format:",
    "bad_row": "the rows do not match the columns; check the source's delimiter:, header: and columns:",
    "missing_label": "set task.label: to the field holding the label",
    "unreadable": "check the source's path and permissions",
    FILTERED: "the spec's filter transforms dropped every record; check them (transforms:)",
}


def likely_fix(reason: str) -> str:
    """The most likely fix when records are rejected for ``reason`` ("" when there is none to say)."""
    return _FIXES.get(reason, "")


def nothing_delivered(where: str, counts: Mapping[str, int], samples: list[str], *, first: int | None = None,
                      fixes: Mapping[str, str] | None = None) -> str:
    """The message for a source (or task) that delivered nothing: counts, a sample and the likely fix
    (``fixes``: the caller's own, by reason, e.g. for a chat source whose ``text:`` rejects every record).

        >>> nothing_delivered("source 'a.jsonl'", {"missing_field": 3}, ["a.jsonl:1: missing_field (no field 'x')"])[:56]
        "source 'a.jsonl' delivered no record: every one of the 3"
    """
    total = sum(counts.values())
    if not total:
        return f"{where} delivered no record: none was read (empty files?); check the path and format: of each source"
    head = (f"the first {first} records were all rejected" if first is not None
            else f"every one of the {total} records read was rejected")
    reasons = ", ".join(f"{k}: {v}" for k, v in sorted(counts.items(), key=lambda kv: -kv[1]))
    top = max(counts, key=lambda k: counts[k])
    sample = next((s for s in samples if f": {top}" in s), samples[0] if samples else "")
    fix = _FIXES.get(top, "check the spec against the data (feedline scan shows what is read)")
    if fixes and top in fixes:
        fix, sample = fixes[top], sample.replace(TEXT_FIELD_ADVICE, "")
    off = " (reject_limit: 0 turns this early check off; a stream with no example at all is still an error)" \
        if first is not None else ""
    return f"{where} delivered no record: {head} ({reasons})" + (f"; e.g. {sample}" if sample else "") + f"; {fix}{off}"


def rejected_along(it: object) -> dict[str, int]:
    """The rejected counts as the nearest stage at or below ``it`` reports them (walking ``.parent``).

    A task map's ``rejected`` already sums its own and its sources' (the state's every table), so
    the first stage that reports any is the whole count.
    """
    seen: set[int] = set()
    while it is not None and id(it) not in seen:
        seen.add(id(it))
        found = getattr(it, "rejected", None)
        if found is not None:
            return dict(sorted((str(k), int(v)) for k, v in found.items()))
        it = getattr(it, "parent", None)
    return {}
