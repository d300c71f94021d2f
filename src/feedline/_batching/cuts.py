"""Cutting a stream of documents into rows as arrays: the ``concat`` strategy without a loop per document.

Documents laid end to end and cut every ``max_length`` tokens (what ``concat`` does while no row
reaches ``max_docs_per_row`` and no document is empty) are a division: row ``r`` holds the stream's
tokens ``[r * T, (r + 1) * T)``, and each document is cut where a row boundary falls inside it.
:func:`cut_rows` computes every piece of ``rows`` such rows from the documents' lengths at once;
:class:`Pieces` collects the pieces of a batch (from several example blocks) and gathers their
tokens, one slice per block where they lie back to back::

    lengths 5 3 6, T 4:   stream  a a a a | a b b b | c c c c | c c
    rows 3:               pieces  (0, 0..4) | (0, 4..5) (1, 0..3) | (2, 0..4)   and (2, 4..6) is left
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from feedline._core.block import ExampleBlock, exclusive_cumsum, gather_spans

__all__ = ["Cut", "Pieces", "cut_rows"]


@dataclass(frozen=True, slots=True)
class Cut:
    """The pieces of ``rows`` full rows: document ``doc`` tokens ``[start, stop)``, per row ``docs`` pieces.

    ``used``: documents with a piece (the last one may continue: ``rest`` is where, or ``None``);
    ``split``: documents among them that a row boundary cuts before their end (their first piece
    does not finish them)."""

    rows: int
    docs: np.ndarray
    doc: np.ndarray
    start: np.ndarray
    stop: np.ndarray
    used: int
    rest: int | None
    split: np.ndarray


def cut_rows(ends: np.ndarray, rows: int, width: int, max_docs: int) -> Cut | None:
    """The first ``rows`` rows of ``width`` tokens over documents ending at ``ends`` (cumulative, the
    stream's token offsets), fewer where a row would hold more than ``max_docs`` pieces; ``None``
    when not even one row can be made (the stream is shorter than a row, or the first row is over
    the cap)."""
    rows = min(rows, int(ends[-1]) // width) if len(ends) else 0
    while rows > 0:
        last = int(np.searchsorted(ends, rows * width, side="left"))   # the document holding the last token
        e = ends[:last + 1]
        s = np.empty_like(e)
        s[0] = 0
        s[1:] = e[:-1]
        r0 = s // width
        r1 = (np.minimum(e, rows * width) - 1) // width
        n = r1 - r0 + 1
        doc = np.repeat(np.arange(len(e)), n)
        row = r0[doc] + (np.arange(len(doc)) - np.repeat(exclusive_cumsum(n), n))
        docs = np.bincount(row, minlength=rows)
        over = np.flatnonzero(docs > max_docs)
        if over.size:
            rows = int(over[0])
            continue
        lo = np.maximum(s[doc], row * width)
        hi = np.minimum(e[doc], (row + 1) * width)
        rest = rows * width - int(s[-1]) if int(e[-1]) > rows * width else None
        return Cut(rows, docs, doc, lo - s[doc], hi - s[doc], len(e), rest, e > (r0 + 1) * width)
    return None


class Pieces:
    """The pieces of one batch, in order, added one at a time or as arrays; :meth:`layout` gives
    their lengths and each field's tokens end to end. Pieces of blocks sharing their fields (views
    of one chunk) are kept together: their tokens are one slice where they lie back to back."""

    __slots__ = ("segs",)

    def __init__(self) -> None:
        # (the blocks' fields, where each run of pieces starts in them, their lengths)
        self.segs: list[tuple[dict[str, np.ndarray], list[np.ndarray], list[np.ndarray]]] = []

    def add(self, block: ExampleBlock, i: int, start: int, stop: int) -> None:
        """Tokens ``[start, stop)`` of example ``i`` of ``block``."""
        self.add_many(block, np.array([i]), np.array([start]), np.array([stop]))

    def add_many(self, block: ExampleBlock, i: np.ndarray, start: np.ndarray, stop: np.ndarray) -> None:
        at, n = block.starts[i] + start, stop - start
        if self.segs and self.segs[-1][0] is block.fields:
            self.segs[-1][1].append(at)
            self.segs[-1][2].append(n)
        else:
            self.segs.append((block.fields, [at], [n]))

    def layout(self) -> tuple[np.ndarray, dict[str, np.ndarray], dict[str, np.ndarray]]:
        """``(lengths, values, like)``: each piece's length, per field every piece's tokens one
        after another (fields sharing an array in every block share one), and the first block's
        fields (their dtypes)."""
        lengths, parts = [], []
        for fields, ats, ns in self.segs:
            at = ats[0] if len(ats) == 1 else np.concatenate(ats)
            n = ns[0] if len(ns) == 1 else np.concatenate(ns)
            whole = len(at) < 2 or bool(np.array_equal(at[1:], at[:-1] + n[:-1]))
            lengths.append(n)
            parts.append((fields, at, n, whole))
        values: dict[str, np.ndarray] = {}
        made: dict[tuple[int, ...], np.ndarray] = {}
        first = self.segs[0][0]
        for name in first:
            key = tuple(id(fields[name]) for fields, *_ in parts)
            if key not in made:
                cuts = [fields[name][int(at[0]):int(at[-1] + n[-1])] if whole else gather_spans(fields[name], at, n)
                        for fields, at, n, whole in parts if len(n)]
                made[key] = cuts[0] if len(cuts) == 1 else np.concatenate(cuts)
            values[name] = made[key]
        return lengths[0] if len(lengths) == 1 else np.concatenate(lengths), values, first
