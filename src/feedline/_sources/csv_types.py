"""Column types of CSV/TSV values as ``datasets``' csv builder infers them (``infer_types``).

``datasets`` reads a CSV file with pandas in chunks of :data:`CHUNK_ROWS` rows and turns each chunk
into Arrow on its own, so a column's type is decided per chunk, from the chunk's values:

- a missing value (a cell in :data:`NA_VALUES`, exactly as written: ``""``, ``NA``, ``null``,
  ``NaN``...; or a field the row lacks) is ``None`` whatever the type;
- every other value an integer (ASCII digits, an optional sign, spaces or tabs around): ``int``,
  or ``float`` when the chunk also has a missing value in that column;
- every other value a number (decimal point, exponent, ``inf``/``infinity`` in any case): ``float``;
- every other value ``true`` or ``false`` (any case, nothing around): ``bool``;
- no value at all: every cell ``None``; anything else: the strings as written.

    >>> kinds = ColumnKinds(3)
    >>> for row in (["1", "2.5", "True"], ["2", "NA", "false"]):
    ...     kinds.add(row)
    >>> [convert(v, k) for v, k in zip(["7", "NA", "FALSE"], kinds.kinds())]
    [7, None, False]
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

__all__ = ["CHUNK_ROWS", "NA_VALUES", "ColumnKinds", "convert", "pandas_names"]

#: Rows per chunk of ``datasets``' csv builder (its ``chunksize``): types are inferred per chunk.
CHUNK_ROWS = 10_000

#: The cells pandas reads as missing by default (``keep_default_na``), matched as written.
NA_VALUES = frozenset({"", "#N/A", "#N/A N/A", "#NA", "-1.#IND", "-1.#QNAN", "-NaN", "-nan", "1.#IND",
                       "1.#QNAN", "<NA>", "N/A", "NA", "NULL", "NaN", "None", "n/a", "nan", "null"})

_INT = re.compile(r"[ \t]*[+-]?[0-9]+[ \t]*")
_FLOAT = re.compile(r"[ \t]*[+-]?(?:(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?|inf(?:inity)?)[ \t]*",
                    re.IGNORECASE)
_BOOL = {"true": True, "false": False}


class ColumnKinds:
    """Accumulates the values of a chunk's columns; :meth:`kinds` names each column's type."""

    def __init__(self, width: int) -> None:
        self.ints = [True] * width
        self.floats = [True] * width
        self.bools = [True] * width
        self.values = [False] * width
        self.missing = [False] * width

    def add(self, row: Sequence[str | None]) -> None:
        """One row's cells (``None`` for a field the row lacks)."""
        for i, v in enumerate(row):
            if v is None or v in NA_VALUES:
                self.missing[i] = True
                continue
            self.values[i] = True
            if self.ints[i] and not _INT.fullmatch(v):
                self.ints[i] = False
            if self.floats[i] and not _FLOAT.fullmatch(v):
                self.floats[i] = False
            if self.bools[i] and v.lower() not in _BOOL:
                self.bools[i] = False

    def kinds(self) -> list[str]:
        """Per column: ``int``, ``float``, ``bool``, ``null`` (no value) or ``str``."""
        out = []
        for i in range(len(self.values)):
            if not self.values[i]:
                out.append("null")
            elif self.ints[i]:
                out.append("float" if self.missing[i] else "int")
            elif self.floats[i]:
                out.append("float")
            elif self.bools[i]:
                out.append("bool")
            else:
                out.append("str")
        return out


def convert(value: str | None, kind: str) -> Any:
    """A cell as a value of its column's ``kind`` (from :meth:`ColumnKinds.kinds`)."""
    if value is None or value in NA_VALUES:
        return None
    if kind == "int":
        return int(value)
    if kind == "float":
        return float(value)
    if kind == "bool":
        return _BOOL[value.lower()]
    return value


def pandas_names(header: Sequence[str]) -> list[str]:
    """Column names as pandas gives them: as written, ``Unnamed: i`` for an empty one, and
    ``name.1``, ``name.2``... for repeats.

        >>> pandas_names(["a", "", "a", " b "])
        ['a', 'Unnamed: 1', 'a.1', ' b ']
    """
    names = [h if h else f"Unnamed: {i}" for i, h in enumerate(header)]
    seen: dict[str, int] = {}
    taken = set(names)
    out = []
    for name in names:
        n = seen.get(name, 0)
        if n:
            new = f"{name}.{n}"
            while new in taken:
                n += 1
                new = f"{name}.{n}"
            taken.add(new)
            seen[name] = n + 1
            out.append(new)
        else:
            seen[name] = 1
            out.append(name)
    return out
