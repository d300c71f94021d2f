"""The public surface is deliberate: a sorted __all__ that is exactly the public namespace."""

from __future__ import annotations
import __future__

import importlib
import re
import types
from pathlib import Path

import pytest

import feedline
from feedline import errors


def test_all_is_sorted_and_importable() -> None:
    assert feedline.__all__ == sorted(feedline.__all__)
    for name in feedline.__all__:
        assert hasattr(feedline, name), name


def test_every_error_derives_from_the_root() -> None:
    for name in errors.__all__:
        cls = getattr(errors, name)
        assert issubclass(cls, feedline.FeedlineError), name


def _public_names(module: types.ModuleType) -> list[str]:
    return sorted(n for n, v in vars(module).items()
                  if not n.startswith("_") and not isinstance(v, (types.ModuleType, __future__._Feature)))


PUBLIC_MODULES = ["feedline", "feedline.errors", "feedline.jax", "feedline.ray", "feedline.service", "feedline.tasks",
                  "feedline.testing", "feedline.tools", "feedline.torch"]


def test_every_implementation_module_is_private() -> None:
    """A module is public only on purpose: every other module has a ``_`` name or sits in a ``_`` package."""
    src = Path(feedline.__file__).parent
    public = []
    for path in sorted(src.rglob("*.py")):
        parts = path.relative_to(src.parent).with_suffix("").parts
        if parts[-1] == "__main__":
            continue
        if parts[-1] == "__init__":
            parts = parts[:-1]
        if not any(p.startswith("_") for p in parts[1:]):
            public.append(".".join(parts))
    assert public == PUBLIC_MODULES


@pytest.mark.parametrize("name", [pytest.param(m, marks=pytest.mark.xdist_group("jax")) if m == "feedline.jax" else m
                                  for m in PUBLIC_MODULES])  # feedline.jax imports jax: on the JAX tests' worker
def test_all_is_exactly_the_public_namespace(name: str) -> None:
    """Every public name is exported and every export is public (httpx's exported-members test)."""
    module = importlib.import_module(name)
    assert module.__all__ == _public_names(module), name
    for export in module.__all__:
        assert getattr(getattr(module, export), "__module__", None) != name or name in ("feedline", "feedline.errors"), (
            f"{name}.{export} is defined in the public module; define it in a private one and re-export it")


def test_the_plugin_surface_is_importable_from_the_top_and_from_tasks() -> None:
    import feedline.tasks
    from feedline._core.record import Example, Record, Rejection
    from feedline._tasks.base import Task, TaskOutput

    for name, obj in {"Record": Record, "Example": Example, "Rejection": Rejection, "TaskOutput": TaskOutput, "Task": Task}.items():
        assert getattr(feedline, name) is obj, name
        assert getattr(feedline.tasks, name) is obj, name


def test_in_process_and_remote_loaders_are_both_loaders(tmp_path: Path, small_tokenizer: str) -> None:
    from feedline._loader import InProcessLoader
    from feedline._service.client import RemoteLoader
    from feedline.testing import make_corpus

    make_corpus(tmp_path / "c", files=1, docs=8)
    spec = {"sources": [str(tmp_path / "c")], "tokenizer": small_tokenizer, "batching": {"batch_size": 2}}
    with feedline.Loader(spec) as local:
        assert isinstance(local, feedline.Loader) and type(local) is InProcessLoader
        assert next(iter(local))["input_ids"].shape[0] == 2
    remote = feedline.Loader("tcp://127.0.0.1:9", rank=0, world_size=1)   # connects lazily: nothing is sent here
    try:
        assert isinstance(remote, feedline.Loader) and type(remote) is RemoteLoader
        assert issubclass(RemoteLoader, feedline.Loader) and not issubclass(dict, feedline.Loader)
    finally:
        remote.close()


def test_stream_is_refused_in_process(tmp_path: Path) -> None:
    with pytest.raises(feedline.SpecError, match="stream='validation'.*in-process.*service address"):
        feedline.Loader({"sources": [str(tmp_path)]}, stream="validation")


def test_examples_and_user_docs_use_only_public_paths() -> None:
    """What users copy (examples, README, the guides) never names a private module."""
    root = Path(__file__).resolve().parents[1]
    texts = [*sorted((root / "examples").glob("*.py")), root / "README.md",
             *(p for p in sorted((root / "docs").glob("*.md")) if p.name != "architecture.md")]
    private = re.compile(r"\bfeedline\._[a-z]")
    offenders = [f"{p.relative_to(root)}:{i}" for p in texts for i, line in enumerate(p.read_text().splitlines(), 1)
                 if private.search(line)]
    assert not offenders, offenders
