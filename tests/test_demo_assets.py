"""The demo's corpus and tokenizer are built once per cache folder, whole, by whichever builder finishes."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

import feedline._demo.corpus as demo_corpus


def test_two_builders_at_once_both_finish_with_whole_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    paragraphs = demo_corpus._paragraphs()[:300]
    nested: list[tuple[Path, Path]] = []
    started: list[bool] = []

    def slow_paragraphs() -> Iterator[str]:
        for i, p in enumerate(paragraphs):
            if i == 1 and not started:   # a second builder starts and finishes while the first is writing
                started.append(True)
                nested.append(demo_corpus.ensure_demo_assets(tmp_path))
            yield p

    monkeypatch.setattr(demo_corpus, "_paragraphs", slow_paragraphs)
    corpus, tok_dir = demo_corpus.ensure_demo_assets(tmp_path)
    assert nested == [(corpus, tok_dir)]
    assert [json.loads(line)["text"] for line in corpus.read_text(encoding="utf-8").splitlines()] == paragraphs
    assert (tok_dir / "tokenizer.json").is_file()
    assert sorted(p.name for p in corpus.parent.iterdir()) == [corpus.name, tok_dir.name]   # no temporaries left
