"""Causal language modelling (GPT): ``labels`` equal ``input_ids``, unshifted (HF shifts inside the model).

Each document is encoded, framed with BOS/EOS as configured, and cut at ``max_length``:
``overflow: split`` (default) turns a long document into consecutive pieces so no token is lost,
``truncate`` keeps only the first piece. Batchers then pad (-100 labels on padding), pack
(positions restart per document) or concatenate-and-chunk.

    task: {kind: clm, max_length: 1024, eos: true, bos: false}

Document boundaries (``frame``), for a document ``a b c d e`` cut at ``max_length`` 4 with
``bos`` and ``eos``::

    document (default)   <s> a b c | d e </s>          BOS/EOS mark the document's ends only
    piece                <s> a b </s> | <s> c d </s> | <s> e </s>   every row is framed

``document`` matches Megatron's ``--append-eod`` and fairseq (one EOS per document; the
packer or concat batcher then separates documents); ``piece`` suits models that expect every
row to start with BOS (Llama-style). HF ``run_clm.py`` inserts no separator at all: set
``eos: false`` for that.

Pre-tokenized records (``format: tokens | megatron | flat``, ``{"input_ids": int32 array}``) need
no tokenizer: their ids are used as stored (separators included, never re-framed), cut at
``max_length``, with the source's ``labels`` when it has them. Empty documents, labels of another
length and ids outside the tokenizer's vocabulary (when the spec names one) are rejected.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from feedline._core.block import ExampleBlock, exclusive_cumsum, record_keys, spans
from feedline._core.documents import TokenRecords
from feedline._core.record import Record, Rejection
from feedline._tasks.base import Task, TaskOutput
from feedline.errors import SpecError

__all__ = ["CausalLM", "CausalLMOptions"]


@dataclass(frozen=True, kw_only=True)
class CausalLMOptions:
    """Options of the ``clm`` task.

    Attributes:
        max_length: tokens per example; ``None`` keeps whole documents.
        eos: append the EOS token to each document (the separator between documents).
        bos: prepend the BOS token to each document.
        overflow: ``split`` long documents into pieces, or ``truncate`` them.
        frame: put BOS/EOS around each ``document`` (default) or each ``piece``.
    """

    max_length: int | None = 1024
    eos: bool = True
    bos: bool = False
    overflow: Literal["split", "truncate"] = "split"
    frame: Literal["document", "piece"] = "document"

    def __post_init__(self) -> None:
        if self.max_length is not None and self.max_length < 2:
            raise SpecError(f"task.max_length: {self.max_length} must be >= 2")
        if self.frame == "piece" and self.max_length is not None and self.max_length <= int(self.bos) + int(self.eos):
            raise SpecError(f"task.max_length: {self.max_length} leaves no room for text between BOS/EOS (frame: piece)")


class CausalLM(Task):
    """The ``clm`` task: a chunk becomes one :class:`~feedline._core.block.ExampleBlock` (no object per example)."""

    kind = "clm"
    Options = CausalLMOptions
    accepts_tokens = True
    inline_runs = True

    def process(self, records: Sequence[Record]) -> list[TaskOutput]:
        return self._block(records).outputs(len(records))  # type: ignore[return-value]

    def process_block(self, records: Sequence[Record]) -> list[TaskOutput] | ExampleBlock:
        """The chunk as one block; a subclass that overrides :meth:`process` gets its own lists used."""
        if type(self).process is not CausalLM.process:
            return self.process(records)
        return self._block(records)

    def _block(self, records: Sequence[Record]) -> ExampleBlock:
        """Every record of the chunk at once: text records encoded in one flat call, stored ids checked as arrays."""
        if isinstance(records, TokenRecords):
            block = self._run(records)
            if block is not None:
                return block
        text: list[int] = []
        stored: list[int] = []
        for i, r in enumerate(records):
            (stored if isinstance(r.data.get("input_ids"), np.ndarray) else text).append(i)
        parts = []
        if text:
            parts.append(self._text([records[i] for i in text], np.asarray(text, dtype=np.int64)))
        if stored:
            parts.append(self._stored([records[i] for i in stored], np.asarray(stored, dtype=np.int64)))
        return ExampleBlock.merge(parts)

    def _text(self, recs: Sequence[Record], index: np.ndarray) -> ExampleBlock:
        """Text documents: encoded, framed (per ``document`` or per ``piece``) and cut at ``max_length``."""
        opts: CausalLMOptions = self.options
        ids, bounds = self.tok.encode_batch_flat([r.data["text"] for r in recs])
        frame_b = np.asarray([self.tok.special("bos")] if opts.bos else [], np.int32)
        frame_e = np.asarray([self.tok.special("eos")] if opts.eos else [], np.int32)
        nb, ne = len(frame_b), len(frame_e)
        keys = record_keys(recs)
        sizes = np.diff(bounds)
        if opts.frame == "piece":
            return self._pieces(ids, bounds[:-1], sizes, frame_b, frame_e, keys, index)
        lengths = sizes + (nb + ne)
        ends = np.cumsum(lengths)
        flat = np.empty(int(ends[-1]) if len(ends) else 0, dtype=np.int32)
        if nb or ne:
            body = np.ones(len(flat), dtype=bool)
            for k in range(nb):
                body[ends - lengths + k] = False
            for k in range(ne):
                body[ends - ne + k] = False
            flat[body] = ids
            for k in range(nb):
                flat[ends - lengths + k] = frame_b[k]
            for k in range(ne):
                flat[ends - ne + k] = frame_e[k]
        else:
            flat[:] = ids
        return _cut(keys, index, ends - lengths, lengths, opts.max_length, opts.overflow == "truncate", flat, flat)

    def _pieces(self, ids: np.ndarray, doc_starts: np.ndarray, sizes: np.ndarray, frame_b: np.ndarray,
                frame_e: np.ndarray, keys: np.ndarray, index: np.ndarray) -> ExampleBlock:
        """``frame: piece``: each text document cut into bodies of ``max_length`` minus the frame, BOS/EOS around each."""
        opts: CausalLMOptions = self.options
        nb, ne = len(frame_b), len(frame_e)
        body = sizes if opts.max_length is None else np.full(len(sizes), opts.max_length - nb - ne, dtype=np.int64)
        step = np.maximum(body, 1)
        count = np.ones(len(sizes), dtype=np.int64) if opts.overflow == "truncate" else -(-np.maximum(sizes, 1) // step)
        doc = np.repeat(np.arange(len(sizes)), count)
        sub = np.arange(len(doc)) - np.repeat(exclusive_cumsum(count), count)
        offset = sub * step[doc]
        body_len = np.clip(np.minimum(body[doc], sizes[doc] - offset), 0, None)
        lengths = body_len + (nb + ne)
        starts = exclusive_cumsum(lengths)
        flat = np.empty(int(lengths.sum()), dtype=np.int32)
        for k in range(nb):
            flat[starts + k] = frame_b[k]
        flat[spans(starts + nb, body_len)] = ids[spans(doc_starts[doc] + offset, body_len)]
        for k in range(ne):
            flat[starts + nb + body_len + k] = frame_e[k]
        refs = np.concatenate([keys[doc], sub[:, None]], axis=1)
        return ExampleBlock(refs, index[doc], starts, lengths, {"input_ids": flat, "labels": flat})

    def _stored(self, recs: Sequence[Record], index: np.ndarray) -> ExampleBlock:
        """Pre-tokenized documents: ids as stored (never re-framed), cut at ``max_length``; the source's
        ``labels`` when it has them, else the ids. Empty documents, labels of another length and ids
        outside ``[0, vocabulary)`` are rejected."""
        opts: CausalLMOptions = self.options
        ids: list[np.ndarray] = [r.data["input_ids"] for r in recs]
        labels: list[np.ndarray | None] = [r.data.get("labels") for r in recs]
        sizes = np.fromiter((len(a) for a in ids), dtype=np.int64, count=len(ids))
        flat = np.concatenate(ids)
        starts = exclusive_cumsum(sizes)
        nonempty = sizes > 0
        lo = np.zeros(len(ids), dtype=np.int64)
        hi = np.zeros(len(ids), dtype=np.int64)
        if nonempty.any():
            lo[nonempty] = np.minimum.reduceat(flat, starts[nonempty])
            hi[nonempty] = np.maximum.reduceat(flat, starts[nonempty])
        vocab = self.ctx.tokenizer.vocab_size if self.ctx.tokenizer is not None else None
        bad = ~nonempty | (lo < 0) | (hi >= vocab if vocab is not None else False)
        has_labels = any(lab is not None for lab in labels)
        if has_labels:
            bad |= np.fromiter((lab is not None and len(lab) != n for lab, n in zip(labels, sizes.tolist(), strict=True)),
                               dtype=bool, count=len(ids))
        rejected = []
        for i in np.flatnonzero(bad).tolist():
            rejected.append((int(index[i]), self._rejection(recs[i], ids[i], labels[i], vocab)))
        target = flat
        if has_labels:
            target = np.concatenate([ids[i] if lab is None or bad[i] else lab for i, lab in enumerate(labels)])
        good = ~bad
        block = _cut(record_keys(recs)[good], index[good], starts[good], sizes[good], opts.max_length,
                     opts.overflow == "truncate", flat, target)
        block.rejected = rejected
        return block

    def _run(self, recs: TokenRecords) -> ExampleBlock | None:
        """A run of pre-tokenized documents as arrays, no object per document: ids of at most 32 bits as
        stored (a view of the memory map or column where they lie end to end), wider ones as int32;
        ``None`` when one would be rejected (:meth:`_stored` then says why). Batchers copy ids into
        int32 batches (:func:`~feedline._batching.base.int_dtype`), so a narrow type (uint16) is
        converted once, in that copy; a single example (``block[i]``) is an int32 copy."""
        opts: CausalLMOptions = self.options
        lengths = recs.lengths
        if not len(recs) or not lengths.all():
            return None
        span = recs.span()
        if span is None:
            flat, starts = _narrow(recs.ids[spans(recs.starts, lengths)]), exclusive_cumsum(lengths)
        else:  # a view (read only: batches copy it)
            flat, starts = _narrow(recs.ids[span[0]:span[1]]), recs.starts - span[0]
        vocab = self.ctx.tokenizer.vocab_size if self.ctx.tokenizer is not None else None
        if not _in_range(recs.ids.dtype, flat, vocab):
            return None
        return _cut(recs.keys, np.arange(len(recs), dtype=np.int64), starts, lengths, opts.max_length,
                    opts.overflow == "truncate", flat, flat)

    def _rejection(self, rec: Record, ids: np.ndarray, labels: np.ndarray | None, vocab: int | None) -> Rejection:
        if not len(ids):
            return self.reject(rec, "empty_document")
        if labels is not None and len(labels) != len(ids):
            return self.reject(rec, "labels_length", f"{len(labels)} labels for {len(ids)} token ids")
        lo, hi = int(ids.min()), int(ids.max())
        return self.reject(rec, "token_out_of_range",
                           f"ids {lo}..{hi}" + (f", vocabulary {vocab}" if vocab is not None else "") +
                           "; check the source's tokens.dtype and the tokenizer")


def _narrow(ids: np.ndarray) -> np.ndarray:
    """``ids`` as they are when integers of at most 32 bits, else as int32; a plain ndarray (a view of
    a ``np.memmap`` is one too: slicing a memmap runs Python code, ~1 us a slice, several a batch).

        >>> type(_narrow(np.arange(4, dtype=np.uint16).view(np.memmap)[1:]))
        <class 'numpy.ndarray'>
    """
    if ids.dtype.kind not in "ui" or ids.dtype.itemsize > 4:
        ids = ids.astype(np.int32)
    return ids if type(ids) is np.ndarray else ids.view(np.ndarray)


def _in_range(stored: np.dtype[Any], ids: np.ndarray, vocab: int | None) -> bool:
    """Whether ``ids`` (read from an array of dtype ``stored``) lie in ``[0, vocab)``; a bound the
    stored dtype already guarantees (unsigned ids, a vocabulary above its largest value) is not
    checked (a pass over the ids each).

        >>> _in_range(np.dtype(np.uint16), np.array([7]), None), _in_range(np.dtype(np.int32), np.array([-1]), None)
        (True, False)
    """
    if stored.kind != "u" and int(ids.min()) < 0:
        return False
    if vocab is None or (stored.kind in "ui" and int(np.iinfo(stored).max) < vocab):
        return True
    return int(ids.max()) < vocab


def _cut(keys: np.ndarray, index: np.ndarray, starts: np.ndarray, lengths: np.ndarray, max_length: int | None,
         truncate: bool, ids: np.ndarray, labels: np.ndarray) -> ExampleBlock:
    """Documents ``[starts, starts + lengths)`` of ``ids`` cut into examples of at most ``max_length``
    (``None``: whole); ``truncate`` keeps only each document's first."""
    if max_length is None or not len(lengths) or int(lengths.max()) <= max_length:  # one example a document
        refs = np.zeros((len(lengths), keys.shape[1] + 1), dtype=np.int64)
        refs[:, :-1] = keys
        return ExampleBlock(refs, index.astype(np.int64), starts.astype(np.int64), lengths.astype(np.int64),
                            {"input_ids": ids, "labels": labels})
    cap = np.full(len(lengths), max_length, dtype=np.int64)
    count = np.ones(len(lengths), dtype=np.int64)
    if not truncate:
        count = np.maximum(-(-lengths // cap), 1)
    doc = np.repeat(np.arange(len(lengths)), count)
    sub = np.arange(len(doc)) - np.repeat(exclusive_cumsum(count), count)
    offset = sub * cap[doc]
    refs = np.concatenate([keys[doc], sub[:, None]], axis=1)
    return ExampleBlock(refs, index[doc], starts[doc] + offset, np.minimum(cap[doc], lengths[doc] - offset),
                        {"input_ids": ids, "labels": labels})
