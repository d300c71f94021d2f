"""concat cuts whole rows from a block at once (cuts.cut_rows) and gives exactly the batches, states
and statistics of taking examples one at a time: long documents over several rows, rows closed at
max_docs_per_row, empty examples, blocks of any size, the end of the stream, resume at every step."""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from feedline import Loader
from feedline._batching.base import BatchContext
from feedline._batching.concat import ConcatBatcher, ConcatOptions
from feedline._batching.cuts import cut_rows
from feedline._core.block import ExampleBlock
from feedline._core.dataset import Dataset, DatasetIterator, State
from feedline._core.record import Example, ExampleRef
from feedline._pipeline import Pipeline
from feedline.testing import assert_resumes_exactly, collect


class Lengths(Dataset[Example]):
    """Examples of given lengths (token ids: the example's index * 1000 + position), in chunks of
    ``chunk``; ``blocks``: its iterator offers ``peek_block``/``consume`` like the task map's."""

    def __init__(self, lengths: Sequence[int], chunk: int, blocks: bool) -> None:
        self.lengths, self.chunk, self.blocks = list(lengths), chunk, blocks

    def example(self, i: int) -> Example:
        ids = (np.arange(self.lengths[i]) + 1000 * i).astype(np.int32)
        return Example((0, 0, i), 0, 0, {"input_ids": ids, "labels": ids})

    def rebuild(self, refs: Sequence[ExampleRef]) -> list[Example]:
        return [self.example(int(r[2])) for r in refs]

    def __iter__(self) -> Iterator[Example]:
        return _Blocks(self) if self.blocks else _OneByOne(self)


class _OneByOne(DatasetIterator[Example]):
    STATE_KEYS = ("at",)

    def __init__(self, ds: Lengths) -> None:
        self.ds, self.at = ds, 0

    def __next__(self) -> Example:
        if self.at >= len(self.ds.lengths):
            raise StopIteration
        self.at += 1
        return self.ds.example(self.at - 1)

    def own_state(self) -> State:
        return {"at": self.at}

    def restore(self, own: Mapping[str, Any]) -> None:
        self.at = int(own["at"])


class _Blocks(_OneByOne):
    def peek_block(self) -> ExampleBlock | None:
        if self.at >= len(self.ds.lengths):
            return None
        end = min(len(self.ds.lengths), (self.at // self.ds.chunk + 1) * self.ds.chunk)
        return ExampleBlock.from_examples([self.ds.example(i) for i in range(self.at, end)])

    def consume(self, n: int) -> None:
        self.at += n


def _run(lengths: Sequence[int], blocks: bool, *, chunk: int = 37, batch: int = 3, width: int = 16, docs: int = 4,
         restore_at: int | None = None, states: list[State] | None = None) -> tuple[list[dict], list[State]]:
    b = ConcatBatcher(Lengths(lengths, chunk, blocks), ConcatOptions(max_length=width, max_docs_per_row=docs),
                      BatchContext(batch_size=batch, task=_task(), seed=0))
    it = iter(b)
    if restore_at is not None and states is not None:
        it.set_state(json.loads(json.dumps(states[restore_at])))
    out, seen = [], []
    for batch_ in it:
        out.append(batch_)
        seen.append(json.loads(json.dumps(it.get_state())))
    return out, seen


_TASK: Any = None


def _task() -> Any:
    global _TASK
    if _TASK is None:
        from feedline._spec import Spec

        _TASK = Pipeline(Spec.load({"sources": [{"path": "unused.bin", "format": "flat", "tokens": {"eos": 0}}],
                                    "task": {"kind": "clm", "max_length": 16}})).task
    return _TASK


CASES = {
    "short": [1 + (i * 7) % 11 for i in range(300)],
    "long": [(i * 13) % 50 + 1 for i in range(120)],          # documents over several rows
    "tiny": [1 + i % 3 for i in range(400)],                   # rows closed at max_docs_per_row
    "empty": [0 if i % 5 == 0 else 1 + (i * 3) % 20 for i in range(250)],
    "exact": [4, 4, 8, 16, 2, 14, 16, 32] * 30,                # documents ending on row boundaries
}


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("chunk", [1, 37, 1000])
def test_blocks_give_the_batches_states_and_stats_of_one_at_a_time(case: str, chunk: int) -> None:
    lengths = CASES[case]
    want, want_states = _run(lengths, False)
    got, states = _run(lengths, True, chunk=chunk)
    assert len(got) == len(want) > 10
    for i, (a, b) in enumerate(zip(got, want, strict=True)):
        for k in b:
            assert np.array_equal(a[k], b[k]), (case, i, k)
    assert states == want_states
    for at in range(0, len(states), 3):  # resumed from any state, by the other path: the same batches
        rest, _ = _run(lengths, True, chunk=chunk, restore_at=at, states=want_states)
        assert len(rest) == len(want) - at - 1
        assert all(np.array_equal(a["input_ids"], b["input_ids"]) for a, b in zip(rest, want[at + 1:], strict=True))


def test_cut_rows_stops_before_a_row_over_the_cap() -> None:
    ends = np.cumsum([5, 3, 6, 1, 1, 1, 1, 7])
    cut = cut_rows(ends, 10, 4, 2)  # the fourth row would hold 3 pieces
    assert cut is not None and cut.rows == 3 and cut.docs.tolist() == [1, 2, 1]
    assert list(zip(cut.doc.tolist(), cut.start.tolist(), cut.stop.tolist())) == [(0, 0, 4), (0, 4, 5), (1, 0, 3), (2, 0, 4)]
    assert cut.used == 3 and cut.rest == 4 and cut.split.tolist() == [True, False, True]
    assert cut_rows(np.cumsum([1, 1, 1, 1, 1]), 2, 4, 3) is None  # the first row would hold 4 pieces
    assert cut_rows(np.cumsum([3]), 2, 4, 3) is None  # shorter than a row


@pytest.mark.slow
def test_pretokenized_concat_resumes_exactly_at_every_step(tmp_path: Path) -> None:
    rng = np.random.default_rng(3)
    docs = [np.append(rng.integers(1, 50000, int(n)), 50256) for n in rng.integers(1, 400, 400)]
    np.concatenate(docs).astype(np.uint16).tofile(tmp_path / "t.bin")
    spec = {"sources": [{"path": str(tmp_path / "t.bin"), "format": "flat", "tokens": {"dtype": "uint16", "eos": 50256}}],
            "task": {"kind": "clm", "max_length": 1024}, "batching": {"strategy": "concat", "batch_size": 4, "max_length": 256}}
    assert assert_resumes_exactly(spec, every=1, check=2) > 40
    rows = np.concatenate([b["input_ids"].reshape(-1) for b in collect(Loader(spec))])
    assert rows.tolist() == np.concatenate(docs)[:len(rows)].tolist()
