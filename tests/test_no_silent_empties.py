"""A run never ends empty or on part of the data without saying so."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import feedline
from feedline.errors import SourceError, SpecError
from feedline.testing import make_corpus


def _spec(path: str, tok: str, **over: object) -> dict[str, object]:
    return {"sources": [{"path": path}], "tokenizer": tok, "task": {"kind": "clm", "max_length": 16, "overflow": "truncate"},
            "batching": {"strategy": "pad", "batch_size": 64}, **over}


def test_dropping_the_only_batch_is_an_error_naming_the_fix(tmp_path: Path, small_tokenizer: str) -> None:
    make_corpus(tmp_path / "c", files=1, docs=20)
    spec = _spec(str(tmp_path / "c"), small_tokenizer)
    with pytest.raises(SpecError, match=r"fewer than batching.batch_size=64.*remainder: keep"):
        list(feedline.Loader(spec))
    kept = list(feedline.Loader({**spec, "batching": {"strategy": "pad", "batch_size": 64, "remainder": "keep"}}))
    assert len(kept) == 1 and 0 < len(kept[0]["input_ids"]) < 64
    # a later short batch is still dropped quietly: the stream delivered full batches before it
    full = list(feedline.Loader({**spec, "batching": {"strategy": "pad", "batch_size": 8}}))
    assert full and all(len(b["input_ids"]) == 8 for b in full)


def test_an_unreadable_file_stops_the_run_unless_told_to_skip(tmp_path: Path, small_tokenizer: str,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    import builtins

    from feedline._sources import files

    make_corpus(tmp_path / "c", files=2, docs=20)
    bad = sorted((tmp_path / "c").iterdir())[0]
    real_open = builtins.open

    def denied(path: object, *args: object, **kwargs: object) -> object:  # root reads any mode: deny this one file
        if os.fspath(path) == str(bad):  # type: ignore[arg-type]
            raise PermissionError(13, "Permission denied", str(bad))
        return real_open(path, *args, **kwargs)  # type: ignore[call-overload]

    monkeypatch.setattr(files, "open", denied, raising=False)  # the readers' one way to open a file's bytes
    spec = _spec(str(tmp_path / "c"), small_tokenizer, batching={"strategy": "pad", "batch_size": 2})
    with pytest.raises(SourceError, match=rf"{bad.name}.*Permission denied.*on_unreadable: skip"):
        list(feedline.Loader(spec))
    loader = feedline.Loader({**spec, "on_unreadable": "skip"})
    assert list(loader)
    assert loader.stats()["rejected"].get("unreadable") == 1


def test_an_unreachable_dataset_is_an_error(monkeypatch: pytest.MonkeyPatch, small_tokenizer: str) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # no hub here: fail at once instead of retrying for ~25 s
    datasets = pytest.importorskip("datasets")
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)  # read at import: set it if imported
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    spec = {"sources": [{"hf": "feedline-tests/no-such-dataset"}], "tokenizer": small_tokenizer,
            "task": {"kind": "clm", "max_length": 16}, "batching": {"strategy": "pad", "batch_size": 2}}
    with pytest.raises(SourceError, match="no-such-dataset.*load_dataset failed"):
        list(feedline.Loader(spec))


@pytest.mark.parametrize("pattern", ["*.jsonl", ""])  # a glob, and the folder itself
def test_a_dangling_link_a_glob_matches_is_unreadable_not_skipped(tmp_path: Path, small_tokenizer: str,
                                                                  pattern: str) -> None:
    make_corpus(tmp_path / "c", files=2, docs=20)
    (tmp_path / "c" / "z-gone.jsonl").symlink_to(tmp_path / "moved-away.jsonl")
    spec = _spec(str(tmp_path / "c" / pattern), small_tokenizer, batching={"strategy": "pad", "batch_size": 2})
    with pytest.raises(SourceError, match=r"z-gone\.jsonl: a link to .*moved-away\.jsonl, which does not exist.*on_unreadable: skip"):
        list(feedline.Loader(spec))
    loader = feedline.Loader({**spec, "on_unreadable": "skip"})
    assert len(list(loader)) == 20  # the two real files' 40 documents, two a step
    assert loader.stats()["rejected"] == {"unreadable": 1}
