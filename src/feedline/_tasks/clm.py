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
from typing import Literal

import numpy as np

from feedline._core.record import Record
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
    """The ``clm`` task."""

    kind = "clm"
    Options = CausalLMOptions
    accepts_tokens = True

    def process(self, records: Sequence[Record]) -> list[TaskOutput]:
        opts: CausalLMOptions = self.options
        out: list[TaskOutput | None] = [None] * len(records)
        texts = [i for i, r in enumerate(records) if not isinstance(r.data.get("input_ids"), np.ndarray)]
        if texts:
            recs = [records[i] for i in texts]
            ids = self.tok.encode_batch([r.data["text"] for r in recs])
            frame_b = np.asarray([self.tok.special("bos")] if opts.bos else [], np.int32)
            frame_e = np.asarray([self.tok.special("eos")] if opts.eos else [], np.int32)
            if opts.frame == "document":
                made = self._documents(recs, ids, frame_b, frame_e)
            else:
                made = [self._pieces(rec, doc, frame_b, frame_e) for rec, doc in zip(recs, ids, strict=True)]
            for i, m in zip(texts, made, strict=True):
                out[i] = m
        for i, rec in enumerate(records):
            if out[i] is None:
                out[i] = self._stored(rec)
        return out  # type: ignore[return-value]

    def _pieces(self, rec: Record, doc: np.ndarray, frame_b: np.ndarray, frame_e: np.ndarray) -> TaskOutput:
        """``frame: piece``: a text document cut at ``max_length`` with BOS/EOS around every piece."""
        opts: CausalLMOptions = self.options
        nb, ne = len(frame_b), len(frame_e)
        n = (opts.max_length or len(doc) + nb + ne) - nb - ne
        pieces = [np.concatenate([frame_b, doc[i:i + n], frame_e]) for i in range(0, max(len(doc), 1), max(n, 1))]
        if opts.overflow == "truncate":
            pieces = pieces[:1]
        return [self.example(rec, j, input_ids=p, labels=p) for j, p in enumerate(pieces)]

    def _documents(self, records: Sequence[Record], ids: list[np.ndarray], frame_b: np.ndarray,
                   frame_e: np.ndarray) -> list[TaskOutput]:
        """``frame: document``: every framed document of the chunk framed in one array, then cut into pieces.

        Each piece is its own copy, so a buffered piece (a packer's open row) never holds the whole chunk.
        """
        opts: CausalLMOptions = self.options
        nb, ne = len(frame_b), len(frame_e)
        lengths = np.fromiter((len(d) for d in ids), dtype=np.int64, count=len(ids)) + (nb + ne)
        ends = np.cumsum(lengths)
        flat = np.empty(int(ends[-1]) if len(ends) else 0, dtype=np.int32)
        if nb or ne:
            body = np.ones(len(flat), dtype=bool)
            for k in range(nb):
                body[ends - lengths + k] = False
            for k in range(ne):
                body[ends - ne + k] = False
            flat[body] = np.concatenate(ids) if ids else 0
            for k in range(nb):
                flat[ends - lengths + k] = frame_b[k]
            for k in range(ne):
                flat[ends - ne + k] = frame_e[k]
        elif ids:
            flat[:] = np.concatenate(ids)
        out: list[TaskOutput] = []
        for rec, end, n_doc in zip(records, ends.tolist(), lengths.tolist(), strict=True):
            start = end - n_doc
            n = opts.max_length or max(n_doc, 1)
            if n_doc <= n or opts.overflow == "truncate":
                p = flat[start:start + min(n, n_doc)].copy()
                out.append([self.example(rec, 0, input_ids=p, labels=p)])
                continue
            pieces = [flat[i:min(i + n, end)].copy() for i in range(start, end, n)]
            out.append([self.example(rec, j, input_ids=p, labels=p) for j, p in enumerate(pieces)])
        return out

    def _stored(self, rec: Record) -> TaskOutput:
        """A pre-tokenized document: its ids as stored (never re-framed), cut at ``max_length``;
        its ``labels`` when the source has them, else the ids."""
        opts: CausalLMOptions = self.options
        ids: np.ndarray = rec.data["input_ids"]
        labels: np.ndarray | None = rec.data.get("labels")
        if not len(ids):
            return self.reject(rec, "empty_document")
        if labels is not None and len(labels) != len(ids):
            return self.reject(rec, "labels_length", f"{len(labels)} labels for {len(ids)} token ids")
        lo, hi = int(ids.min()), int(ids.max())
        vocab = self.ctx.tokenizer.vocab_size if self.ctx.tokenizer is not None else None
        if lo < 0 or (vocab is not None and hi >= vocab):
            return self.reject(rec, "token_out_of_range",
                               f"ids {lo}..{hi}" + (f", vocabulary {vocab}" if vocab is not None else "") +
                               "; check the source's tokens.dtype and the tokenizer")
        target = ids if labels is None else labels
        n = opts.max_length or len(ids)
        starts = range(0, len(ids), n)
        if opts.overflow == "truncate":
            starts = starts[:1]
        return [self.example(rec, j, input_ids=ids[s:s + n], labels=target[s:s + n]) for j, s in enumerate(starts)]
