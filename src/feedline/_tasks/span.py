"""T5 span corruption: noise spans replaced by sentinels in the inputs, spelled out in the targets.

A document's tokens are cut into raw chunks of ``raw_length`` tokens, chosen (as T5's
``random_spans_helper``) so that the corrupted inputs are exactly ``max_length`` long::

    max_length  raw tokens  targets        (noise_density 0.15, mean_noise_span_length 3)
    128         141         29
    512         568         114            568 raw: 85 noise tokens in 28 spans
    1024        1137        229

Each chunk gets ``round(L * noise_density)`` noise tokens in ``round(noise / mean)`` spans; span
lengths are uniform random compositions, and spans alternate non-noise, noise, …, ending with
noise (T5's ``random_spans_noise_mask``). With sentinel ``<X_k>`` = ``sentinel_start - k``::

    raw      a b c d e f g h          (noise: c d, g h)
    inputs   a b <X0> e f <X1> </s>
    labels   <X0> c d <X1> g h </s>
    decoder  <pad> <X0> c d <X1> g h  (labels shifted right, decoder_start_token_id first)

``sentinel_start`` defaults to the id of ``<extra_id_0>`` (32099 for T5); a tokenizer without
``<extra_id_N>`` tokens (GPT-2) is refused with a SpecError unless ``sentinel_start`` is set.
Fields: ``input_ids``, ``labels``, ``decoder_input_ids`` (int32); the last two have their own
length (:attr:`Task.target_fields`), and rows are never packed::

    task: {kind: span, max_length: 512}                            # documents concatenated (T5)
    task: {kind: span, max_length: 512, concat_documents: false}   # each document on its own

**Concatenated (default, as T5 and HF ``run_t5_mlm_flax``).** Each document's tokens end with
EOS (as the T5 tokenizer's ``</s>`` does in HF's example); documents are laid end to end and cut
into ``raw_length`` pieces by :class:`~feedline._tasks.span_stream.SpanStream`, a stage after the
task map, so every row is exactly ``max_length`` inputs and ``targets_length`` targets except the
last row of the stream. A row's noise mask is drawn from ``sample_rng(seed, epoch, key, start)``
of the document where it starts (``start``: its token offset there). Unlike T5's
``reduce_concat_tokens`` (128 documents, then a short segment), no row is short mid-stream, and
no random ≤65536-token chunk is selected per document: every token is used.

**Per document** (``concat_documents: false``): each document is cut into raw chunks on its
own, so an example depends on its record only; a document's last chunk is shorter, so its inputs
are shorter than ``max_length`` and padded by the batcher (a last chunk of one token is
dropped). ``overflow: truncate`` keeps only a document's first chunk.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any, Literal

import numpy as np

from feedline._core.dataset import Dataset
from feedline._core.record import Example, Record
from feedline._tasks.base import Task, TaskOutput
from feedline.errors import SpecError, TaskError

__all__ = ["SpanCorruption", "SpanCorruptionOptions", "noise_mask", "span_lengths"]


@dataclass(frozen=True, kw_only=True)
class SpanCorruptionOptions:
    """Options of the ``span`` task.

    Attributes:
        max_length: length of the corrupted inputs (EOS included).
        noise_density: fraction of raw tokens that become noise.
        mean_noise_span_length: mean length of a noise span.
        sentinel_start: id of the first sentinel ``<extra_id_0>``; later ones count down.
        decoder_start_token_id: first decoder input (default: the pad id, 0 for T5).
        concat_documents: lay documents end to end (each ending with EOS) and cut the stream into
            full rows (T5); ``False``: corrupt each document on its own (short rows padded).
        overflow: per-document mode: ``split`` long documents into raw chunks, or ``truncate`` to
            the first (ignored when ``concat_documents``).
    """

    max_length: int = 512
    noise_density: float = 0.15
    mean_noise_span_length: float = 3.0
    sentinel_start: int | None = None
    decoder_start_token_id: int | None = None
    concat_documents: bool = True
    overflow: Literal["split", "truncate"] = "split"

    def __post_init__(self) -> None:
        if self.max_length < 4:
            raise SpecError(f"task.max_length: {self.max_length} must be >= 4")
        if not 0.0 < self.noise_density <= 0.5:
            raise SpecError(f"task.noise_density: {self.noise_density} must be in (0, 0.5]")
        if self.mean_noise_span_length < 1:
            raise SpecError(f"task.mean_noise_span_length: {self.mean_noise_span_length} must be >= 1")


def _lengths(raw: int, density: float, mean: float) -> tuple[int, int, int, int]:
    """``(noise tokens, spans, inputs length, targets length)`` of a raw chunk (EOS included)."""
    noise = round(raw * density)
    spans = round(noise / mean)
    return noise, spans, raw - noise + spans + 1, noise + spans + 1


def span_lengths(inputs_length: int, noise_density: float = 0.15, mean_noise_span_length: float = 3.0) -> tuple[int, int]:
    """``(raw tokens, targets length)`` whose corrupted inputs fit ``inputs_length`` (T5's helper).

        >>> span_lengths(512)
        (568, 114)
    """
    t = inputs_length - 1
    while _lengths(t + 1, noise_density, mean_noise_span_length)[2] <= inputs_length:
        t += 1
    targets = _lengths(t, noise_density, mean_noise_span_length)[3]
    if noise_density == 0.5 and targets > _lengths(t, noise_density, mean_noise_span_length)[2]:
        t -= 1
        targets -= 1
    return t, targets


def _segment(n: int, parts: int, rng: np.random.Generator) -> np.ndarray:
    """A uniform random composition of ``n`` into ``parts`` positive lengths."""
    if parts <= 1:
        return np.array([n], dtype=np.int64)
    cuts = np.sort(rng.choice(n - 1, parts - 1, replace=False) + 1)
    return np.diff(np.concatenate([[0], cuts, [n]]))


def noise_mask(length: int, density: float, mean: float, rng: np.random.Generator) -> np.ndarray:
    """T5's ``random_spans_noise_mask``: alternating non-noise/noise spans, starting with non-noise."""
    noise = min(max(round(length * density), 1), length - 1)
    spans = max(1, round(noise / mean))
    spans = min(spans, length - noise)
    noise_lens = _segment(noise, spans, rng)
    keep_lens = _segment(length - noise, spans, rng)
    interleaved = np.stack([keep_lens, noise_lens], axis=1).reshape(-1)
    return np.repeat(np.tile([False, True], spans), interleaved)


class SpanCorruption(Task):
    """The ``span`` task."""

    kind = "span"
    Options = SpanCorruptionOptions
    target_fields = frozenset({"labels", "decoder_input_ids"})
    packable = False

    @cached_property
    def raw_length(self) -> int:
        return span_lengths(self.options.max_length, self.options.noise_density, self.options.mean_noise_span_length)[0]

    @cached_property
    def targets_length(self) -> int:
        return span_lengths(self.options.max_length, self.options.noise_density, self.options.mean_noise_span_length)[1]

    @cached_property
    def sentinels(self) -> tuple[int, int]:
        """``(first sentinel id, number available)``."""
        tok = self.tok
        first = self.options.sentinel_start
        available = first + 1 if first is not None else 0
        if first is None:
            vocab = tok.backend.get_vocab(with_added_tokens=True)
            named = {int(m.group(1)): i for t, i in vocab.items()  # the prefix test spares a regex per token
                     if t.startswith("<extra_id_") and (m := re.fullmatch(r"<extra_id_(\d+)>", t))}
            if 0 in named:
                first = named[0]
                available = 0
                while available in named and named[available] == first - available:
                    available += 1
            else:  # ordinary vocabulary ids would silently stand in for sentinels
                raise SpecError(
                    f"task span: tokenizer {tok.name!r} has no sentinel tokens <extra_id_0>, <extra_id_1>, ...; "
                    "use a T5-style tokenizer (e.g. t5-base), add them as special tokens, or set "
                    "task.sentinel_start to the id of the first of a run of reserved ids (later ones count down)")
        spans = _lengths(self.raw_length, self.options.noise_density, self.options.mean_noise_span_length)[1]
        if spans > available:
            raise TaskError(
                f"span: max_length {self.options.max_length} needs {spans} sentinels but tokenizer {tok.name!r} has "
                f"{available} (<extra_id_0> .. <extra_id_{available - 1}>); lower max_length or set task.sentinel_start"
            )
        return first, available

    @classmethod
    def check_spec(cls, spec: Any) -> None:
        """Concatenated rows are all one width: ``bucket`` could neither sort nor rebuild them."""
        if spec.task.options.concat_documents and spec.batching.strategy == "bucket":
            raise SpecError(
                "batching.strategy: 'bucket' cannot hold span rows of concatenated documents (every row is already "
                "max_length wide); use strategy 'pad', or set task.concat_documents: false"
            )

    def stream(self, examples: Dataset[Example]) -> Dataset[Example]:
        """Concatenate documents into full rows (default), or pass per-document rows through."""
        if not self.options.concat_documents:
            return examples
        from feedline._tasks.span_stream import SpanStream

        return SpanStream(examples, self)

    def process(self, records: Sequence[Record]) -> list[TaskOutput]:
        opts: SpanCorruptionOptions = self.options
        _ = self.sentinels  # fail early when the tokenizer has too few sentinels
        eos = self.tok.special("eos")
        raw = self.raw_length
        out: list[TaskOutput] = []
        for rec, ids in zip(records, self.tok.encode_batch([r.data["text"] for r in records]), strict=True):
            if opts.concat_documents:  # the document's tokens and EOS; SpanStream cuts and corrupts
                if len(ids) == 0:
                    out.append(self.reject(rec, "too_short", "span corruption needs at least 1 token"))
                    continue
                doc = ids if ids[-1] == eos else np.append(ids, eos)
                out.append([self.example(rec, 0, input_ids=doc.astype(np.int32))])
                continue
            exs = []
            for j, s in enumerate(range(0, len(ids), raw)):
                chunk = ids[s:s + raw]
                if len(chunk) < 2 or (opts.overflow == "truncate" and j > 0):
                    break
                exs.append(self.example(rec, j, **self.corrupt(chunk, self.rng(rec, j))))
            out.append(exs if exs else self.reject(rec, "too_short", "span corruption needs at least 2 tokens"))
        return out

    def corrupt(self, chunk: np.ndarray, rng: np.random.Generator) -> dict[str, np.ndarray]:
        """The fields of one raw chunk: ``input_ids``, ``labels``, ``decoder_input_ids``."""
        opts: SpanCorruptionOptions = self.options
        first, _ = self.sentinels
        start = opts.decoder_start_token_id if opts.decoder_start_token_id is not None else self.tok.pad_id
        mask = noise_mask(len(chunk), opts.noise_density, opts.mean_noise_span_length, rng)
        inputs, labels = _corrupt(chunk, mask, first, self.tok.special("eos"))
        dec = np.concatenate([[start], labels[:-1]]).astype(np.int32)
        return {"input_ids": inputs, "labels": labels, "decoder_input_ids": dec}


def _corrupt(chunk: np.ndarray, mask: np.ndarray, first: int, eos: int) -> tuple[np.ndarray, np.ndarray]:
    """Inputs (noise spans -> sentinels) and targets (non-noise spans -> sentinels), EOS appended."""
    prev = np.concatenate([[False], mask[:-1]])
    starts = mask & ~prev                                  # first token of each noise span
    sentinel = first - (np.cumsum(starts) - 1)             # sentinel of the span a noise token is in
    inputs = np.where(starts, sentinel, chunk)[~mask | starts]
    t_starts = ~mask & np.concatenate([[True], mask[:-1]])  # first token of each non-noise span
    t_sentinel = first - (np.cumsum(t_starts) - 1)
    targets = np.where(t_starts, t_sentinel, chunk)[mask | t_starts]
    return np.append(inputs, eos).astype(np.int32), np.append(targets, eos).astype(np.int32)
