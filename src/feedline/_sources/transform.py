"""Record transforms: the spec's ``map`` and ``filter`` steps, after mixing and before the shuffle buffer.

    sources ─► Mixture ─► Transform (map / filter, in spec order) ─► ShuffleBuffer ─► TaskMap

Each step is a pure function of the record's dict: ``map`` returns the new dict, ``filter``
returns whether to keep it. Keys pass through unchanged, so a resume stays exact: the shuffle
buffer's keys are re-read through :meth:`Transform.fetch`, which runs the maps again, and a
filtered record is simply skipped again when its source is replayed.

Why here: after mixing, a filter sees each record once whatever the source; before the shuffle
buffer, the buffer holds only kept records (its size is what the user set) and the maps run
once per record read, not once per buffer restore.

A map's record is checked as the source checked the record it was given (sources whose ``text:``
is set; the record had a text): its ``text`` must still be a str, else a :class:`TransformError`;
a text the map left blank is rejected as ``empty``, one over the source's ``max_record_bytes``
(UTF-8 bytes of the text) as ``too_large``, counted and reported (or raised with ``on_error:
raise``) exactly as the same record on disk would be. Every other wrong return or raise of a
step is a :class:`TransformError` naming the record's file:line, the step, and where its code is.

State: ``{"parent": ..., "rejected": {"filtered": n, reason: n}}``, ``n`` the records dropped by
filters so far: carried like rejections (a task map counts them as it reads them), reported apart
by ``Loader.stats()["filtered"]`` (they are not rejections); beside them the rejections above.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from feedline._core.callables import defined_at, raised_at, resolve
from feedline._core.dataset import Dataset, DatasetIterator, State
from feedline._core.record import Key, Record, Rejection
from feedline._core.report import FILTERED, Rejections
from feedline._spec.sections import TransformSpec
from feedline.errors import StateError, TransformError

__all__ = ["Step", "Transform"]

Step = tuple[str, Callable[[dict[str, Any]], Any], str]  # (kind, function, name for messages)


def steps_of(specs: Sequence[TransformSpec]) -> list[Step]:
    """Resolve the spec's transforms (import paths imported, callables kept); each is named with
    where its code is: ``transforms[0] (map pkg.mod:func, pkg/mod.py:12)``."""
    out: list[Step] = []
    for i, t in enumerate(specs):
        fn = resolve(t.fn, f"transforms[{i}].{t.kind}") if isinstance(t.fn, str) else t.fn
        at = defined_at(fn)
        out.append((t.kind, fn, f"transforms[{i}] ({t.kind} {t.name}{f', {at}' if at else ''})"))
    return out


class Transform(Dataset[Record]):
    """Run ``steps`` on each record of ``parent``; a record a filter refuses is dropped and counted.

    Args:
        parent: the records (a mixture).
        steps: ``(kind, function, name)`` triples, see :func:`steps_of`.
        locate: ``key -> (file, line)`` for error messages (the mixture's ``locate``).
        limits: per source (the key's first number), the ``max_record_bytes`` its records' text is
            checked against after the maps; ``None`` (or a source past the list): no text check.
        on_error: the spec's ``on_error`` for the records a map made ``empty`` or ``too_large``.
    """

    def __init__(self, parent: Dataset[Record], steps: Sequence[Step], *,
                 locate: Callable[[Key], tuple[str, int | None]] | None = None,
                 limits: Sequence[int | None] = (), on_error: str = "skip") -> None:
        self.parent = parent
        self.steps = list(steps)
        self.locate = locate
        self.limits = list(limits)
        self.on_error = on_error

    def apply(self, key: Key, data: dict[str, Any]) -> dict[str, Any] | Rejection | None:
        """The record after every step, ``None`` when a filter drops it, or the :class:`Rejection`
        of a text a map left empty or made too large."""
        limit = self.limits[key[0]] if 0 <= key[0] < len(self.limits) and isinstance(data.get("text"), str) else None
        mapped = ""
        for kind, fn, name in self.steps:
            try:
                out = fn(data)
            except Exception as e:
                at = raised_at(e, fn)
                self._fail(key, f"{name} raised {type(e).__name__}{f' at {at}' if at else ''}: {e}", e)
            except (SystemExit, KeyboardInterrupt) as e:  # user code's: a Ctrl-C lands only where it is heard
                if isinstance(e, KeyboardInterrupt) and _hears_ctrl_c():
                    raise
                at = raised_at(e, fn)
                self._fail(key, f"{name} raised {type(e).__name__}({e}){f' at {at}' if at else ''} (a transform "
                                "raises an exception; it never exits the process)", e)
            if kind == "filter":
                if not self._keeps(key, out, name):
                    return None
            elif isinstance(out, Mapping):
                data, mapped = out if isinstance(out, dict) else dict(out), name
            else:
                self._fail(key, f"{name} returned {type(out).__name__}, not a dict (a map returns the whole new record)")
        return self._checked(key, data, mapped, limit) if mapped and limit is not None else data

    def _keeps(self, key: Key, out: Any, name: str) -> bool:
        if isinstance(out, bool):
            return out
        try:
            return bool(out)
        except Exception as e:  # an array: "the truth value ... is ambiguous"
            return bool(self._fail(key, f"{name} returned {type(out).__name__}, which is neither true nor false "
                                        f"({type(e).__name__}: {e}); a filter returns True to keep the record", e))

    def _checked(self, key: Key, data: dict[str, Any], name: str, limit: int) -> dict[str, Any] | Rejection:
        """``data`` if its text passes the source's checks, else the rejection the source would give."""
        if "text" not in data:
            have = ", ".join(sorted(map(str, data))[:12]) or "no fields"
            self._fail(key, f"{name} returned a record without 'text' (it has: {have}); a map must keep the "
                            "text field the task reads")
        text = data["text"]
        if not isinstance(text, str):
            self._fail(key, f"{name} set 'text' to {type(text).__name__}, not a str")
        if not text.strip():
            return Rejection("", None, "empty", f"{name} left field 'text' empty", key=key)
        size = len(text) if text.isascii() else len(text.encode("utf-8", "surrogatepass"))
        if size > limit:
            return Rejection("", None, "too_large", f"{size:,} bytes of text after {name}, over max_record_bytes "
                                                    f"({limit:,}); raise the source's max_record_bytes to keep it", key=key)
        return data

    def _fail(self, key: Key, what: str, cause: BaseException | None = None) -> Any:
        path, line = self.locate(key) if self.locate is not None else (f"record {tuple(key)}", None)
        where = f"{path}:{line}" if line is not None else path
        raise TransformError(f"{where}: {what}; transforms must accept every record the sources give",
                             path=path, line=line) from cause

    def fetch(self, keys: Sequence[Key]) -> dict[Key, dict[str, Any]]:
        """Re-read records by key and transform them again (what the shuffle buffer restores from)."""
        out: dict[Key, dict[str, Any]] = {}
        for k, data in self.parent.fetch(keys).items():
            done = self.apply(k, data)
            if not isinstance(done, dict):
                now = "filtered out" if done is None else f"rejected ({done.reason})"
                raise StateError(f"record {tuple(k)} is now {now}; the data or a transform changed since the "
                                 "state was saved (transforms must be pure functions of the record)")
            out[k] = done
        return out

    def __iter__(self) -> TransformIterator:
        return TransformIterator(self)

    def __repr__(self) -> str:
        return f"Transform({', '.join(name for _, _, name in self.steps)})"


class TransformIterator(DatasetIterator[Record]):
    """Cursor over a :class:`Transform`."""

    NAME = "transform"
    STATE_KEYS = ("rejected",)

    def __init__(self, ds: Transform) -> None:
        self.ds = ds
        self.parent: DatasetIterator[Record] = iter(ds.parent)
        self.filtered = 0
        self.rejections = Rejections(ds.on_error, locate=ds.locate)

    def _kept(self, rec: Record) -> Record | None:
        data = self.ds.apply(rec.key, rec.data)
        if isinstance(data, dict):
            return Record(rec.key, rec.epoch, data)
        if data is None:
            self.filtered += 1
        else:
            self.rejections.add(data)
        return None

    def __next__(self) -> Record:
        while True:
            kept = self._kept(next(self.parent))
            if kept is not None:
                return kept

    def take(self, n: int) -> list[Record]:
        """``n`` kept records, read from the parent many at a time (never past the ``n``-th kept one)."""
        out: list[Record] = []
        while len(out) < n:
            want = n - len(out)
            recs = self.parent.take(want)
            for rec in recs:
                kept = self._kept(rec)
                if kept is not None:
                    out.append(kept)
            if len(recs) < want:
                break
        return out

    def own_state(self) -> State:
        return {"rejected": {**({FILTERED: self.filtered} if self.filtered else {}), **self.rejections.get_state()}}

    def restore(self, own: Mapping[str, Any]) -> None:
        counts = {str(k): int(v) for k, v in own["rejected"].items()}
        self.filtered = counts.pop(FILTERED, 0)
        self.rejections.set_state(counts)


def _hears_ctrl_c() -> bool:
    """Whether a ``KeyboardInterrupt`` here may be a Ctrl-C: on the main thread of a process that does
    not ignore SIGINT (a worker process ignores it and runs its partitions on its main thread)."""
    return threading.current_thread() is threading.main_thread() and signal.getsignal(signal.SIGINT) is not signal.SIG_IGN
