"""Spec validation: errors name the key path, the value, what is allowed and a close match."""

from __future__ import annotations

import json

import pytest

from feedline import Spec, SpecError

BASE = {"sources": ["corpus.jsonl"], "tokenizer": "tok.json", "task": {"kind": "clm", "max_length": 64},
        "batching": {"strategy": "pad", "batch_size": 4}}


def with_(**changes: object) -> dict:
    return {**BASE, **changes}


@pytest.mark.parametrize(
    ("spec", "needle"),
    [
        (with_(task={"kind": "mln"}), "task.kind: 'mln' is not a task; did you mean 'mlm'?"),
        (with_(task={"kind": "clm", "max_lenght": 5}), "task.max_lenght: unknown key; did you mean 'max_length'?"),
        (with_(task={"kind": "clm", "max_length": "long"}), "task.max_length: expected an integer, got 'long'"),
        (with_(task={"kind": "clm", "overflow": "spilt"}), "task.overflow: 'spilt' is not allowed; did you mean 'split'?"),
        (with_(batching={"strategy": "padd"}), "batching.strategy: 'padd' is not a strategy; did you mean 'pad'?"),
        (with_(batching={"strategy": "pad", "batch_size": 0}), "batching.batch_size: 0 must be a positive integer"),
        (with_(seeed=1), "seeed: unknown key; did you mean 'seed'?"),
        (with_(on_error="ignore"), "on_error: 'ignore' is not allowed"),
        (with_(sources=[{"path": "x", "fromat": "jsonl"}]), "sources[0].fromat: unknown key; did you mean 'format'?"),
        (with_(sources=[{"path": "x", "weight": -1}]), "weight: -1.0 must be > 0"),
        (with_(sources=[]), "sources: at least one source is required"),
        (with_(epochs=0), "epochs: 0 must be >= 1"),
    ],
)
def test_errors_name_key_value_and_fix(spec: dict, needle: str) -> None:
    with pytest.raises(SpecError) as e:
        Spec.load(spec)
    assert needle in str(e.value)


def test_hash_is_stable_and_sensitive() -> None:
    a = Spec.load(BASE)
    assert a.hash() == Spec.load(json.loads(json.dumps(BASE))).hash()
    assert a.hash() != Spec.load(with_(seed=1)).hash()
    assert a.hash() != Spec.load(with_(task={"kind": "clm", "max_length": 65})).hash()
    # Placement and performance knobs do not change the batches, so not the hash either.
    assert a.hash() == Spec.load(with_(workers=3, prefetch=9)).hash()


def test_file_specs_resolve_relative_paths(tmp_path) -> None:
    (tmp_path / "spec.yaml").write_text("sources: [data/*.jsonl]\ntask: {kind: clm}\nbatching: {batch_size: 2}\n")
    (tmp_path / "spec.json").write_text(json.dumps({"source": "data/a.jsonl", "batching": {"batch_size": 2}}))
    assert Spec.load(tmp_path / "spec.yaml").sources[0].path == str(tmp_path / "data/*.jsonl")
    assert Spec.load(str(tmp_path / "spec.json")).sources[0].path == str(tmp_path / "data/a.jsonl")


def test_bad_files_raise_spec_errors(tmp_path) -> None:
    (tmp_path / "bad.yaml").write_text("sources: [a\n")
    with pytest.raises(SpecError, match="not valid YAML"):
        Spec.load(tmp_path / "bad.yaml")
    (tmp_path / "list.yaml").write_text("- a\n")
    with pytest.raises(SpecError, match="a mapping at the top level"):
        Spec.load(tmp_path / "list.yaml")
    with pytest.raises(SpecError, match="spec file not found"):
        Spec.load(tmp_path / "missing.yaml")


def test_shorthands() -> None:
    s = Spec.load({"source": "a.jsonl", "task": "clm", "shuffle": 100, "batching": {"batch_size": 2}})
    assert s.sources[0].path == "a.jsonl" and s.task.kind == "clm" and s.shuffle is not None and s.shuffle.buffer == 100
    assert Spec.load({**BASE, "shuffle": False}).shuffle is None
