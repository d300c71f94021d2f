"""Record transforms: the spec's ``map`` and ``filter`` steps, after mixing and before the shuffle buffer.

    sources ─► Mixture ─► Transform (map / filter, in spec order) ─► ShuffleBuffer ─► TaskMap

Each step is a pure function of the record's dict: ``map`` returns the new dict, ``filter``
returns whether to keep it. Keys pass through unchanged, so a resume stays exact: the shuffle
buffer's keys are re-read through :meth:`Transform.fetch`, which runs the maps again, and a
filtered record is simply skipped again when its source is replayed.

Why here: after mixing, a filter sees each record once whatever the source; before the shuffle
buffer, the buffer holds only kept records (its size is what the user set) and the maps run
once per record read, not once per buffer restore.

State: ``{"parent": ..., "rejected": {"filtered": n}}``, ``n`` the records dropped by filters so
far: carried like rejections (a task map counts them as it reads them), reported apart by
``Loader.stats()["filtered"]`` (they are not rejections).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from feedline._core.callables import resolve
from feedline._core.dataset import Dataset, DatasetIterator, State
from feedline._core.record import Key, Record
from feedline._core.report import FILTERED
from feedline._spec.sections import TransformSpec
from feedline.errors import StateError, TransformError

__all__ = ["Step", "Transform"]

Step = tuple[str, Callable[[dict[str, Any]], Any], str]  # (kind, function, name for messages)


def steps_of(specs: Sequence[TransformSpec]) -> list[Step]:
    """Resolve the spec's transforms (import paths imported, callables kept)."""
    out: list[Step] = []
    for i, t in enumerate(specs):
        fn = resolve(t.fn, f"transforms[{i}].{t.kind}") if isinstance(t.fn, str) else t.fn
        out.append((t.kind, fn, f"transforms[{i}] ({t.kind} {t.name})"))
    return out


class Transform(Dataset[Record]):
    """Run ``steps`` on each record of ``parent``; a record a filter refuses is dropped and counted.

    Args:
        parent: the records (a mixture).
        steps: ``(kind, function, name)`` triples, see :func:`steps_of`.
        locate: ``key -> (file, line)`` for error messages (the mixture's ``locate``).
    """

    def __init__(self, parent: Dataset[Record], steps: Sequence[Step], *,
                 locate: Callable[[Key], tuple[str, int | None]] | None = None) -> None:
        self.parent = parent
        self.steps = list(steps)
        self.locate = locate

    def apply(self, key: Key, data: dict[str, Any]) -> dict[str, Any] | None:
        """The record after every step, or ``None`` when a filter drops it."""
        for kind, fn, name in self.steps:
            try:
                out = fn(data)
            except Exception as e:
                self._fail(key, f"{name} raised {type(e).__name__}: {e}", e)
            except (SystemExit, KeyboardInterrupt) as e:  # user code's: no Ctrl-C lands off the main thread
                if isinstance(e, KeyboardInterrupt) and threading.current_thread() is threading.main_thread():
                    raise
                self._fail(key, f"{name} raised {type(e).__name__}({e}) (a transform raises an exception; it never "
                                "exits the process)", e)
            if kind == "filter":
                if not out:
                    return None
            elif isinstance(out, Mapping):
                data = out if isinstance(out, dict) else dict(out)
            else:
                self._fail(key, f"{name} returned {type(out).__name__}, not a dict (a map returns the whole new record)")
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
            if done is None:
                raise StateError(f"record {tuple(k)} is now filtered out; the data or a transform changed since the "
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

    def __next__(self) -> Record:
        while True:
            rec = next(self.parent)
            data = self.ds.apply(rec.key, rec.data)
            if data is not None:
                return Record(rec.key, rec.epoch, data)
            self.filtered += 1

    def take(self, n: int) -> list[Record]:
        """``n`` kept records, read from the parent many at a time (never past the ``n``-th kept one)."""
        out: list[Record] = []
        while len(out) < n:
            want = n - len(out)
            recs = self.parent.take(want)
            for rec in recs:
                data = self.ds.apply(rec.key, rec.data)
                if data is None:
                    self.filtered += 1
                else:
                    out.append(Record(rec.key, rec.epoch, data))
            if len(recs) < want:
                break
        return out

    def own_state(self) -> State:
        return {"rejected": {FILTERED: self.filtered} if self.filtered else {}}

    def restore(self, own: Mapping[str, Any]) -> None:
        self.filtered = int(own["rejected"].get(FILTERED, 0))

