"""feedline.testing's conformance helpers: what they check and what they cost."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import feedline._testing as testing
from feedline._loader import InProcessLoader
from feedline.testing import assert_resumes_exactly, make_corpus


def test_restored_loaders_make_only_the_batches_they_compare_and_the_last_prefetches(
        tmp_path: Path, small_tokenizer: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each restored loader but the last makes its batches in the caller's thread (``prefetch=0``): no
    batch made past the ``check`` it compares (before: up to ``prefetch`` more a restore); the last keeps
    the spec's prefetch, so a restore under a prefetching loader stays checked."""
    made: list[list[int]] = []  # per loader built by the helper: [prefetch, batches made]

    class Counting(InProcessLoader):
        def __init__(self, *a: Any, **kw: Any) -> None:
            super().__init__(*a, **kw)
            made.append([self.prefetch, 0])

        def _rank_stream(self) -> Any:
            entry, stream = made[-1], super()._rank_stream()

            class Counted:
                def __iter__(self) -> Any:
                    return self

                def __next__(self) -> Any:
                    got = next(stream)
                    entry[1] += 1
                    return got

                def __getattr__(self, name: str) -> Any:
                    return getattr(stream, name)

            return Counted()  # type: ignore[return-value]

    monkeypatch.setattr(testing, "Loader", Counting)
    spec = {"sources": make_corpus(tmp_path, files=2, docs=30), "tokenizer": small_tokenizer, "seed": 3,
            "task": {"kind": "clm", "max_length": 32}, "batching": {"strategy": "pack", "batch_size": 4}, "prefetch": 2}
    points = assert_resumes_exactly(spec, every=5, check=3, limit=20)
    restored = made[1:]
    assert points == len(restored) >= 4 and made[0][0] == 2
    assert all(p == 0 and n == 3 for p, n in restored[:-1]), restored  # exactly the 3 batches compared
    assert restored[-1][0] == 2  # the last restore runs under the spec's prefetch
