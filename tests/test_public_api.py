"""The public surface is deliberate: a sorted __all__ that is exactly the public namespace."""

from __future__ import annotations

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
    return sorted(n for n, v in vars(module).items() if not n.startswith("_") and not isinstance(v, types.ModuleType))


def test_all_is_exactly_the_public_namespace() -> None:
    """Every public name is exported and every export is public (httpx's exported-members test)."""
    import feedline.tasks

    for module in (feedline, feedline.tasks):
        assert module.__all__ == _public_names(module), module.__name__


def test_the_plugin_surface_is_importable_from_the_top_and_from_tasks() -> None:
    import feedline.tasks
    from feedline.core.record import Example, Record, Rejection
    from feedline.tasks.base import Task, TaskOutput

    for name, obj in {"Record": Record, "Example": Example, "Rejection": Rejection, "TaskOutput": TaskOutput, "Task": Task}.items():
        assert getattr(feedline, name) is obj, name
        assert getattr(feedline.tasks, name) is obj, name


def test_in_process_and_remote_loaders_are_both_loaders(tmp_path: Path, small_tokenizer: str) -> None:
    from feedline.loader import InProcessLoader
    from feedline.service.client import RemoteLoader
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
