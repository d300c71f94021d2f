"""The spec declared by its dataclasses: sections through build, hash exclusion as field metadata,
registries handed in, the task's check_spec hook, and serve's flags generated from ServerOptions."""

from __future__ import annotations

import argparse
import dataclasses
import subprocess
import sys
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

import pytest

from feedline import Spec, SpecError
from feedline._batching.registry import batcher_class
from feedline._cli.options import add_option_arguments, options_from_args
from feedline._service.server import ServerOptions
from feedline._spec import Registry
from feedline._tasks.clm import CausalLM

BASE = {"sources": ["corpus.jsonl"], "tokenizer": "tok.json", "task": {"kind": "clm", "max_length": 64},
        "batching": {"strategy": "pad", "batch_size": 4}}


def test_hash_covers_exactly_the_fields_not_marked_hash_false() -> None:
    base = Spec.load(BASE)
    changed = {"sources": ["other.jsonl"], "task": {"kind": "clm", "max_length": 65},
               "batching": {"strategy": "pad", "batch_size": 8}, "tokenizer": "t2.json", "seed": 9, "epochs": 2,
               "mix": {"stopping": "cycle"}, "transforms": [{"filter": "os.path:isabs"}], "shuffle": 16, "on_error": "raise", "workers": 3,
               "prefetch": 9, "streams": {"val": "v.yaml"}, "reject_limit": 5, "root": "/elsewhere", "on_unreadable": "skip",
               "partitions": 2, "parallel": {"placement": "processes", "processes": 2},
               "tokenizer_backend": {"path": "tok.json", "backend": "hf"}}
    internal = {"relative", "whole"}  # set by loading (paths written relative to root, sources read whole), not keys
    assert set(changed) == {f.name for f in dataclasses.fields(Spec)} - internal  # a new field needs a case here
    for name, value in changed.items():
        hashed = dataclasses.fields(Spec)[[f.name for f in dataclasses.fields(Spec)].index(name)].metadata.get("hash", True)
        key = "tokenizer" if name == "tokenizer_backend" else name  # the backend is written as tokenizer: {path, backend}
        spec = Spec.load({**BASE, key: value})
        assert getattr(spec, name) != getattr(base, name)
        same = spec.hash() == base.hash()
        assert same is not hashed, f"{name}: hashed={hashed} but changing it {'kept' if same else 'changed'} the hash"


class Strict(CausalLM):
    """A plug-in that refuses an endless stream through the check_spec hook."""

    kind: ClassVar[str] = "strict"

    @classmethod
    def check_spec(cls, spec: Any) -> None:
        if spec.epochs is None:
            raise SpecError("task strict: needs a finite number of epochs")


def test_registries_are_handed_to_spec_load_and_check_spec_is_called() -> None:
    reg = Registry(task=lambda kind: Strict if kind == "strict" else pytest.fail(kind), batcher=batcher_class)
    spec = Spec.load({**BASE, "task": {"kind": "strict", "max_length": 8}}, registry=reg)
    assert spec.task.options.max_length == 8
    with pytest.raises(SpecError, match="needs a finite number of epochs"):
        Spec.load({**BASE, "task": "strict", "epochs": None}, registry=reg)


def test_sections_take_their_defaults_from_the_dataclasses() -> None:
    spec = Spec.load({"sources": "c.jsonl"})
    assert (spec.task.kind, spec.batching.strategy, spec.batching.batch_size, spec.batching.remainder) == ("clm", "pad", 8, "drop")
    assert Spec.load({**BASE, "shuffle": 5}).shuffle.buffer == 5  # type: ignore[union-attr]
    with pytest.raises(SpecError, match="batching.remainder: 'dorp' is not allowed; did you mean 'drop'"):
        Spec.load({**BASE, "batching": {"remainder": "dorp"}})


@dataclass(frozen=True, kw_only=True)
class Knobs:
    """Knobs of a made-up command.

    Attributes:
        rate: per second.
        mode: ``fast`` or ``slow``.
        limit: optional cap.
        loud: shout.
        quiet: keep quiet (on by default).
    """

    rate: float = 2.5
    mode: Literal["fast", "slow"] = "fast"
    limit: int | None = None
    loud: bool = False
    quiet: bool = True
    blob: dict[str, int] | None = None  # not a flag: the command handles it


def test_flags_are_generated_from_any_options_dataclass() -> None:
    parser = argparse.ArgumentParser()
    add_option_arguments(parser, Knobs)
    assert options_from_args(Knobs, parser.parse_args([])) == Knobs()
    got = options_from_args(Knobs, parser.parse_args(["--rate", "4", "--mode", "slow", "--limit", "7", "--loud", "--no-quiet"]))
    assert got == Knobs(rate=4.0, mode="slow", limit=7, loud=True, quiet=False)
    with pytest.raises(SystemExit):
        parser.parse_args(["--blob", "x"])
    assert "per second. (default: 2.5)" in parser.format_help()


@pytest.mark.slow
def test_serve_has_a_flag_for_every_simple_server_option_with_its_default() -> None:
    out = subprocess.run([sys.executable, "-m", "feedline", "serve", "--help"], capture_output=True, text=True, check=True).stdout
    parser = argparse.ArgumentParser()
    add_option_arguments(parser, ServerOptions, skip={"keys", "progress"})
    built = options_from_args(ServerOptions, parser.parse_args([]), skip={"keys", "progress"})
    assert built == ServerOptions()
    spelled = {"state_file": "--state"}  # serve's own flags for options it handles itself
    for f in dataclasses.fields(ServerOptions):
        if f.name not in ("keys", "progress"):
            assert spelled.get(f.name, "--" + f.name.replace("_", "-")) in out, f.name


@dataclass(frozen=True, kw_only=True)
class _Inner:
    n: int = 1


@dataclass(frozen=True, kw_only=True)
class _Outer:
    inner: _Inner = _Inner()
    mode: Literal["a", "b"] = "a"


def test_build_reads_each_class_annotations_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """A class's type hints are evaluated on its first build only (each call compiled every string
    annotation again: ~2 ms a spec load); later builds check keys and values the same way."""
    from feedline._core import options

    seen: list[type] = []
    real = options.get_type_hints
    monkeypatch.setattr(options, "get_type_hints", lambda cls: seen.append(cls) or real(cls))
    for n in range(3):
        assert options.build(_Outer, {"inner": {"n": n}, "mode": "b"}, "x") == _Outer(inner=_Inner(n=n), mode="b")
    assert seen == [_Outer, _Inner]
    with pytest.raises(SpecError, match=r"x\.inner\.nn: unknown key; did you mean 'n'\?"):
        options.build(_Outer, {"inner": {"nn": 1}}, "x")
    with pytest.raises(SpecError, match=r"x\.mode: 'c' is not allowed"):
        options.build(_Outer, {"mode": "c"}, "x")
    with pytest.raises(SpecError, match=r"x\.inner\.n: expected an integer"):
        options.build(_Outer, {"inner": {"n": "1"}}, "x")
