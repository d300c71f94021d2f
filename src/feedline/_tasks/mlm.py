"""Masked language modelling (BERT/RoBERTa) with dynamic masking.

Each document becomes ``[CLS] tokens [SEP]`` rows of at most ``max_length`` tokens (long
documents are split into consecutive pieces, or truncated), or, with ``text_pair``, one
``[CLS] A [SEP] B [SEP]`` row with ``token_type_ids`` 0 up to the first [SEP] and 1 after::

    task: {kind: mlm, max_length: 128, mlm_probability: 0.15, whole_word_mask: false}
    task: {kind: mlm, max_length: 128, text_pair: answer}      # record field holding segment B

Fields: ``input_ids`` (masked), ``labels`` (original id where chosen, -100 elsewhere),
``token_type_ids`` (int32). Masking is :mod:`feedline._tasks.masking` with the generator of
``(seed, epoch, record key, piece)`` (all rows of a chunk at once: :meth:`Masker.mask_rows`): a new mask every epoch, the same mask on resume.

Differences from the references (see ``docs/tasks.md``): [CLS]/[SEP] framing is done here with
the tokenizer's cls/sep tokens (RoBERTa's pair layout ``<s> A </s></s> B </s>`` becomes
``<s> A </s> B </s>``); pairs are truncated longest-first from the end (HF ``longest_first``);
the masking differences are listed in :mod:`feedline._tasks.masking`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Literal

import numpy as np

from feedline._core.block import ExampleBlock, exclusive_cumsum, record_keys
from feedline._core.record import Record
from feedline._core.rng import sample_keys
from feedline._tasks.base import Task, TaskOutput
from feedline._tasks.masking import Masker, MaskingOptions
from feedline.errors import SpecError

__all__ = ["MaskedLM", "MaskedLMOptions", "encode_words", "truncate_longest_first"]


@dataclass(frozen=True, kw_only=True)
class MaskedLMOptions(MaskingOptions):
    """Options of the ``mlm`` task (plus those of :class:`~feedline._tasks.masking.MaskingOptions`).

    Attributes:
        max_length: tokens per row, [CLS] and [SEP] included.
        text_pair: record field holding the second segment; rows become sentence pairs.
        overflow: ``split`` long single documents into several rows, or ``truncate`` them.
    """

    max_length: int = 512
    text_pair: str | None = None
    overflow: Literal["split", "truncate"] = "split"

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.max_length < 4:
            raise SpecError(f"task.max_length: {self.max_length} must be >= 4 ([CLS] A [SEP] B [SEP])")


def encode_words(task: Task, texts: Sequence[str]) -> list[tuple[np.ndarray, np.ndarray]]:
    """Token ids and word index per token (the pre-tokenizer's words), in one batched call."""
    if not texts:
        return []
    encs = task.tok.backend.encode_batch(list(texts), add_special_tokens=False)
    out = []
    for e in encs:
        words = np.asarray([-1 if w is None else w for w in e.word_ids], dtype=np.int64)
        out.append((np.asarray(e.ids, dtype=np.int32), words))
    return out


def truncate_longest_first(a: np.ndarray, b: np.ndarray, budget: int) -> tuple[int, int]:
    """Lengths ``(la, lb)`` after removing tokens from the end of the longer segment until they fit.

        >>> truncate_longest_first(np.arange(10), np.arange(3), 8)
        (5, 3)
    """
    la, lb = len(a), len(b)
    while la + lb > budget:
        if la >= lb:
            la -= 1
        else:
            lb -= 1
    return la, lb


class MaskedLM(Task):
    """The ``mlm`` task."""

    kind = "mlm"
    Options = MaskedLMOptions

    @cached_property
    def masker(self) -> Masker:
        return Masker(self.options, self.tok)

    def _encode(self, texts: Sequence[str]) -> list[tuple[np.ndarray, np.ndarray]]:
        if self.options.whole_word_mask:
            return encode_words(self, texts)
        return [(ids, np.zeros(0, np.int64)) for ids in self.tok.encode_batch(texts)]

    def process(self, records: Sequence[Record]) -> list[TaskOutput]:
        if self.options.text_pair is None:
            return self._single(records).outputs(len(records))  # type: ignore[return-value]
        return self._pairs(records)

    def process_block(self, records: Sequence[Record]) -> list[TaskOutput] | ExampleBlock:
        """Single documents: the chunk as one block (pairs, or a subclass that overrides :meth:`process`: lists)."""
        if self.options.text_pair is None and type(self).process is MaskedLM.process:
            return self._single(records)
        return self.process(records)

    def _pairs(self, records: Sequence[Record]) -> list[TaskOutput]:
        """``[CLS] A [SEP] B [SEP]`` rows, one per record."""
        opts: MaskedLMOptions = self.options
        cls, sep = self.tok.special("cls"), self.tok.special("sep")
        first = self._encode([r.data["text"] for r in records])
        out: list[TaskOutput] = []
        pair_texts, missing = [], set()
        for i, r in enumerate(records):
            t = r.data.get(opts.text_pair)  # type: ignore[arg-type]
            if not isinstance(t, str):
                missing.add(i)
                t = ""
            pair_texts.append(t)
        second = self._encode(pair_texts)
        kept: list[int] = []
        pieces, piece_words, types = [], [], []
        for i, ((a, wa), (b, wb)) in enumerate(zip(first, second, strict=True)):
            if i in missing:
                continue
            la, lb = truncate_longest_first(a, b, opts.max_length - 3)
            pieces.append(np.concatenate([[cls], a[:la], [sep], b[:lb], [sep]]).astype(np.int32))
            piece_words.append(np.concatenate([[-1], wa[:la], [-1], wb[:lb] + (wa.max(initial=0) + 1), [-1]])
                               if opts.whole_word_mask else None)
            types.append(np.concatenate([np.zeros(la + 2, np.int32), np.ones(lb + 1, np.int32)]))
            kept.append(i)
        masked = self.masker.mask_rows(pieces, self._keys(record_keys(records), kept, [0] * len(kept)), piece_words)
        by_record = dict(zip(kept, zip(masked, types, strict=True), strict=True))
        for i, rec in enumerate(records):
            if i in missing:
                out.append(self.reject(rec, "missing_field", f"no text field {opts.text_pair!r} (task.text_pair)"))
                continue
            (inp, labels), tt = by_record[i]
            out.append([self.example(rec, 0, input_ids=inp, labels=labels, token_type_ids=tt)])
        return out

    def _single(self, records: Sequence[Record]) -> ExampleBlock:
        """``[CLS] piece [SEP]`` rows of single documents: the whole chunk built and masked at once, as one block."""
        opts: MaskedLMOptions = self.options
        cls, sep = self.tok.special("cls"), self.tok.special("sep")
        body = opts.max_length - 2
        texts = [r.data["text"] for r in records]
        if opts.whole_word_mask:
            first = encode_words(self, texts)
            doc_len = np.fromiter((len(ids) for ids, _ in first), dtype=np.int64, count=len(first))
            doc_ids = np.concatenate([ids for ids, _ in first]) if first else np.zeros(0, np.int32)
        else:
            doc_ids, bounds = self.tok.encode_batch_flat(texts)
            doc_len = np.diff(bounds)
        doc_ids = doc_ids.astype(np.int32, copy=False)
        n_pieces = np.ones_like(doc_len) if opts.overflow == "truncate" else np.maximum(1, -(-doc_len // body))
        owner = np.repeat(np.arange(len(records)), n_pieces)
        subs = np.arange(len(owner)) - np.repeat(exclusive_cumsum(n_pieces), n_pieces)
        begin = subs * body  # token offset of each piece in its document
        blen = np.clip(doc_len[owner] - begin, 0, body)
        offs = np.zeros(len(owner) + 1, dtype=np.int64)
        np.cumsum(blen + 2, out=offs[1:])
        flat = np.empty(int(offs[-1]), dtype=np.int32)
        words = None
        if opts.overflow == "split":
            # Every token of every document lands in order: fill all places but the [CLS]/[SEP] ones.
            place = np.ones(len(flat), dtype=bool)
            place[offs[:-1]] = place[offs[1:] - 1] = False
            flat[place] = doc_ids
            if opts.whole_word_mask:
                wflat = np.full(len(flat), -1, dtype=np.int64)
                wflat[place] = np.concatenate([w for _, w in first])
        else:
            # Gather every piece's body at once: output index and source index of each body token.
            within = np.arange(int(blen.sum())) - np.repeat(exclusive_cumsum(blen), blen)
            dst = np.repeat(offs[:-1] + 1, blen) + within
            src = np.repeat(exclusive_cumsum(doc_len)[owner] + begin, blen) + within
            flat[dst] = doc_ids[src]
            if opts.whole_word_mask:
                wflat = np.full(len(flat), -1, dtype=np.int64)
                wflat[dst] = np.concatenate([w for _, w in first])[src]
        flat[offs[:-1]], flat[offs[1:] - 1] = cls, sep
        if opts.whole_word_mask:
            words = [wflat[a:b] for a, b in zip(offs[:-1].tolist(), offs[1:].tolist(), strict=True)]
        keys = record_keys(records)
        inp, labels = self.masker.mask_flat(flat, offs, self._keys(keys, owner, subs), words)
        refs = np.empty((len(owner), 5), dtype=np.int64)
        refs[:, :4] = keys[owner]
        refs[:, 4] = subs
        return ExampleBlock(refs, owner, offs[:-1], blen + 2, {"input_ids": inp, "labels": labels,
                                                                "token_type_ids": np.zeros(len(flat), np.int32)})

    def _keys(self, keys: np.ndarray, owner: Sequence[int] | np.ndarray, subs: Sequence[int] | np.ndarray) -> np.ndarray:
        """Masking generator keys (stream 0) of the rows ``(record owner[i], piece subs[i])``: :meth:`Task.rng`'s.

        ``keys`` is :func:`~feedline._core.block.record_keys` of the chunk's records.
        """
        idx = np.asarray(owner, dtype=np.int64)
        return sample_keys(self.seed, keys[idx, 3], keys[idx, :3], np.asarray(subs, dtype=np.int64))
