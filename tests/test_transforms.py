"""The spec's record transforms (map/filter): exact resume at every stop point, stats, errors, hashing, processes."""

from __future__ import annotations

import json
import os
import random
import re
from pathlib import Path

import pytest

import feedline
import record_transforms
from conftest import shared
from feedline import Pipeline, Spec
from feedline.errors import SpecError, StateError, TransformError
from feedline.testing import assert_stage_resumes


def spec(**extra: object) -> dict:
    c4 = str(shared("prose", "c4_demo.jsonl"))
    kjv = str(shared("prose", "wiki_demo.txt"))
    return {"sources": [{"path": c4}, {"path": kjv, "format": "text"}], "seed": 3, "task": {"kind": "clm"},
            "transforms": [{"filter": "record_transforms:short"}, {"map": "record_transforms:tagged"}], **extra}


def texts(s: dict) -> list[str]:
    it = iter(Pipeline(s).records())
    try:
        return [r.data["text"] for r in it]
    finally:
        it.close()


def test_transforms_filter_and_map_in_spec_order() -> None:
    raw = texts({**spec(), "transforms": []})
    got = texts(spec())
    assert got == [record_transforms.tagged({"text": t})["text"] for t in raw if len(t) < 2000]
    assert 0 < len(got) < len(raw)


@pytest.mark.parametrize("shuffle", [None, 64])
@pytest.mark.slow
def test_the_transform_stage_resumes_exactly_at_every_step(shuffle: int | None) -> None:
    s = spec(shuffle=shuffle, epochs=2)
    # every state, before the first record and after each, restores to the same continuation
    assert assert_stage_resumes(Pipeline(s).records(), every=7, check=3) > 50


@pytest.mark.slow
def test_loader_resumes_at_random_steps_and_counts_filtered(gpt2_path: str) -> None:
    s = spec(tokenizer=gpt2_path, shuffle=40, workers=2, task={"kind": "clm", "max_length": 64},
             batching={"strategy": "pad", "batch_size": 8})
    with feedline.Loader(s) as loader:
        full = [b["input_ids"].tolist() for b in loader]
        stats = loader.stats()
    assert stats["filtered"] == len(texts({**spec(), "transforms": []})) - len(texts(spec()))
    assert stats["rejected"] == {}
    rng = random.Random(0)
    for stop in rng.sample(range(1, len(full)), 3):
        with feedline.Loader(s) as loader:
            it = iter(loader)
            head = [next(it)["input_ids"].tolist() for _ in range(stop)]
            state = json.loads(json.dumps(loader.state_dict()))
        with feedline.Loader(s) as resumed:
            resumed.load_state_dict(state)
            assert head + [b["input_ids"].tolist() for b in resumed] == full, stop
            assert resumed.stats()["filtered"] == stats["filtered"]


def test_a_python_callable_hashes_as_its_import_path_and_a_lambda_works_in_process() -> None:
    by_path = Spec.load(spec())
    by_callable = Spec.load(spec(transforms=[{"filter": record_transforms.short}, {"map": record_transforms.tagged}]))
    assert by_path.hash() == by_callable.hash()
    assert by_callable.to_dict()["transforms"] == [{"filter": "record_transforms:short"}, {"map": "record_transforms:tagged"}]
    plain = Spec.load({**spec(), "transforms": []})
    assert plain.hash() != by_path.hash() and "transforms" not in plain.to_dict()
    lam = spec(transforms=[{"filter": lambda r: len(r["text"]) < 2000}, {"map": record_transforms.tagged}])
    assert texts(lam) == texts(spec())


def test_a_transform_that_raises_names_the_record_file_and_line() -> None:
    s = spec(transforms=[{"filter": "record_transforms:fails_on_the_seventh"}])
    with pytest.raises(TransformError, match=r"c4_demo\.jsonl:7: transforms\[0\] \(filter record_transforms:"
                                              r"fails_on_the_seventh, \S*record_transforms\.py:\d+\) raised ValueError "
                                              r"at \S*record_transforms\.py:\d+: cannot classify") as e:
        texts(s)
    assert e.value.path.endswith("c4_demo.jsonl") and isinstance(e.value.line, int)
    with pytest.raises(TransformError, match=r"returned str, not a dict"):
        texts(spec(transforms=[{"map": "record_transforms:not_a_dict"}]))


@pytest.mark.parametrize(("step", "said"), [
    ({"map": "record_transforms:drops_text"}, r"returned a record without 'text' \(it has: (no fields|[a-z_, ]+)\); "
                                              "a map must keep the text field"),
    ({"map": "record_transforms:text_to_int"}, r"set 'text' to int, not a str"),
    ({"filter": "record_transforms:array_filter"}, r"returned ndarray, which is neither true nor false \(ValueError: "
                                                   r"The truth value of an array"),
])
def test_a_wrong_return_is_a_transform_error_naming_the_step_and_its_line(
        step: dict[str, str], said: str, gpt2_path: str) -> None:
    """Each gave a raw error from deep inside (KeyError from the task, TypeError, ValueError)."""
    kind, path = next(iter(step.items()))
    line = getattr(record_transforms, path.split(":")[1]).__code__.co_firstlineno
    s = spec(tokenizer=gpt2_path, transforms=[step], task={"kind": "clm", "max_length": 64},
             batching={"strategy": "pad", "batch_size": 8})
    with pytest.raises(TransformError) as e, feedline.Loader(s) as loader:
        list(loader)
    assert re.match(rf"\S*c4_demo\.jsonl:1: transforms\[0\] \({kind} {path}, \S*record_transforms\.py:{line}\) "
                    + said, str(e.value)), str(e.value)
    assert e.value.path.endswith("c4_demo.jsonl") and e.value.line == 1


def test_a_transform_module_failing_at_import_is_a_transform_error(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """It raised the module's RuntimeError, raw."""
    (tmp_path / "broken_transforms.py").write_text("import os\n\nraise RuntimeError('needs a GPU')\n\n"
                                                   "def f(r):\n    return r\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(TransformError, match=r"^transforms\[0\]\.map: importing 'broken_transforms' raised "
                                             r"RuntimeError at \S*broken_transforms\.py:3: needs a GPU; "):
        Spec.load(spec(transforms=[{"map": "broken_transforms:f"}]))


def _stream(s: dict) -> tuple[list[list[int]], dict]:
    with feedline.Loader(s) as loader:
        return [b["input_ids"].tolist() for b in loader], loader.stats()


@pytest.mark.slow
def test_a_text_a_map_empties_or_grows_is_counted_as_the_same_record_on_disk(gpt2_path: str, tmp_path: Path) -> None:
    """A map emptying ~10 % of texts gave EOS-only rows and rejected {}. Now the records it empties or
    makes too large are counted (and rejected) as the same records written to disk are."""
    c4 = str(shared("prose", "c4_demo.jsonl"))
    common = {"tokenizer": gpt2_path, "task": {"kind": "clm", "max_length": 64},
              "batching": {"strategy": "pad", "batch_size": 8}}
    mapped = {**common, "sources": [{"path": c4, "max_record_bytes": 50_000}],
              "transforms": [{"filter": "record_transforms:short"}, {"map": "record_transforms:empties_or_grows"}]}
    disk = tmp_path / "mapped.jsonl"
    with disk.open("w") as f:
        for r in texts({**mapped, "transforms": []}):
            if record_transforms.short({"text": r}):
                f.write(json.dumps(record_transforms.empties_or_grows({"text": r}), ensure_ascii=False) + "\n")
    got, stats = _stream(mapped)
    want, on_disk = _stream({**common, "sources": [{"path": str(disk), "max_record_bytes": 50_000}]})
    assert got == want
    assert stats["rejected"] == on_disk["rejected"] and set(stats["rejected"]) == {"empty", "too_large"}
    assert min(stats["rejected"].values()) >= 5 and stats["filtered"] > 0
    with pytest.raises(feedline.RecordError, match=r"c4_demo\.jsonl:\d+: (empty|too_large) \(.*transforms\[1\] "
                                                   r"\(map record_transforms:empties_or_grows"):
        _stream({**mapped, "on_error": "raise"})


def test_bad_transform_specs_are_refused_up_front() -> None:
    with pytest.raises(SpecError, match=r"transforms\[0\]\.filter: 'record_transforms' has no 'shrt'; did you mean 'short'"):
        Spec.load(spec(transforms=[{"filter": "record_transforms:shrt"}]))
    with pytest.raises(SpecError, match="not an import path"):
        Spec.load(spec(transforms=[{"map": "record_transforms.tagged"}]))
    with pytest.raises(SpecError, match="one of"):
        Spec.load(spec(transforms=[{"map": "a:b", "filter": "a:b"}]))
    with pytest.raises(SpecError, match=r"transforms\[0\]\.mapp: unknown key; did you mean 'map'"):
        Spec.load(spec(transforms=[{"mapp": "a:b"}]))


def test_fetch_by_key_gives_the_transformed_record() -> None:
    it = iter(Pipeline(spec()).records())
    rec = next(it)
    it.close()
    assert Pipeline(spec()).fetch([rec.key])[rec.key] == rec.data and rec.data["text"].startswith("[")


def test_a_changed_filter_is_refused_on_restore_of_the_shuffle_buffer() -> None:
    s = spec(shuffle=30)
    it = iter(Pipeline(s).records())
    [next(it) for _ in range(5)]
    state = it.get_state()
    it.close()
    other = iter(Pipeline(spec(shuffle=30, transforms=[{"filter": lambda r: len(r["text"]) >= 2000}])).records())
    with pytest.raises(StateError, match="now filtered out"):
        other.set_state(state)
    other.close()


@pytest.mark.slow
def test_import_paths_travel_to_a_served_process(gpt2_path: str, tmp_path: Path) -> None:
    from feedline._cli.commands.stats import fetch_stats
    from feedline.service import serve_process

    s = spec(tokenizer=gpt2_path, task={"kind": "clm", "max_length": 64}, batching={"strategy": "pad", "batch_size": 8})
    with feedline.Loader(s) as local:
        want = [b["input_ids"].tolist() for b in local]
        filtered = local.stats()["filtered"]
    path = tmp_path / "spec.json"
    path.write_text(json.dumps(s))
    env = {"PYTHONPATH": os.pathsep.join([str(Path(__file__).parent), os.environ.get("PYTHONPATH", "")])}
    with serve_process(str(path), env=env) as address, feedline.Loader(address) as remote:
        assert [b["input_ids"].tolist() for b in remote] == want
        assert fetch_stats(address)["streams"]["train"]["filtered"] == filtered


@pytest.mark.slow
def test_partitions_in_processes_run_import_paths_and_resume_exactly(gpt2_path: str) -> None:
    s = spec(tokenizer=gpt2_path, shuffle=30, partitions=2, task={"kind": "clm", "max_length": 64},
             batching={"strategy": "pad", "batch_size": 8})
    with feedline.Loader({**s, "parallel": {"placement": "threads"}}) as threads:
        want = [b["input_ids"].tolist() for b in threads]
        filtered = threads.stats()["filtered"]
    procs = {**s, "parallel": {"placement": "processes"}}
    stop = random.Random(1).randrange(1, len(want))
    with feedline.Loader(procs) as loader:
        it = iter(loader)
        head = [next(it)["input_ids"].tolist() for _ in range(stop)]
        state = json.loads(json.dumps(loader.state_dict()))
    with feedline.Loader(procs) as resumed:
        resumed.load_state_dict(state)
        assert head + [b["input_ids"].tolist() for b in resumed] == want
        assert resumed.stats()["filtered"] == filtered
    with pytest.raises(SpecError, match="Can't pickle local object|cannot start a worker"), \
            feedline.Loader({**procs, "transforms": [{"filter": lambda r: True}]}) as loader:
        next(iter(loader))
