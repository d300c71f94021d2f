"""Restores ask the parent: buffers rebuild their contents through their own recipe's parent chain."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from feedline._batching.base import BatchContext
from feedline._batching.registry import batcher_class
from feedline._core.dataset import Dataset, DatasetIterator, State
from feedline._core.record import Example, ExampleRef
from feedline._pipeline import Pipeline
from feedline.errors import StateError
from feedline.testing import assert_stage_resumes, make_corpus


class Shifted(Dataset[Example]):
    """A stage between the task and the batcher that changes examples (adds 1 to every token id)."""

    def __init__(self, parent: Dataset[Example]) -> None:
        self.parent = parent

    @staticmethod
    def shift(ex: Example) -> Example:
        return replace(ex, fields={**ex.fields, "input_ids": ex.fields["input_ids"] + 1})

    def rebuild(self, refs: Sequence[ExampleRef]) -> list[Example]:
        return [self.shift(ex) for ex in self.parent.rebuild(refs)]

    def __iter__(self) -> Iterator[Example]:
        return _ShiftedIterator(self)


class _ShiftedIterator(DatasetIterator[Example]):
    def __init__(self, ds: Shifted) -> None:
        self.parent = iter(ds.parent)

    def __next__(self) -> Example:
        return Shifted.shift(next(self.parent))

    def get_state(self) -> State:
        return self.parent.get_state()

    def set_state(self, state: Mapping[str, Any]) -> None:
        self.parent.set_state(state)

    def close(self) -> None:
        self.parent.close()


def _pipeline(tmp: Path, tokenizer: str, strategy: str) -> Pipeline:
    make_corpus(tmp / "c", files=2, docs=6, max_words=50)
    return Pipeline({"sources": [str(tmp / "c")], "tokenizer": tokenizer, "seed": 4, "epochs": 2, "shuffle": {"buffer": 5},
                     "task": {"kind": "clm", "max_length": 16}, "workers": 1,
                     "batching": {"strategy": strategy, "batch_size": 2, "remainder": "keep"}})


@pytest.mark.parametrize("strategy", ["pack", "bucket", "concat"])
def test_a_stage_between_task_and_batcher_is_part_of_the_restore(strategy: str, tmp_path: Path, small_tokenizer: str) -> None:
    p = _pipeline(tmp_path, small_tokenizer, strategy)
    b = p.spec.batching
    batcher = batcher_class(b.strategy)(Shifted(p.examples()), b.options, BatchContext(batch_size=2, task=p.task, seed=4))
    assert assert_stage_resumes(batcher, check=2, every=2) >= 3


def test_task_map_rebuilds_refs_in_one_task_call(tmp_path: Path, small_tokenizer: str) -> None:
    p = _pipeline(tmp_path, small_tokenizer, "pad")
    examples = p.examples()
    it = iter(examples)
    made = [next(it) for _ in range(7)]
    it.close()
    calls: list[int] = []
    process = p.task.process
    p.task.process = lambda records: calls.append(len(records)) or process(records)  # type: ignore[method-assign]
    refs = [ex.ref for ex in reversed(made)] + [made[0].ref]
    again = examples.rebuild(refs)
    assert calls == [len({r[:4] for r in refs})]
    for a, b in zip(again, [*reversed(made), made[0]], strict=True):
        assert a.ref == b.ref and np.array_equal(a.fields["input_ids"], b.fields["input_ids"])


def test_the_bottom_of_a_chain_that_cannot_fetch_says_so() -> None:
    class Bare(Dataset[int]):
        def __iter__(self) -> Any:
            return iter(())

    with pytest.raises(StateError, match="Bare has no parent to fetch from"):
        Bare().fetch([(0, 0, 0)])
