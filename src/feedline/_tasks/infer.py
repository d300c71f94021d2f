"""Batch inference: every record exactly once, in source order, each row carrying its key.

Each record becomes one row: its text encoded with the tokenizer's template (special tokens
added), truncated to ``max_length`` (or rejected, ``overflow: reject``). Rows carry ``key``, the
record's ``(source, file, position)`` as a ``[3]`` int64 vector (a :attr:`vector_fields`
entry: stacked, never padded along tokens); rows added to fill the last batch have key
``-1``. The raw text is not put in the batch (batches are numeric arrays end to end, over
ZeroMQ and into torch/jax); :func:`feedline._tools.predictions.join_predictions` re-reads it by
key instead::

    spec = {"sources": [{"path": "queries.jsonl"}], "tokenizer": "tok.json",
            "task": {"kind": "infer", "max_length": 512},
            "batching": {"strategy": "pad", "batch_size": 64, "remainder": "keep"}}
    keys, preds = [], []
    for batch in feedline.Loader(spec):
        keys.append(batch["key"]); preds.append(model(batch))
    rows = join_predictions(spec, np.concatenate(keys), np.concatenate(preds))
    # [{"key": (0, 0, 0), "record": {"text": ...}, "prediction": ...}, ...]

The task refuses specs that would break "exactly once, in order" (its ``check_spec`` hook, which
``Spec.load`` calls): ``shuffle`` set, ``epochs`` other than 1, or ``remainder: drop``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

import numpy as np

from feedline._core.record import Record
from feedline._tasks.base import Task, TaskOutput
from feedline.errors import SpecError

__all__ = ["Infer", "InferOptions"]


@dataclass(frozen=True, kw_only=True)
class InferOptions:
    """Options of the ``infer`` task.

    Attributes:
        max_length: tokens per row, special tokens included; ``None`` keeps whole texts.
        add_special_tokens: frame the text with the tokenizer's template ([CLS] … [SEP]).
        overflow: ``truncate`` long texts, or ``reject`` them (counted, reported).
    """

    max_length: int | None = 512
    add_special_tokens: bool = True
    overflow: Literal["truncate", "reject"] = "truncate"

    def __post_init__(self) -> None:
        if self.max_length is not None and self.max_length < 1:
            raise SpecError(f"task.max_length: {self.max_length} must be >= 1")


class Infer(Task):
    """The ``infer`` task."""

    kind = "infer"
    Options = InferOptions
    vector_fields = frozenset({"key"})
    packable = False
    #: Every record once: the last short batch is kept unless the spec says ``remainder: pad``.
    default_remainder: ClassVar[str] = "keep"
    extra_pad_values: ClassVar[dict[str, Any]] = {"key": -1}

    @classmethod
    def check_spec(cls, spec: Any) -> None:
        """Every record exactly once, in order: no shuffling, one epoch, no dropped remainder."""
        if spec.shuffle is not None and (spec.shuffle.buffer > 1 or spec.shuffle.shards):
            raise SpecError("task infer: records must come in source order; remove shuffle: from the spec")
        if spec.epochs != 1:
            raise SpecError(f"task infer: every record exactly once needs epochs: 1 (got {spec.epochs})")
        if spec.batching.remainder == "drop":
            raise SpecError("task infer: the last short batch must not be dropped; set batching.remainder: keep (or pad)")

    def process(self, records: Sequence[Record]) -> list[TaskOutput]:
        opts: InferOptions = self.options
        backend = self.tok.backend
        encs = backend.encode_batch_fast([r.data["text"] for r in records], add_special_tokens=False)
        special = backend.num_special_tokens_to_add(False) if opts.add_special_tokens else 0
        out: list[TaskOutput] = []
        for rec, enc in zip(records, encs, strict=True):
            n = len(enc.ids) + special
            if opts.max_length is not None and n > opts.max_length:
                if opts.overflow == "reject":
                    out.append(self.reject(rec, "too_long", f"{n} tokens > max_length {opts.max_length}"))
                    continue
                enc.truncate(max(opts.max_length - special, 0))
            if opts.add_special_tokens:
                enc = backend.post_process(enc, None, add_special_tokens=True)
            ids = np.asarray(enc.ids, dtype=np.int32)
            key = np.asarray(rec.key, dtype=np.int64)
            out.append([self.example(rec, 0, input_ids=ids, key=key)])
        return out
