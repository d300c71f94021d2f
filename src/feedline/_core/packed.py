"""Integer tables in a state, packed: the keys of buffered records as a few base64 bytes instead of JSON lists.

A shuffle buffer of 10,000 records holds 10,000 ``[source, file, position, epoch]`` keys; as JSON
lists that is ~145 KB, produced for every batch. :func:`pack_ints` stores such a table column by
column, each column as offsets from its minimum in the narrowest unsigned type that holds them
(a constant column takes no bytes), compressed with zlib and base64-encoded: still plain JSON::

    >>> t = pack_ints([[0, 3, 1024, 0], [0, 3, 2048, 0]], width=4)
    >>> sorted(t)
    ['cols', 'data', 'packed', 'rows']
    >>> unpack_ints(t, 4).tolist()
    [[0, 3, 1024, 0], [0, 3, 2048, 0]]
    >>> unpack_ints([[0, 3, 1024, 0]], 4).tolist()      # the list form of older states still reads
    [[0, 3, 1024, 0]]

``{"packed": 1, "rows": n, "cols": [[minimum, bytes per value], ...], "data": base64}``; values
are signed 64-bit integers. :func:`pack_ragged` adds row lengths for lists of lists of refs
(a packer's rows of pieces).
"""

from __future__ import annotations

import base64
import zlib
from collections.abc import Sequence
from typing import Any

import numpy as np

from feedline.errors import StateError

__all__ = ["pack_ints", "pack_ragged", "pack_ragged_array", "unpack_ints", "unpack_ragged"]

PACKED_VERSION = 1
_WIDTHS = ((1, np.uint8), (2, np.uint16), (4, np.uint32), (8, np.uint64))


def pack_ints(table: np.ndarray | Sequence[Sequence[int]], width: int) -> dict[str, Any]:
    """Pack an ``[n, width]`` table of integers into a JSON-serialisable mapping."""
    arr = np.asarray(table, dtype=np.int64).reshape(-1, width)
    cols: list[list[int]] = []
    parts: list[bytes] = []
    for c in range(width):
        col = arr[:, c]
        lo = int(col.min()) if len(col) else 0
        span = int(col.max()) - lo if len(col) else 0
        size, dtype = next((s, d) for s, d in _WIDTHS if span < (1 << (8 * s)))
        if span == 0:
            size = 0  # a constant column is its minimum
        else:
            parts.append((col - lo).astype(dtype).tobytes())
        cols.append([lo, size])
    data = base64.b64encode(zlib.compress(b"".join(parts), 1)).decode("ascii") if parts else ""
    return {"packed": PACKED_VERSION, "rows": len(arr), "cols": cols, "data": data}


def unpack_ints(obj: Any, width: int, what: str = "state table") -> np.ndarray:
    """The ``[n, width]`` int64 table of :func:`pack_ints`, or of a list of ``width``-lists (older states).

    Raises:
        StateError: when ``obj`` is neither, or its bytes do not match its description.
    """
    if isinstance(obj, list):
        try:
            arr = np.asarray(obj, dtype=np.int64).reshape(len(obj), width) if obj else np.zeros((0, width), np.int64)
        except (TypeError, ValueError) as e:
            raise StateError(f"{what}: expected a list of {width}-integer lists ({e})") from e
        return arr
    if not isinstance(obj, dict) or obj.get("packed") != PACKED_VERSION:
        version = obj.get("packed") if isinstance(obj, dict) else None
        raise StateError(f"{what}: not a packed table of version {PACKED_VERSION} (got {type(obj).__name__}"
                         + (f" of version {version!r}" if version is not None else "") + "); resume with the feedline that saved it")
    try:
        n, cols = int(obj["rows"]), obj["cols"]
        raw = zlib.decompress(base64.b64decode(obj["data"])) if obj["data"] else b""
        if len(cols) != width:
            raise ValueError(f"{len(cols)} columns, expected {width}")
        out = np.empty((n, width), dtype=np.int64)
        at = 0
        for c, (lo, size) in enumerate(cols):
            if size == 0:
                out[:, c] = int(lo)
                continue
            dtype = dict(_WIDTHS)[int(size)]
            col = np.frombuffer(raw, dtype=dtype, count=n, offset=at)
            out[:, c] = col.astype(np.int64) + int(lo)
            at += n * int(size)
        if at != len(raw):
            raise ValueError(f"{len(raw)} bytes for {at} described")
    except (KeyError, TypeError, ValueError, zlib.error) as e:
        raise StateError(f"{what}: corrupt packed table ({e})") from e
    return out


def pack_ragged(rows: Sequence[Sequence[Sequence[int]]], width: int) -> dict[str, Any]:
    """Pack a list of rows of ``width``-integer refs (rows of different lengths).

    No rows pack to the same mapping shape (so a state's shape never changes with its contents).

        >>> unpack_ragged(pack_ragged([[[1, 2]], [[3, 4], [5, 6]]], 2), 2)
        [[[1, 2]], [[3, 4], [5, 6]]]
    """
    flat = [ref for row in rows for ref in row]
    refs = np.asarray(flat, dtype=np.int64).reshape(len(flat), width)
    return pack_ragged_array(np.fromiter((len(r) for r in rows), dtype=np.int64, count=len(rows)), refs)


def pack_ragged_array(lengths: np.ndarray, refs: np.ndarray) -> dict[str, Any]:
    """:func:`pack_ragged` of rows already laid out as ``lengths`` and ``[sum(lengths), width]`` refs."""
    return {"lengths": pack_ints(lengths.reshape(-1, 1), 1), "refs": pack_ints(refs, refs.shape[1])}


def unpack_ragged(obj: Any, width: int, what: str = "state rows") -> list[list[list[int]]]:
    """Rows of refs from :func:`pack_ragged`, or as the nested lists of older states."""
    if isinstance(obj, list):
        return obj
    if not isinstance(obj, dict) or "lengths" not in obj or "refs" not in obj:
        raise StateError(f"{what}: expected rows of refs (a list, or a packed mapping with lengths and refs)")
    lengths = unpack_ints(obj["lengths"], 1, what)[:, 0].tolist()
    refs = unpack_ints(obj["refs"], width, what).tolist()
    if sum(lengths) != len(refs) or min(lengths, default=0) < 0:
        raise StateError(f"{what}: row lengths add up to {sum(lengths)} but {len(refs)} refs are packed")
    out, at = [], 0
    for n in lengths:
        out.append(refs[at:at + n])
        at += n
    return out
