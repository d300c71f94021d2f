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

from feedline.core.record import Record
from feedline.errors import SpecError
from feedline.tasks.base import Task, TaskOutput

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
            ids = self.tok.encode_batch([records[i].data["text"] for i in texts])
            bos = np.asarray([self.tok.special("bos")] if opts.bos else [], np.int32)
            eos = np.asarray([self.tok.special("eos")] if opts.eos else [], np.int32)
            for i, doc in zip(texts, ids, strict=True):
                out[i] = self._framed(records[i], doc, bos, eos)
        for i, rec in enumerate(records):
            if out[i] is None:
                out[i] = self._stored(rec)
        return out  # type: ignore[return-value]

    def _framed(self, rec: Record, doc: np.ndarray, frame_b: np.ndarray, frame_e: np.ndarray) -> TaskOutput:
        """A text document: framed with BOS/EOS as configured, cut at ``max_length``."""
        opts: CausalLMOptions = self.options
        bos, eos = frame_b.tolist(), frame_e.tolist()
        if opts.frame == "piece":
            n = (opts.max_length or len(doc) + len(bos) + len(eos)) - len(bos) - len(eos)
            pieces = [np.concatenate([frame_b, doc[i:i + n], frame_e]) for i in range(0, max(len(doc), 1), max(n, 1))]
            if opts.overflow == "truncate":
                pieces = pieces[:1]
            return [self.example(rec, j, input_ids=p, labels=p) for j, p in enumerate(pieces)]
        if bos or eos:
            doc = np.concatenate([frame_b, doc, frame_e])
        n = opts.max_length or max(len(doc), 1)
        pieces = [doc[i:i + n] for i in range(0, len(doc), n)] or [doc]
        if opts.overflow == "truncate":
            pieces = pieces[:1]
        return [self.example(rec, j, input_ids=p, labels=p) for j, p in enumerate(pieces)]

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
