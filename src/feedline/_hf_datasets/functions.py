"""What ``datasets``' row methods do to rows, as plain functions (the stages in ``stages.py`` run them).

    >>> apply_map = map_rows(lambda r: {"n": len(r["text"])}, remove_columns=("text",))
    >>> apply_map([{"text": "abc", "id": 1}], 0)
    [{'id': 1, 'n': 3}]

Semantics follow ``datasets.IterableDataset`` (5.x): ``map`` merges the function's dict into the
row after dropping ``remove_columns``; ``batched`` hands over a dict of columns (a column missing
from some rows is ``None`` there) and splits the result back into rows, whose count may change;
``with_indices`` passes the row's index in the stream the method sees; ``input_columns`` passes
those columns instead of the row; ``filter`` keeps rows whose predicate is true (a list of bools
when batched).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from feedline._core.callables import name_of
from feedline.errors import SpecError

__all__ = ["columns_op", "filter_rows", "map_rows", "rows_to_batch"]

Rows = list[dict[str, Any]]
RowsFn = Callable[[Rows, int], Rows]  # (rows, index of the first) -> rows


def rows_to_batch(rows: Sequence[Mapping[str, Any]]) -> dict[str, list[Any]]:
    """Rows to columns: every key seen (in order of first appearance), ``None`` where a row lacks it."""
    names: dict[str, None] = {}
    for r in rows:
        names.update(dict.fromkeys(r))
    return {k: [r.get(k) for r in rows] for k in names}


def _batch_to_rows(batch: Mapping[str, Sequence[Any]]) -> Rows:
    if not batch:
        return []
    n = len(next(iter(batch.values())))
    return [{k: v[i] for k, v in batch.items()} for i in range(n)]


def _args(data: Any, input_columns: tuple[str, ...] | None, index: Any, with_indices: bool) -> list[Any]:
    args = [data] if input_columns is None else [data[c] for c in input_columns]
    if with_indices:
        args.append(index)
    return args


def _named(fn: Callable[..., Any], qualname: str) -> Callable[..., Any]:
    fn.__qualname__ = qualname  # what a spec or a fingerprint hashes (name_of)
    return fn


def _desc(kind: str, function: Any, **options: Any) -> str:
    shown = ", ".join(f"{k}={v!r}" for k, v in options.items() if v not in (None, False, (), {}))
    return f"{kind}({name_of(function)}{', ' + shown if shown else ''})"


def map_rows(function: Callable[..., Any] | None, *, with_indices: bool = False,
             input_columns: tuple[str, ...] | None = None, batched: bool = False,
             remove_columns: tuple[str, ...] = (), fn_kwargs: Mapping[str, Any] | None = None) -> RowsFn:
    """The rows ``IterableDataset.map`` makes of ``rows`` (one row, or one batch when ``batched``)."""
    fn: Callable[..., Any] = function if function is not None else (lambda *a, **k: {})
    kwargs = dict(fn_kwargs or {})

    def apply(rows: Rows, first: int) -> Rows:
        if not batched:
            out = []
            for i, row in enumerate(rows):
                given = dict(row)
                got = fn(*_args(given, input_columns, first + i, with_indices), **kwargs)
                if not isinstance(got, Mapping):
                    raise TypeError(f"map: {name_of(fn)} returned {type(got).__name__}; return a dict of new or "
                                    "changed columns (as datasets requires)")
                if got is given:  # changed in place and returned: the removed columns go too
                    got = {k: v for k, v in given.items() if k not in remove_columns}
                kept = {k: v for k, v in row.items() if k not in remove_columns}
                out.append({**kept, **got})
            return out
        batch = rows_to_batch(rows)
        got = fn(*_args(batch, input_columns, list(range(first, first + len(rows))), with_indices), **kwargs)
        if not isinstance(got, Mapping):
            raise TypeError(f"map: {name_of(fn)} returned {type(got).__name__}; a batched function returns a dict "
                            "of columns (lists of equal length)")
        got = dict(got)
        lengths = {k: len(v) for k, v in got.items()}
        kept = {k: v for k, v in batch.items() if k not in remove_columns}
        if got and len(set(lengths.values())) > 1:
            raise ValueError(f"map: {name_of(fn)} returned columns of different lengths {lengths}")
        n = next(iter(lengths.values()), len(rows))
        bad = sorted(k for k in kept if k not in got and n != len(rows))
        if bad:
            raise ValueError(f"map: {name_of(fn)} returned {n} rows for a batch of {len(rows)}, so the input columns "
                             f"{bad} no longer line up; drop them with remove_columns={bad} (as datasets requires)")
        return _batch_to_rows({**kept, **got})

    desc = _desc("map", fn, with_indices=with_indices, input_columns=input_columns, batched=batched,
                 remove_columns=remove_columns, fn_kwargs=kwargs)
    return _named(apply, desc)


def filter_rows(function: Callable[..., Any] | None, *, with_indices: bool = False,
                input_columns: tuple[str, ...] | None = None, batched: bool = False,
                fn_kwargs: Mapping[str, Any] | None = None) -> RowsFn:
    """The rows ``IterableDataset.filter`` keeps of ``rows``."""
    fn: Callable[..., Any] = function if function is not None else (lambda *a, **k: True)
    kwargs = dict(fn_kwargs or {})

    def apply(rows: Rows, first: int) -> Rows:
        if not batched:
            return [row for i, row in enumerate(rows) if fn(*_args(row, input_columns, first + i, with_indices), **kwargs)]
        mask = list(fn(*_args(rows_to_batch(rows), input_columns, list(range(first, first + len(rows))), with_indices),
                       **kwargs))
        if len(mask) != len(rows):
            raise ValueError(f"filter: {name_of(fn)} returned {len(mask)} values for a batch of {len(rows)} rows")
        return [row for row, keep in zip(rows, mask) if keep]

    return _named(apply, _desc("filter", fn, with_indices=with_indices, input_columns=input_columns,
                               batched=batched, fn_kwargs=kwargs))


def columns_op(kind: str, names: Sequence[str] | Mapping[str, str], known: Sequence[str] | None) -> RowsFn:
    """``select_columns``, ``remove_columns`` or ``rename_columns`` on each row.

    ``known``: the columns when the features are known; a name outside them is refused at once
    (as ``datasets`` does), else when a row lacks it.
    """
    if kind == "rename":
        mapping = dict(names)  # type: ignore[arg-type]
        wanted = list(mapping)
    else:
        wanted = [names] if isinstance(names, str) else list(names)  # type: ignore[list-item]
    if known is not None and kind != "remove":
        missing = [c for c in wanted if c not in known]
        if missing:
            raise SpecError(f"{kind}_columns: column(s) {missing} not in the dataset; its columns are {list(known)}")

    def apply(rows: Rows, first: int) -> Rows:
        out = []
        for row in rows:
            missing = [c for c in wanted if c not in row] if kind != "remove" else []
            if missing:
                raise SpecError(f"{kind}_columns: column(s) {missing} not in this row; its columns are {list(row)}")
            if kind == "select":
                out.append({c: row[c] for c in wanted})
            elif kind == "remove":
                out.append({k: v for k, v in row.items() if k not in wanted})
            else:
                out.append({mapping.get(k, k): v for k, v in row.items()})
        return out

    return _named(apply, f"{kind}_columns({wanted if kind != 'rename' else mapping!r})")
