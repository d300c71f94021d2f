"""Whitespace word counts of any inputs, as ``word<TAB>count`` TSV (the input of ``train-tokenizer``).

    >>> counts = count_tokens(["shard-0.jsonl.zst"])                 # doctest: +SKIP
    >>> write_counts(counts, "counts-0.tsv")                         # doctest: +SKIP
    >>> merged = count_tokens(["counts-0.tsv", "counts-1.tsv"])      # doctest: +SKIP

An input that is a ``.tsv`` (optionally compressed) whose first line is ``word<TAB>count`` is a
count file and is merged, so shards can be counted apart and summed; any other input is read as
a source (any format, codec, glob or directory) and its text split on whitespace. The output is
sorted by count (descending), then word. Memory holds the vocabulary, never the text.
"""

from __future__ import annotations

import collections
import os
from collections.abc import Sequence

from feedline._core.report import Rejections
from feedline._sources.files import open_binary, strip_codec
from feedline._sources.inputs import read_inputs
from feedline._tools.progress import track
from feedline.errors import SourceError

__all__ = ["count_tokens", "is_count_file", "write_counts"]


def is_count_file(path: str) -> bool:
    """True for a ``.tsv`` whose first line is ``word<TAB>integer``."""
    if not strip_codec(path).lower().endswith(".tsv") or not os.path.isfile(path):
        return False
    with open_binary(path) as f:
        first = f.readline().decode("utf-8", errors="replace").rstrip("\r\n").split("\t")
    return len(first) == 2 and first[1].strip().isdigit()


def count_tokens(inputs: Sequence[str], *, lowercase: bool = False, format: str = "auto", text: str = "text",
                 rejections: Rejections | None = None) -> collections.Counter[str]:
    """Word counts of ``inputs`` (count files merged, other inputs read as sources)."""
    counts: collections.Counter[str] = collections.Counter()
    sources = []
    for path in inputs:
        if is_count_file(path):
            _merge(path, counts)
        else:
            sources.append(path)
    for rec in track(read_inputs(sources, format=format, text=text, rejections=rejections), "count-tokens"):
        t = rec.data["text"]
        counts.update((t.lower() if lowercase else t).split())
    return counts


def _merge(path: str, counts: collections.Counter[str]) -> None:
    with open_binary(path) as f:
        for n, raw in enumerate(f, 1):
            parts = raw.decode("utf-8", errors="replace").rstrip("\r\n").split("\t")
            if len(parts) != 2 or not parts[1].strip().isdigit():
                raise SourceError(f"{path}:{n}: expected 'word<TAB>count', got {raw[:60]!r}")
            counts[parts[0]] += int(parts[1])


def write_counts(counts: collections.Counter[str], path: str, *, min_count: int = 1) -> int:
    """Write ``word<TAB>count`` lines (``-`` for standard output); returns the number of words written."""
    import sys

    rows = sorted(((w, c) for w, c in counts.items() if c >= min_count), key=lambda wc: (-wc[1], wc[0]))
    out = sys.stdout if path == "-" else open(path, "w", encoding="utf-8", newline="\n")  # noqa: SIM115
    try:
        for w, c in rows:
            out.write(f"{w}\t{c}\n")
    finally:
        if out is not sys.stdout:
            out.close()
    return len(rows)
