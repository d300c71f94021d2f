"""Records from a list of input paths (for corpus tools that take files, not a spec).

    >>> for rec in read_inputs(["a.jsonl.zst", "books/"], text="text"):    # doctest: +SKIP
    ...     print(rec.key, rec.data["text"][:20])

Input ``i`` is source ``i``; each is read once in file order, with the same readers, codecs and
rejection accounting as a spec's sources.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from feedline._core.record import Record
from feedline._core.report import Rejections
from feedline._sources.source import FileSource
from feedline._spec import SourceSpec

__all__ = ["read_inputs"]


def read_inputs(paths: Sequence[str], *, format: str = "auto", text: str | None = "text",
                on_error: str = "skip", rejections: Rejections | None = None) -> Iterator[Record]:
    """Yield the records of each path in turn; rejections are added to ``rejections``."""
    for i, path in enumerate(paths):
        src = FileSource(SourceSpec(path=path, format=format, text=text), i, seed=0, shuffle_splits=False,
                         epochs=1, on_error=on_error)
        it = iter(src)
        try:
            yield from it
        finally:
            it.close()
            if rejections is not None:
                for reason, n in it.rejections.counts.items():
                    rejections.counts[reason] = rejections.counts.get(reason, 0) + n
                rejections.samples.extend(it.rejections.samples)
