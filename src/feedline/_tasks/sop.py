"""Sentence-order prediction (ALBERT, Sabertooth) with MLM on top.

A document's sentences are grouped into chunks of about ``max_length - 3`` tokens (Google
BERT's ``create_instances_from_document``: a chunk ends at the first sentence that reaches the
target length; with probability ``short_seq_prob`` the document's target is drawn uniformly
from ``[2, max_length - 3]``). Each chunk is cut at a random sentence boundary into two
consecutive segments A and B, truncated longest-first (one token at a time, from the front or
the back with probability 0.5, as BERT's ``truncate_seq_pair``), and swapped with probability
``swap_probability``::

    label 0:  [CLS] A [SEP] B [SEP]      token_type_ids 0 … 0 1 … 1
    label 1:  [CLS] B [SEP] A [SEP]      (B first; types switch after the first [SEP])

A chunk of a single sentence gives ``[CLS] A [SEP]`` with label 0 (Sabertooth). MLM masking
(:mod:`feedline._tasks.masking`) is applied on top. Fields: ``input_ids``, ``labels``,
``token_type_ids``, ``sentence_order_label`` (0-D int64)::

    task: {kind: sop, max_length: 128, max_predictions: 20}

Sentences come from ``record.data["sentences"]`` (the ``bert`` source format provides it) or
are segmented from ``record.data["text"]`` in the task workers (:mod:`feedline._tasks.segment`).

Differences from the references: no next-sentence "random document" branch (SOP replaces NSP,
and a random other document would make an example depend on other records); Sabertooth's
row-continuation across batches (each batch row consumes one document over many batches) is
replaced by whole-document processing; the chunk target is drawn once per document as in
Google BERT/ALBERT (Sabertooth fills every row). Masking is Bernoulli by default; set
``masking: exact`` for BERT's fixed count.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from feedline._core.record import Example, Record
from feedline._tasks.base import Task, TaskOutput
from feedline._tasks.masking import Masker, MaskingOptions
from feedline._tasks.mlm import encode_words
from feedline._tasks.segment import Segmenter, split_sentences
from feedline.errors import SpecError

__all__ = ["SentenceOrder", "SentenceOrderOptions"]

_DOC_STREAM = 1  # generator stream for document-level choices; stream 0 masks each example


@dataclass(frozen=True, kw_only=True)
class SentenceOrderOptions(MaskingOptions):
    """Options of the ``sop`` task (plus those of :class:`~feedline._tasks.masking.MaskingOptions`).

    Attributes:
        max_length: tokens per row, [CLS] and both [SEP] included.
        short_seq_prob: probability that a document's chunks target a random shorter length.
        swap_probability: probability that A and B are swapped (label 1).
        sentences: record field holding a list of sentences, used when present.
        segmenter: how ``text`` is split when there is no sentence list: ``blingfire`` (fast,
            default), ``pysbd`` (22 languages, slow) or ``lines``.
        language: the ``pysbd`` language code.
    """

    max_length: int = 512
    short_seq_prob: float = 0.1
    swap_probability: float = 0.5
    sentences: str = "sentences"
    segmenter: Segmenter = "blingfire"
    language: str = "en"

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.max_length < 5:
            raise SpecError(f"task.max_length: {self.max_length} must be >= 5")
        for name in ("short_seq_prob", "swap_probability"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise SpecError(f"task.{name}: {getattr(self, name)} must be in [0, 1]")


def _truncate_pair(la: int, lb: int, budget: int, rng: np.random.Generator) -> tuple[slice, slice]:
    """BERT's ``truncate_seq_pair`` on lengths: drop from the longer, front or back at random."""
    a0, a1, b0, b1 = 0, la, 0, lb
    while (a1 - a0) + (b1 - b0) > budget:
        if (a1 - a0) >= (b1 - b0):
            if rng.random() < 0.5:
                a0 += 1
            else:
                a1 -= 1
        elif rng.random() < 0.5:
            b0 += 1
        else:
            b1 -= 1
    return slice(a0, a1), slice(b0, b1)


class SentenceOrder(Task):
    """The ``sop`` task."""

    kind = "sop"
    Options = SentenceOrderOptions

    @cached_property
    def masker(self) -> Masker:
        return Masker(self.options, self.tok)

    def _sentences(self, rec: Record) -> list[str]:
        opts: SentenceOrderOptions = self.options
        given = rec.data.get(opts.sentences)
        if isinstance(given, list) and all(isinstance(s, str) for s in given):
            return [s for s in given if s.strip()]
        return split_sentences(rec.data.get("text") or "", opts.segmenter, opts.language)

    def process(self, records: Sequence[Record]) -> list[TaskOutput]:
        sents = [self._sentences(r) for r in records]
        flat = [s for doc in sents for s in doc]
        if self.options.whole_word_mask:
            encoded = encode_words(self, flat)
        else:
            encoded = [(ids, np.zeros(len(ids), np.int64)) for ids in self.tok.encode_batch(flat)]
        out: list[TaskOutput] = []
        i = 0
        for rec, doc in zip(records, sents, strict=True):
            enc = encoded[i:i + len(doc)]
            i += len(doc)
            exs = self._document(rec, [e for e in enc if len(e[0])])
            out.append(exs if exs else self.reject(rec, "no_sentences", "the document has no tokenized sentences"))
        return out

    def _document(self, rec: Record, sents: list[tuple[np.ndarray, np.ndarray]]) -> list[Example]:
        opts: SentenceOrderOptions = self.options
        rng = self.rng(rec, 0, _DOC_STREAM)
        budget = opts.max_length - 3
        target = budget
        if rng.random() < opts.short_seq_prob:
            target = int(rng.integers(2, budget + 1))
        # Word ids made unique across sentences, so whole words never merge over a boundary.
        word_base = 0
        chunk: list[tuple[np.ndarray, np.ndarray]] = []
        length = 0
        examples: list[Example] = []
        for k, (ids, words) in enumerate(sents):
            chunk.append((ids, words + word_base))
            word_base += int(words.max(initial=0)) + 1
            length += len(ids)
            if k == len(sents) - 1 or length >= target:
                examples.append(self._pair(rec, len(examples), chunk, rng))
                chunk, length = [], 0
        return examples

    def _pair(self, rec: Record, sub: int, chunk: list[tuple[np.ndarray, np.ndarray]], rng: np.random.Generator) -> Example:
        opts: SentenceOrderOptions = self.options
        cls, sep = self.tok.special("cls"), self.tok.special("sep")
        a_end = int(rng.integers(1, len(chunk))) if len(chunk) >= 2 else len(chunk)
        a_ids = np.concatenate([c[0] for c in chunk[:a_end]])
        a_w = np.concatenate([c[1] for c in chunk[:a_end]])
        if a_end == len(chunk):  # a single segment
            sa, _ = _truncate_pair(len(a_ids), 0, opts.max_length - 2, rng)
            ids = np.concatenate([[cls], a_ids[sa], [sep]]).astype(np.int32)
            words = np.concatenate([[-1], a_w[sa], [-1]])
            tt = np.zeros(len(ids), np.int32)
            label = 0
        else:
            b_ids = np.concatenate([c[0] for c in chunk[a_end:]])
            b_w = np.concatenate([c[1] for c in chunk[a_end:]])
            sa, sb = _truncate_pair(len(a_ids), len(b_ids), opts.max_length - 3, rng)
            first, second = (a_ids[sa], a_w[sa]), (b_ids[sb], b_w[sb])
            label = int(rng.random() < opts.swap_probability)
            if label:
                first, second = second, first
            ids = np.concatenate([[cls], first[0], [sep], second[0], [sep]]).astype(np.int32)
            words = np.concatenate([[-1], first[1], [-1], second[1], [-1]])
            tt = np.concatenate([np.zeros(len(first[0]) + 2, np.int32), np.ones(len(second[0]) + 1, np.int32)])
        inp, labels = self.masker(ids, self.rng(rec, sub), words)
        return self.example(rec, sub, input_ids=inp, labels=labels, token_type_ids=tt,
                            sentence_order_label=np.asarray(label, dtype=np.int64))
