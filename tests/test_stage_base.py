"""The stage base class: state nesting from declared keys, StateError naming the stage, recursive close."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar

import pytest

from feedline._core.dataset import DatasetIterator, State
from feedline._pipeline import GlobalStream, Pipeline
from feedline.errors import StateError
from feedline.testing import make_corpus


class Leaf(DatasetIterator[int]):
    STATE_KEYS = ("i",)

    def __init__(self) -> None:
        self.i = 0
        self.released = 0

    def __next__(self) -> int:
        self.i += 1
        return self.i

    def own_state(self) -> State:
        return {"i": self.i}

    def restore(self, own: Mapping[str, Any]) -> None:
        self.i = int(own["i"])

    def release(self) -> None:
        self.released += 1


class Doubling(DatasetIterator[int]):
    """Writes only its own field; the base nests the parent's state under "parent"."""

    NAME = "doubling"
    STATE_KEYS = ("seen", "tag")
    STATE_DEFAULTS: ClassVar[Mapping[str, Any]] = {"tag": "none"}  # a key added later: older states without it still load

    def __init__(self, parent: DatasetIterator[int]) -> None:
        self.parent = parent
        self.seen = 0
        self.tag = "none"

    def __next__(self) -> int:
        self.seen += 1
        return 2 * next(self.parent)

    def own_state(self) -> State:
        return {"seen": self.seen, "tag": self.tag}

    def restore(self, own: Mapping[str, Any]) -> None:
        self.seen, self.tag = int(own["seen"]), str(own["tag"])


def test_each_stage_writes_its_own_keys_and_the_base_nests_the_parent() -> None:
    it = Doubling(Leaf())
    next(it), next(it)
    assert it.get_state() == {"parent": {"i": 2}, "seen": 2, "tag": "none"}
    fresh = Doubling(Leaf())
    fresh.set_state({"parent": {"i": 5}, "seen": 5})  # saved before "tag" existed
    assert fresh.get_state() == {"parent": {"i": 5}, "seen": 5, "tag": "none"}
    assert next(fresh) == 12


@pytest.mark.parametrize("bad", [{"seen": 1}, {"parent": {"i": 1}}, {"parent": {"i": "x"}, "seen": 1}, None])
def test_a_malformed_state_is_a_state_error_naming_the_stage(bad: Any) -> None:
    with pytest.raises(StateError, match=r"(doubling|Leaf): malformed state .*expected keys"):
        Doubling(Leaf()).set_state(bad)


def test_close_releases_every_stage_down_the_chain_and_is_idempotent() -> None:
    leaf = Leaf()
    it = Doubling(Doubling(leaf))
    it.close()
    it.close()
    assert leaf.released == 2


def test_a_pipeline_stage_reports_a_bad_state_with_its_name(tmp_path: Path, small_tokenizer: str) -> None:
    make_corpus(tmp_path / "c", files=1, docs=5)
    p = Pipeline({"sources": [str(tmp_path / "c")], "tokenizer": small_tokenizer, "shuffle": {"buffer": 3},
                  "batching": {"strategy": "pack", "batch_size": 2}})
    it = iter(GlobalStream(p))
    good = it.get_state()
    bad = {**good, "pipeline": {**good["pipeline"], "parent": {**good["pipeline"]["parent"], "parent": {"counter": 0}}}}
    with pytest.raises(StateError, match="shuffle buffer: malformed state"):
        it.set_state(bad)
    it.close()
