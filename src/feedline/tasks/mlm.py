"""Masked language modelling (BERT/RoBERTa) with dynamic masking.

Each document becomes ``[CLS] tokens [SEP]`` rows of at most ``max_length`` tokens (long
documents are split into consecutive pieces, or truncated), or, with ``text_pair``, one
``[CLS] A [SEP] B [SEP]`` row with ``token_type_ids`` 0 up to the first [SEP] and 1 after::

    task: {kind: mlm, max_length: 128, mlm_probability: 0.15, whole_word_mask: false}
    task: {kind: mlm, max_length: 128, text_pair: answer}      # record field holding segment B

Fields: ``input_ids`` (masked), ``labels`` (original id where chosen, -100 elsewhere),
``token_type_ids`` (int32). Masking is :mod:`feedline.tasks.masking` with the generator of
``(seed, epoch, record key, piece)``: a new mask every epoch, the same mask on resume.

Differences from the references (see ``docs/tasks.md``): [CLS]/[SEP] framing is done here with
the tokenizer's cls/sep tokens (RoBERTa's pair layout ``<s> A </s></s> B </s>`` becomes
``<s> A </s> B </s>``); pairs are truncated longest-first from the end (HF ``longest_first``);
the masking differences are listed in :mod:`feedline.tasks.masking`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Literal

import numpy as np

from feedline.core.record import Record
from feedline.errors import SpecError
from feedline.tasks.base import Task, TaskOutput
from feedline.tasks.masking import Masker, MaskingOptions

__all__ = ["MaskedLM", "MaskedLMOptions", "encode_words", "truncate_longest_first"]


@dataclass(frozen=True, kw_only=True)
class MaskedLMOptions(MaskingOptions):
    """Options of the ``mlm`` task (plus those of :class:`~feedline.tasks.masking.MaskingOptions`).

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
        opts: MaskedLMOptions = self.options
        cls, sep = self.tok.special("cls"), self.tok.special("sep")
        masker = self.masker
        first = self._encode([r.data["text"] for r in records])
        out: list[TaskOutput] = []
        if opts.text_pair is None:
            body = opts.max_length - 2
            for rec, (ids, words) in zip(records, first, strict=True):
                starts = range(0, max(len(ids), 1), body)
                if opts.overflow == "truncate":
                    starts = range(0, 1)
                exs = []
                for j, s in enumerate(starts):
                    piece = np.concatenate([[cls], ids[s:s + body], [sep]]).astype(np.int32)
                    w = np.concatenate([[-1], words[s:s + body], [-1]]) if len(words) else None
                    inp, labels = masker(piece, self.rng(rec, j), w)
                    exs.append(self.example(rec, j, input_ids=inp, labels=labels,
                                            token_type_ids=np.zeros(len(piece), np.int32)))
                out.append(exs)
            return out
        pair_texts, missing = [], set()
        for i, r in enumerate(records):
            t = r.data.get(opts.text_pair)
            if not isinstance(t, str):
                missing.add(i)
                t = ""
            pair_texts.append(t)
        second = self._encode(pair_texts)
        for i, (rec, (a, wa), (b, wb)) in enumerate(zip(records, first, second, strict=True)):
            if i in missing:
                out.append(self.reject(rec, "missing_field", f"no text field {opts.text_pair!r} (task.text_pair)"))
                continue
            la, lb = truncate_longest_first(a, b, opts.max_length - 3)
            piece = np.concatenate([[cls], a[:la], [sep], b[:lb], [sep]]).astype(np.int32)
            w = None
            if opts.whole_word_mask:
                w = np.concatenate([[-1], wa[:la], [-1], wb[:lb] + (wa.max(initial=0) + 1), [-1]])
            tt = np.concatenate([np.zeros(la + 2, np.int32), np.ones(lb + 1, np.int32)])
            inp, labels = masker(piece, self.rng(rec, 0), w)
            out.append([self.example(rec, 0, input_ids=inp, labels=labels, token_type_ids=tt)])
        return out
