"""The task protocol.

A task turns a *chunk* of records into examples. It tokenizes the chunk itself (in one batched,
GIL-free call) because what to tokenize is task-specific (plain text, sentence pairs, chat
turns). Per-sample randomness comes from :func:`feedline._core.rng.sample_rng` keyed by
``(seed, epoch, record key, sub)``, so output never depends on chunking or threads::

    class Upper(Task):
        kind = "upper"
        Options = UpperOptions                     # a frozen dataclass

        def process(self, records):
            ids = self.tok.encode_batch([r.data["text"].upper() for r in records])
            return [[self.example(r, 0, input_ids=i, labels=i)] for r, i in zip(records, ids)]

``process`` returns, for each record, a list of examples (a record may give several, or none)
or a :class:`~feedline._core.record.Rejection`. Fields are 1-D arrays per token, or 0-D arrays
per example; :attr:`Task.pad_values` tells batchers how to pad each token field.

Two class attributes describe fields that are *not* aligned with ``input_ids`` (batchers and
packers read them; both default to empty, so older tasks are unaffected):

* :attr:`Task.vector_fields`: fixed-size per-example vectors (a multi-hot ``labels`` of
  ``num_labels``, an inference ``key`` of 3). Batchers stack them like 0-D fields; they are
  never padded along the token axis and never packed.
* :attr:`Task.target_fields`: token fields with their own length (the decoder side of an
  encoder-decoder task: ``labels`` and ``decoder_input_ids`` of ``span``). Batchers pad them to
  their own longest row; packers must not pack them with ``input_ids``.

:attr:`Task.packable` is ``False`` for tasks whose rows must not be packed (classification,
inference, encoder-decoder).

A task whose examples join several records (``span`` concatenates documents into full rows)
overrides :meth:`Task.stream` to put a stage of its own after the task map; that stage keeps the
refs of the examples it holds in its state and rebuilds them through its parent (``rebuild``).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np

from feedline._core.block import ExampleBlock
from feedline._core.dataset import Dataset
from feedline._core.record import Example, Record, Rejection
from feedline._core.rng import sample_rng
from feedline._tokenize.tokenizer import Tokenizer

__all__ = ["PAD_VALUES", "Task", "TaskContext", "TaskOutput"]

TaskOutput = list[Example] | Rejection

#: How batchers pad the conventional token fields; ``"pad_id"`` means the tokenizer's pad id.
PAD_VALUES: dict[str, Any] = {
    "input_ids": "pad_id", "labels": -100, "attention_mask": 0, "token_type_ids": 0,
    "position_ids": 0, "decoder_input_ids": "pad_id", "special_tokens_mask": 1, "loss_mask": 0,
}


@dataclass(frozen=True)
class TaskContext:
    """What a task is built with: the tokenizer (``None`` for tokenizer-free tasks), the seed and,
    when built by a pipeline, ``records``: a picklable factory of one unshuffled epoch of the
    corpus, for tasks that need a first pass over the data (``None`` in unit tests). Settings
    of the spec a task cannot work with are refused by its :meth:`Task.check_spec` hook."""

    tokenizer: Tokenizer | None
    seed: int
    records: Callable[[], Iterable[Record]] | None = field(default=None, compare=False)


class Task(ABC):
    """Base class of tasks. Subclasses set ``kind`` and ``Options`` and implement :meth:`process`."""

    kind: ClassVar[str]
    Options: ClassVar[type]
    #: Token fields whose pad value differs from :data:`PAD_VALUES` (or that are new).
    extra_pad_values: ClassVar[dict[str, Any]] = {}
    #: Field that batchers' length budget counts (usually ``input_ids``).
    length_field: ClassVar[str] = "input_ids"
    #: Fixed-size per-example vector fields: stacked, never padded along tokens, never packed.
    vector_fields: ClassVar[frozenset[str]] = frozenset()
    #: Token fields with their own length (decoder side): padded to their own longest row.
    target_fields: ClassVar[frozenset[str]] = frozenset()
    #: Whether rows of this task may be packed several to a row.
    packable: ClassVar[bool] = True
    #: The ``batching.remainder`` this task uses when the spec names none (``None``: the spec's default).
    default_remainder: ClassVar[str | None] = None
    #: Whether the task takes pre-tokenized records (``{"input_ids": int32 array}``, from the
    #: ``tokens``/``megatron``/``flat`` formats) as well as text.
    accepts_tokens: ClassVar[bool] = False
    #: Whether :meth:`process_block` on a run of pre-tokenized records
    #: (:class:`~feedline._core.documents.TokenRecords`) is a copy, cheaper than handing the chunk
    #: to a thread: the task map's thread runner then processes such chunks in the reading thread.
    inline_runs: ClassVar[bool] = False
    #: Whether the task reads each record whole (a chat conversation) rather than a text field: a
    #: source of the spec that writes no ``text:`` then keeps records whole, as ``text: null`` does.
    whole_records: ClassVar[bool] = False

    @classmethod
    def check_spec(cls, spec: Any) -> None:
        """Refuse spec settings this task cannot work with (:class:`~feedline.errors.SpecError`).

        Called by ``Spec.load`` once the spec is built; the default accepts everything.
        """
        return None

    def __init__(self, options: Any, ctx: TaskContext) -> None:
        self.options = options
        self.ctx = ctx
        self.seed = ctx.seed

    @property
    def tok(self) -> Tokenizer:
        if self.ctx.tokenizer is None:
            from feedline.errors import TaskError

            raise TaskError(f"task {self.kind!r} needs a tokenizer; set tokenizer: in the spec")
        return self.ctx.tokenizer

    @property
    def max_length(self) -> int | None:
        """The sequence length examples are built for (batchers default to it)."""
        return getattr(self.options, "max_length", None)

    @property
    def pad_values(self) -> dict[str, Any]:
        """Concrete pad value per token field."""
        pad_id = self.ctx.tokenizer.pad_id if self.ctx.tokenizer is not None else 0
        vals = {**PAD_VALUES, **self.extra_pad_values}
        return {k: (pad_id if v == "pad_id" else v) for k, v in vals.items()}

    @abstractmethod
    def process(self, records: Sequence[Record]) -> list[TaskOutput]:
        """Turn records into examples; one entry per record, in order."""

    def process_block(self, records: Sequence[Record]) -> list[TaskOutput] | ExampleBlock:
        """The chunk's examples as the task map takes them: :meth:`process`'s list by default.

        A task that builds a whole chunk as arrays returns an :class:`~feedline._core.block.ExampleBlock`
        (the same examples, as columns; ``clm`` does) and defines :meth:`process` as
        ``self.process_block(records).outputs(len(records))``.
        """
        return self.process(records)

    def stream(self, examples: Dataset[Example]) -> Dataset[Example]:
        """The example stream the batcher reads: ``examples`` (the task map's output) by default.

        Override to add a stage that joins examples across records; that stage rebuilds the
        examples named in its state through ``examples.rebuild`` on resume.
        """
        return examples

    # ----------------------------------------------------------------- helpers
    def rng(self, record: Record, sub: int = 0, stream: int = 0) -> np.random.Generator:
        """The per-sample generator for ``record`` (and sub-example ``sub``).

        Use a different ``stream`` for each independent decision (e.g. 0 for masking, 1 for
        document-level choices), so changing one never shifts the draws of another.
        """
        return sample_rng(self.seed, record.epoch, record.key, sub, stream)

    @staticmethod
    def example(record: Record, sub: int, **fields: np.ndarray) -> Example:
        return Example(record.key, record.epoch, sub, dict(fields))

    @staticmethod
    def reject(record: Record, reason: str, detail: str = "") -> Rejection:
        """A :class:`Rejection` for a record this task cannot use (counted and reported by reason)."""
        return Rejection(f"record {tuple(record.key)}", None, reason, detail, key=record.key)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.options!r})"
