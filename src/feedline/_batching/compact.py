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

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, TypeGuard

import numpy as np

from feedline._batching.base import Batch
from feedline._batching.rows import Attention, collate_flat
from feedline._core.block import exclusive_cumsum, gather_spans, spans
from feedline.errors import FeedlineError, ProtocolError

__all__ = ["CompactBatch"]

_ATTENTION = ("padding", "block_diagonal", "block_causal")
_VALUES = "values/"   # wire array names of the token fields: "values/input_ids"
#: The most cells (rows x max_length, times max_length with a block mask) a wire batch may expand
#: to: 16 G, above any batch a trainer can hold (256 rows of 8192 with a block mask), far below
#: what a corrupt header could ask for.
MAX_CELLS = 1 << 34


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
    def from_wire(cls, layout: Any, arrays: Mapping[str, np.ndarray]) -> CompactBatch:
        """Rebuild a batch from :meth:`layout` and :meth:`arrays` as received.

        Raises:
            ProtocolError: options or arrays that do not describe a batch.
        """
        if not isinstance(layout, dict):
            raise ProtocolError("a compact batch's layout must be a map")
        max_length, max_docs = layout.get("max_length"), layout.get("max_docs")
        attention, fields, pads = layout.get("attention"), layout.get("fields"), layout.get("pad")
        if not (_count(max_length) and _count(max_docs) and attention in _ATTENTION
                and isinstance(layout.get("mask_first"), bool) and isinstance(pads, dict)
                and isinstance(fields, list) and fields):
            raise ProtocolError(f"malformed compact batch layout {layout!r:.200}")
        docs, lengths = arrays.get("docs"), arrays.get("lengths")
        if docs is None or lengths is None or docs.ndim != 1 or lengths.ndim != 1 or docs.dtype.kind not in "iu" \
                or lengths.dtype.kind not in "iu" or int(docs.sum()) != len(lengths) \
                or (len(docs) and int(docs.min()) < 0) or (len(lengths) and int(lengths.min()) < 0):
            raise ProtocolError("a compact batch needs integer docs and lengths, one length per piece")
        cells = len(docs) * max_length * (1 if attention == "padding" else max_length)
        if cells > MAX_CELLS:
            raise ProtocolError(f"a compact batch of {len(docs)} rows of {max_length} exceeds {MAX_CELLS} cells")
        total = int(lengths.sum())
        values: dict[str, np.ndarray] = {}
        for spec in fields:
            if not (isinstance(spec, list) and len(spec) == 2 and all(isinstance(s, str) for s in spec)):
                raise ProtocolError(f"malformed compact batch field {spec!r:.80}")
            name, source = spec
            v = arrays.get(_VALUES + source)
            if v is None or v.ndim < 1 or len(v) != total or not isinstance(pads.get(name, 0), (int, float)):
                raise ProtocolError(f"compact batch field {name!r}: no {total} tokens (or no plain pad value) for it")
            values[name] = v
        extra = set(arrays) - {"docs", "lengths", *(_VALUES + s for _, s in fields)}
        if extra:
            raise ProtocolError(f"compact batch arrays {sorted(extra)[:5]} are not in its layout")
        return cls(docs.astype(np.int64, copy=False), lengths.astype(np.int64, copy=False), values, max_length,
                   max_docs, pads, layout["mask_first"], attention)

    def expand_checked(self) -> Batch:
        """:meth:`expand` with a layout failure (rows over ``max_docs`` or ``max_length``) as a ``ProtocolError``."""
        try:
            return self.expand()
        except (FeedlineError, ValueError, IndexError) as e:
            raise ProtocolError(f"a compact batch that does not lay out: {e}") from None


def _count(x: Any) -> TypeGuard[int]:
    return isinstance(x, int) and not isinstance(x, bool) and 0 < x < 1 << 31


def _plain(x: Any) -> Any:
    """A pad value as msgpack carries it (a numpy scalar as its Python value)."""
    return x.item() if isinstance(x, np.generic) else x
