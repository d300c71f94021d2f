"""``engine`` folds into ``parallel`` (issue 34 item 5): one Ray ``address``, one ``num_cpus``.

An old spec with ``engine:`` keeps working: it reads as ``parallel: {map, address}`` with one
warning line, hashes the same, gives the same batches, and its states resume under the new
spelling (and the other way round); the two sections written with different values are refused,
naming both keys.
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np
import pytest

import feedline._spec.parse as spec_parse
from feedline import Loader, Spec, SpecError


def spec_for(corpus: str, tokenizer: str, **over: Any) -> dict[str, Any]:
    return {"sources": [{"path": corpus}], "tokenizer": tokenizer, "seed": 3, "shuffle": {"buffer": 64},
            "task": {"kind": "clm", "max_length": 64}, "batching": {"strategy": "pack", "batch_size": 4}, **over}


def folds(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if "engine" in r.getMessage()]


@pytest.fixture(autouse=True)
def untold(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test starts in a process that has told of no engine section (the warning is once per process)."""
    monkeypatch.setattr(spec_parse, "_told_engine", set())


def test_the_same_engine_section_is_told_of_once_per_process(caplog: pytest.LogCaptureFixture) -> None:
    base = spec_for("corpus.jsonl", "tok.json")
    with caplog.at_level(logging.WARNING, logger="feedline"):
        for _ in range(3):   # spec --check, then the loader, then a worker's rebuild: one line, not three
            Spec.load({**base, "engine": {"kind": "local", "num_cpus": 4}})
        Spec.load({**base, "engine": "ray"})   # another section is told of too
    assert len(folds(caplog)) == 2


def test_an_old_engine_spec_reads_as_parallel_with_one_warning_and_the_same_hash(
        caplog: pytest.LogCaptureFixture) -> None:
    base = spec_for("corpus.jsonl", "tok.json")
    with caplog.at_level(logging.WARNING, logger="feedline"):
        old = Spec.load({**base, "engine": {"kind": "ray", "address": "ray://head:10001", "num_cpus": 8},
                         "parallel": {"placement": "threads", "prefetch": 2}})
    (notice,) = folds(caplog)
    assert "\n" not in notice and "parallel: {map: ray, address: ray://head:10001}" in notice
    assert "num_cpus" in notice   # what is no longer read is said, with the way to get it
    assert (old.parallel.map, old.parallel.address, old.parallel.placement, old.parallel.prefetch) == \
        ("ray", "ray://head:10001", "threads", 2)
    assert not hasattr(old, "engine")
    new = Spec.load({**base, "parallel": {"placement": "threads", "prefetch": 2, "map": "ray",
                                          "address": "ray://head:10001"}})
    assert old == new and old.hash() == new.hash() == Spec.load(base).hash()
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="feedline"):
        again = Spec.load(old.to_dict())   # what another process is handed: the new spelling, no warning
    assert again == old and "engine" not in old.to_dict() and folds(caplog) == []
    with caplog.at_level(logging.WARNING, logger="feedline"):   # the string shorthand, beside parallel's
        short = Spec.load({**base, "engine": "ray", "parallel": "processes"})
    assert (short.parallel.map, short.parallel.placement) == ("ray", "processes") and len(folds(caplog)) == 1


@pytest.mark.parametrize(("engine", "parallel", "named"), [
    ({"kind": "ray", "address": "ray://a:10001"}, {"address": "ray://b:10001"}, ("engine.address", "parallel.address")),
    ("ray", {"map": "local"}, ("engine.kind", "parallel.map")),
    ({"kind": "local"}, {"map": "ray"}, ("engine.kind", "parallel.map")),
])
def test_engine_and_parallel_disagreeing_is_refused_naming_both(engine: Any, parallel: Any,
                                                               named: tuple[str, str]) -> None:
    with pytest.raises(SpecError) as e:
        Spec.load({**spec_for("corpus.jsonl", "tok.json"), "engine": engine, "parallel": parallel})
    assert all(k in str(e.value) for k in named) and "remove engine" in str(e.value)


def test_an_old_engine_spec_gives_the_same_batches_and_states_resume_both_ways(
        corpus: str, small_tokenizer: str, caplog: pytest.LogCaptureFixture) -> None:
    old = spec_for(corpus, small_tokenizer, engine={"kind": "local"})
    new = spec_for(corpus, small_tokenizer, parallel={"map": "local"})
    with caplog.at_level(logging.WARNING, logger="feedline"), Loader(old) as a:
        it = iter(a)
        want = [next(it) for _ in range(6)]
        state = a.state_dict()
        tail = [next(it) for _ in range(4)]
    assert len(folds(caplog)) == 1
    with Loader(new) as b:
        it = iter(b)
        got = [next(it) for _ in range(6)]
    for x, y in zip(want, got, strict=True):
        assert x.keys() == y.keys() and all(np.array_equal(x[k], y[k]) for k in x)
    with Loader(new, state=state) as resumed:   # an old spec's state resumes under the new spelling
        it = iter(resumed)
        again = [next(it) for _ in range(4)]
        back = resumed.state_dict()
    for x, y in zip(tail, again, strict=True):
        assert all(np.array_equal(x[k], y[k]) for k in x)
    with Loader(old, state=back) as b2:   # and the other way round
        next(iter(b2))
