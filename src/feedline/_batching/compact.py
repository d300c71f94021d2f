"""A packed batch in compact form: its rows' pieces, before they are laid out.

Laying packed rows out (:func:`~feedline._batching.rows.collate_flat`) turns the real tokens of a
batch into six fixed-shape arrays: at 16 rows of 1024, ~16 K real tokens become ~270 KB of
``input_ids``, ``labels``, ``position_ids``, ``attention_mask``, ``seq_lens`` and ``cu_seqlens``
(16 MB with a block mask), and the layout takes ~0.3 ms of the thread that builds the batch. A
:class:`CompactBatch` is the step before: the pieces per row, each piece's length, each token
field's tokens end to end, and the layout options. :meth:`CompactBatch.expand` lays it out,
bit-identical to what the ``pack`` batcher yields in-process.

The loader service sends compact batches and its clients expand them (:mod:`feedline._service.protocol`):
the server's producer thread, which bounds what a server delivers, skips the layout, and the
wire carries the real tokens only::

    >>> b = CompactBatch(np.array([2, 1]), np.array([3, 2, 4]), {"input_ids": np.arange(9, dtype=np.int32)},
    ...                  max_length=6, max_docs=3, pad_values={"input_ids": 0})
    >>> len(b), b.row_tokens().tolist()
    (2, [5, 4])
    >>> b.expand()["seq_lens"].tolist()
    [[3, 2, 0], [4, 0, 0]]
    >>> b.take(np.array([1])).expand()["input_ids"].tolist()
    [[5, 6, 7, 8, 0, 0]]

On the wire (:meth:`CompactBatch.arrays` and :meth:`CompactBatch.layout`; rebuilt and checked by
:meth:`CompactBatch.from_wire`) fields that share one array in the batch (``labels`` and
``input_ids`` in causal LM) are sent once.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, TypeGuard

import numpy as np

from feedline._batching.base import Batch, int_dtype
from feedline._batching.rows import Attention, collate_flat
from feedline._core.block import exclusive_cumsum, gather_spans, spans
from feedline.errors import FeedlineError, ProtocolError

__all__ = ["MAX_FIELDS", "BatchLimits", "CompactBatch", "id_field"]

_ATTENTION = ("padding", "block_diagonal", "block_causal")
_VALUES = "values/"   # wire array names of the token fields: "values/input_ids"
#: The most fields a wire batch may list, plain or compact (the service's protocol checks the same
#: bound): a receiver refuses more before it reads any.
MAX_FIELDS = 64


@dataclass(frozen=True, slots=True)
class BatchLimits:
    """The most a wire batch may hold, as its receiver knows its stream (``None``: not known).

    Args:
        rows: rows per batch (a stream's global ``batch_size``: a rank's slice has no more).
        max_length: tokens per row, where the batching strategy fixes it (``pack``, ``concat``,
            ``pad_to: max_length``).
        max_docs: documents per packed row (``max_docs_per_row``).
        max_bytes: the byte budget of one batch laid out (a client's ``max_message``: a compact
            batch never lays out to more than a laid-out message could carry).
    """

    rows: int | None = None
    max_length: int | None = None
    max_docs: int | None = None
    max_bytes: int = 1 << 30


@dataclass(frozen=True, slots=True)
class CompactBatch:
    """Rows of pieces before layout; see the module docstring.

    Args:
        docs: pieces per row (int64 ``[rows]``).
        lengths: tokens per piece, row after row (int64 ``[pieces]``).
        values: per token field, every piece's tokens end to end (``[sum(lengths), ...]``);
            fields may share one array.
        max_length, max_docs, pad_values, mask_first, attention: as :func:`~.rows.collate_flat` takes them.
    """

    docs: np.ndarray
    lengths: np.ndarray
    values: Mapping[str, np.ndarray]
    max_length: int
    max_docs: int
    pad_values: Mapping[str, Any]
    mask_first: bool = True
    attention: Attention = "padding"

    def __len__(self) -> int:
        return len(self.docs)

    def row_tokens(self) -> np.ndarray:
        """Real tokens per row (what :func:`~.base.real_tokens` gives for the expanded batch)."""
        ends = np.cumsum(self.lengths)
        last = np.cumsum(self.docs)   # pieces up to and including each row
        out = np.zeros(len(self.docs), dtype=np.int64)
        has = last > 0
        out[has] = ends[last[has] - 1]
        return np.diff(out, prepend=0)

    def tokens(self) -> int:
        return int(self.lengths.sum())

    def expand(self) -> Batch:
        """The batch laid out, as the ``pack`` batcher yields it."""
        return collate_flat(self.docs, self.lengths, self.values, self.max_length, self.max_docs, self.pad_values,
                            mask_first=self.mask_first, attention=self.attention)

    def take(self, rows: np.ndarray) -> CompactBatch:
        """The batch of rows ``rows`` (in that order): what cutting the expanded batch's rows gives."""
        docs = self.docs[rows]
        pieces = spans(exclusive_cumsum(self.docs)[rows], docs)
        lengths = self.lengths[pieces]
        at = exclusive_cumsum(self.lengths)[pieces]
        taken: dict[int, np.ndarray] = {}   # fields sharing an array still share one
        values = {name: taken[id(v)] if id(v) in taken else taken.setdefault(id(v), gather_spans(v, at, lengths))
                  for name, v in self.values.items()}
        return CompactBatch(docs, lengths, values, self.max_length, self.max_docs, self.pad_values,
                            self.mask_first, self.attention)

    # ------------------------------------------------------------------ wire
    def arrays(self) -> dict[str, np.ndarray]:
        """The arrays to send: ``docs``, ``lengths`` and each distinct token array once."""
        out = {"docs": self.docs, "lengths": self.lengths}
        seen: set[int] = set()
        for name, v in self.values.items():
            if id(v) not in seen:
                seen.add(id(v))
                out[_VALUES + name] = v
        return out

    def layout(self) -> dict[str, Any]:
        """The options that travel with :meth:`arrays` (plain msgpack values)."""
        first: dict[int, str] = {}
        fields = [[name, first.setdefault(id(v), name)] for name, v in self.values.items()]
        pads = {name: _plain(self.pad_values.get(name, 0)) for name in self.values}
        return {"fields": fields, "pad": pads, "max_length": self.max_length, "max_docs": self.max_docs,
                "mask_first": self.mask_first, "attention": self.attention}

    @classmethod
    def from_wire(cls, layout: Any, arrays: Mapping[str, np.ndarray], limits: BatchLimits | None = None) -> CompactBatch:
        """Rebuild a batch from :meth:`layout` and :meth:`arrays` as received, checked before any
        allocation: the rows, row length and documents per row within the receiver's limits (what
        its stream's batches hold), every count in range (no sum can wrap), ids as integers, pads
        that their field's dtype holds, and the laid-out batch within ``max_bytes``.

        Raises:
            ProtocolError: options or arrays that do not describe such a batch, naming the field.
        """
        if not isinstance(layout, dict):
            raise ProtocolError("a compact batch's layout must be a map")
        limits = limits or BatchLimits()
        max_rows, max_length, max_docs, max_bytes = limits.rows, limits.max_length, limits.max_docs, limits.max_bytes
        length, docs_cap = layout.get("max_length"), layout.get("max_docs")
        attention, fields, pads = layout.get("attention"), layout.get("fields"), layout.get("pad")
        length = _layout_count("max_length", length, max_length)
        docs_cap = _layout_count("max_docs", docs_cap, max_docs)
        if not (attention in _ATTENTION and isinstance(layout.get("mask_first"), bool) and isinstance(pads, dict)
                and isinstance(fields, list) and 0 < len(fields) <= MAX_FIELDS):
            raise ProtocolError(f"malformed compact batch layout {layout!r:.200}")
        docs = _counts(arrays, "docs", 1 << 31 if max_rows is None else max_rows, docs_cap, "documents per row")
        n_pieces = int(docs.sum(dtype=np.int64))   # < 2^31 values of < 2^31: cannot wrap
        lengths = _counts(arrays, "lengths", n_pieces, length, "tokens per piece")
        if len(lengths) != n_pieces:
            raise ProtocolError(f"compact batch array 'lengths': {len(lengths)} pieces where 'docs' counts {n_pieces}")
        total = int(lengths.sum(dtype=np.int64))
        rows = len(docs)
        # what the laid-out batch holds: position_ids, seq_lens, cu_seqlens, the mask, the token fields
        size = 4 * rows * (length + 2 * docs_cap + 1) + rows * length * (4 if attention == "padding" else length)
        values: dict[str, np.ndarray] = {}
        for spec in fields:
            if not (isinstance(spec, list) and len(spec) == 2 and all(isinstance(s, str) for s in spec)):
                raise ProtocolError(f"malformed compact batch field {spec!r:.80}")
            name, source = spec
            v = arrays.get(_VALUES + source)
            if v is None or v.ndim < 1 or len(v) != total:
                raise ProtocolError(f"compact batch field {name!r}: no array of {total} tokens for it")
            if id_field(name) and v.dtype.kind not in "iu":
                raise ProtocolError(f"compact batch field {name!r}: dtype {v.dtype} where token ids must be integers")
            _check_pad(name, pads.get(name, 0), int_dtype(name, v))
            size += rows * length * math.prod(v.shape[1:]) * int_dtype(name, v).itemsize
            values[name] = v
        if size > max_bytes:
            raise ProtocolError(f"a compact batch of {rows} rows of {length} tokens ({attention}, {len(values)} fields) "
                                f"lays out to {size} bytes, above the {max_bytes}-byte budget (max_message)")
        extra = set(arrays) - {"docs", "lengths", *(_VALUES + s for _, s in fields)}
        if extra:
            raise ProtocolError(f"compact batch arrays {sorted(extra)[:5]} are not in its layout")
        return cls(docs, lengths, values, length, docs_cap, pads, layout["mask_first"], attention)

    def expand_checked(self) -> Batch:
        """:meth:`expand` with a layout failure (rows over ``max_docs`` or ``max_length``) as a ``ProtocolError``."""
        try:
            return self.expand()
        except (FeedlineError, ValueError, IndexError, TypeError, OverflowError) as e:
            raise ProtocolError(f"a compact batch that does not lay out: {e}") from None
        except MemoryError:
            raise ProtocolError(f"a compact batch of {len(self)} rows of {self.max_length} tokens does not fit in "
                                "memory") from None


def id_field(name: str) -> bool:
    """Whether a field holds token ids or counts, so must be an integer array (``labels`` may be
    float: a regression or multi-label target).

        >>> id_field("input_ids"), id_field("seq_lens"), id_field("labels")
        (True, True, False)
    """
    return name == "cu_seqlens" or name.endswith(("_ids", "_lens"))


def _layout_count(key: str, value: Any, cap: int | None) -> int:
    if not _count(value):
        raise ProtocolError(f"compact batch layout: {key} {value!r:.40} is not a count in [1, 2^31)")
    if cap is not None and value > cap:
        raise ProtocolError(f"compact batch layout: {key} {value} is above the stream's {cap}")
    return value


def _counts(arrays: Mapping[str, np.ndarray], name: str, most: int, high: int, what: str) -> np.ndarray:
    """Wire array ``name`` as int64: one dimension of at most ``most`` integers in ``[0, high]``."""
    a = arrays.get(name)
    if a is None or a.ndim != 1 or a.dtype.kind not in "iu":
        raise ProtocolError(f"compact batch array {name!r}: must be one dimension of integers")
    if len(a) > most:
        raise ProtocolError(f"compact batch array {name!r}: {len(a)} entries, at most {most} expected")
    if len(a) and (int(a.min()) < 0 or int(a.max()) > high):
        raise ProtocolError(f"compact batch array {name!r}: {what} {int(a.min())}..{int(a.max())} outside [0, {high}]")
    return a.astype(np.int64, copy=False)


def _check_pad(name: str, pad: Any, dtype: np.dtype[Any]) -> None:
    """A pad value ``dtype`` holds exactly: an integer in range for integers, a finite number for floats."""
    if dtype.kind in "iub":
        info = np.iinfo(dtype) if dtype.kind != "b" else None
        ok = isinstance(pad, int) and (info.min <= pad <= info.max if info else pad in (0, 1))
    else:
        ok = isinstance(pad, (int, float)) and math.isfinite(pad)
    if not ok:
        raise ProtocolError(f"compact batch field {name!r}: pad {pad!r:.40} is not a value of its dtype {dtype}")


def _count(x: Any) -> TypeGuard[int]:
    return isinstance(x, int) and not isinstance(x, bool) and 0 < x < 1 << 31


def _plain(x: Any) -> Any:
    """A pad value as msgpack carries it (a numpy scalar as its Python value)."""
    return x.item() if isinstance(x, np.generic) else x
