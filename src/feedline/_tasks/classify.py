"""Sequence classification: single-label, multi-label and regression, with optional text pairs.

Text (and ``text_pair``) is encoded with the tokenizer's own template (``[CLS] A [SEP] B [SEP]``
for BERT, ``<s> A </s></s> B </s>`` for RoBERTa, nothing for GPT-2), truncated longest-first to
``max_length``. The label field may hold a name, an id, a list of either, or a string of ids
or names joined by ``label_separator`` (GoEmotions' ``"3,27"``)::

    task: {kind: classify, label: label, labels: [negative, positive]}                 # names
    task: {kind: classify, label: labels, multi_label: true, num_labels: 28,
           label_type: id, label_separator: ","}                                      # GoEmotions
    task: {kind: classify, label: score, problem_type: regression}

``labels`` per problem type, as Hugging Face's ``ForSequenceClassificationLoss`` expects:

    single_label_classification   0-D int64 class id         (CrossEntropy)
    multi_label_classification    float32 multi-hot [num_labels]  (BCEWithLogits; a vector field)
    regression                    0-D float32                (MSE)

**Label vocabulary.** Ids come from ``labels`` (names in id order) when given. Otherwise, for
label names, the vocabulary is collected in a deterministic first pass over the spec's sources
(one epoch, unshuffled): the sorted set of names. It is written to ``label_vocab`` when that
path is set (and read from it on later runs, so a resumed run uses the same ids even if the
data grew) — save it beside your checkpoint and the loader state, and put it in the model's
``id2label``. :func:`feedline._tools.labels.label_vocabulary` returns it without a loader.

Rows are never packed (:attr:`packable` is false): a classifier pools one position per row.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

import numpy as np

from feedline._core.record import Record, get_path
from feedline._tasks.base import Task, TaskOutput
from feedline.errors import SpecError, TaskError

__all__ = ["Classify", "ClassifyOptions", "label_names"]

Problem = Literal["single_label_classification", "multi_label_classification", "regression"]


@dataclass(frozen=True, kw_only=True)
class ClassifyOptions:
    """Options of the ``classify`` task.

    Attributes:
        max_length: tokens per row, special tokens included.
        label: record field (dotted path) holding the label(s).
        text_pair: record field holding a second text; rows become pairs.
        problem_type: as Hugging Face's ``config.problem_type``; ``multi_label: true`` is a shorthand.
        multi_label: shorthand for ``problem_type: multi_label_classification``.
        labels: the label names in id order (the vocabulary); collected when absent.
        num_labels: number of classes (default: ``len(labels)``).
        label_type: ``auto`` (integers are ids, strings names), ``id`` (strings are parsed as ids) or ``name``.
        label_separator: split string labels on this (``","`` for ``"3,27"``).
        label_vocab: JSON file the collected vocabulary is written to and read back from.
    """

    max_length: int = 512
    label: str = "label"
    text_pair: str | None = None
    problem_type: Problem = "single_label_classification"
    multi_label: bool = False
    labels: tuple[str, ...] | None = None
    num_labels: int | None = None
    label_type: Literal["auto", "id", "name"] = "auto"
    label_separator: str | None = None
    label_vocab: str | None = None

    def __post_init__(self) -> None:
        if self.max_length < 2:
            raise SpecError(f"task.max_length: {self.max_length} must be >= 2")
        if self.multi_label and self.problem_type == "regression":
            raise SpecError("task.multi_label: true contradicts task.problem_type: regression")
        if self.labels is not None and self.num_labels is not None and self.num_labels != len(self.labels):
            raise SpecError(f"task.num_labels: {self.num_labels} but task.labels has {len(self.labels)} names")

    @property
    def problem(self) -> Problem:
        return "multi_label_classification" if self.multi_label else self.problem_type


def _values(raw: Any, opts: ClassifyOptions) -> list[Any]:
    """The label values of one record, as a list (one item for single-label)."""
    items = list(raw) if isinstance(raw, (list, tuple)) else [raw]
    if opts.label_separator is not None:
        items = [p.strip() for v in items for p in (v.split(opts.label_separator) if isinstance(v, str) else [v])]
    out = []
    for v in items:
        if isinstance(v, str) and opts.label_type == "id":
            v = int(v)
        elif isinstance(v, (int, np.integer)) and not isinstance(v, bool) and opts.label_type == "name":
            v = str(v)
        out.append(v)
    return out


def label_names(opts: ClassifyOptions, records: Callable[[], Iterable[Record]] | None) -> list[str]:
    """The label names: given, read from ``label_vocab``, or collected from ``records()``.

    ``records`` is one unshuffled epoch of the corpus (the pipeline hands it to the task as
    ``TaskContext.records``); the result is the sorted set of names, so it does not depend on
    file order, shuffling or workers. A collected vocabulary is written to ``label_vocab``.
    """
    if opts.labels is not None:
        return list(opts.labels)
    if opts.label_vocab and os.path.exists(opts.label_vocab):
        with open(opts.label_vocab, encoding="utf-8") as f:
            return [str(x) for x in json.load(f)]
    if records is None:
        raise TaskError("classify: label names need task.labels (or a pipeline to collect them from)")
    names: set[str] = set()
    for rec in records():
        try:
            raw = get_path(rec.data, opts.label)
        except KeyError:
            continue
        for v in _values(raw, opts):
            if isinstance(v, str):
                names.add(v)
    vocab = sorted(names)
    if opts.label_vocab:
        os.makedirs(os.path.dirname(os.path.abspath(opts.label_vocab)), exist_ok=True)
        with open(opts.label_vocab, "w", encoding="utf-8") as f:
            json.dump(vocab, f, ensure_ascii=False, indent=0)
    return vocab


class Classify(Task):
    """The ``classify`` task."""

    kind = "classify"
    Options = ClassifyOptions
    packable = False
    extra_pad_values: ClassVar[dict[str, Any]] = {"labels": -100}

    def __init__(self, options: ClassifyOptions, ctx: Any) -> None:
        super().__init__(options, ctx)
        self._vocab: dict[str, int] | None = None
        self._lock = threading.Lock()
        if options.problem == "multi_label_classification":
            self.vector_fields = frozenset({"labels"})  # type: ignore[misc]

    # ----------------------------------------------------------------- vocabulary
    @property
    def vocab(self) -> dict[str, int]:
        """Label name -> id (collected on first use when not given)."""
        if self._vocab is None:
            with self._lock:
                if self._vocab is None:
                    names = self._names()
                    self._vocab = {n: i for i, n in enumerate(names)}
        return self._vocab

    def _names(self) -> list[str]:
        opts: ClassifyOptions = self.options
        if opts.labels is not None:
            return list(opts.labels)
        if opts.label_type == "id" or opts.problem == "regression":
            return []
        return label_names(opts, self.ctx.records)

    def __getstate__(self) -> dict[str, Any]:
        """Picklable (Ray ships tasks to workers): the vocabulary is resolved first, the lock left behind."""
        _ = self.vocab
        state = dict(self.__dict__)
        del state["_lock"]
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()

    @property
    def num_labels(self) -> int | None:
        opts: ClassifyOptions = self.options
        if opts.num_labels is not None:
            return opts.num_labels
        if opts.labels is None and opts.label_type == "id":
            return None
        return len(self.vocab) or None

    # ----------------------------------------------------------------- examples
    def _encode(self, records: Sequence[Record]) -> list[tuple[np.ndarray, np.ndarray]]:
        opts: ClassifyOptions = self.options
        backend = self.tok.backend
        firsts = backend.encode_batch_fast([r.data["text"] for r in records], add_special_tokens=False)
        pairs = None
        if opts.text_pair is not None:
            texts = [r.data.get(opts.text_pair) if isinstance(r.data.get(opts.text_pair), str) else "" for r in records]
            pairs = backend.encode_batch_fast(texts, add_special_tokens=False)
        out = []
        for i, a in enumerate(firsts):
            b = pairs[i] if pairs is not None else None
            budget = opts.max_length - backend.num_special_tokens_to_add(b is not None)
            la, lb = len(a.ids), len(b.ids) if b is not None else 0
            while la + lb > budget and la + lb > 0:
                if la >= lb:
                    la -= 1
                else:
                    lb -= 1
            a.truncate(la)
            if b is not None:
                b.truncate(lb)
            enc = backend.post_process(a, b, add_special_tokens=True)
            out.append((np.asarray(enc.ids, np.int32), np.asarray(enc.type_ids, np.int32)))
        return out

    def _target(self, raw: Any) -> np.ndarray | str:
        """The ``labels`` array of one record, or a rejection reason."""
        opts: ClassifyOptions = self.options
        if opts.problem == "regression":
            try:
                return np.asarray(float(raw), dtype=np.float32)
            except (TypeError, ValueError):
                return f"bad_label: {raw!r} is not a number"
        try:
            values = _values(raw, opts)
        except ValueError:
            return f"bad_label: {raw!r} is not an integer id (task.label_type: id)"
        ids = []
        n = self.num_labels
        for v in values:
            if isinstance(v, str):
                if v not in self.vocab:
                    return f"unknown_label: {v!r} is not in the label vocabulary"
                ids.append(self.vocab[v])
            elif isinstance(v, (int, np.integer)) and not isinstance(v, bool):
                if v < 0 or (n is not None and v >= n):
                    return f"unknown_label: id {v} is outside [0, {n})"
                ids.append(int(v))
            else:
                return f"bad_label: {v!r}"
        if opts.problem == "single_label_classification":
            if len(ids) != 1:
                return f"bad_label: {len(ids)} labels for a single-label task (set multi_label: true?)"
            return np.asarray(ids[0], dtype=np.int64)
        if n is None:
            raise TaskError("classify: multi_label needs task.num_labels or task.labels")
        hot = np.zeros(n, dtype=np.float32)
        hot[ids] = 1.0
        return hot

    def process(self, records: Sequence[Record]) -> list[TaskOutput]:
        opts: ClassifyOptions = self.options
        encoded = self._encode(records)
        out: list[TaskOutput] = []
        for rec, (ids, types) in zip(records, encoded, strict=True):
            try:
                raw = get_path(rec.data, opts.label)
            except KeyError:
                out.append(self.reject(rec, "missing_label", f"no field {opts.label!r} (task.label)"))
                continue
            if opts.text_pair is not None and not isinstance(rec.data.get(opts.text_pair), str):
                out.append(self.reject(rec, "missing_field", f"no text field {opts.text_pair!r} (task.text_pair)"))
                continue
            target = self._target(raw)
            if isinstance(target, str):
                reason, _, detail = target.partition(": ")
                out.append(self.reject(rec, reason, detail))
                continue
            fields = {"input_ids": ids, "labels": target}
            if opts.text_pair is not None:
                fields["token_type_ids"] = types
            out.append([self.example(rec, 0, **fields)])
        return out
