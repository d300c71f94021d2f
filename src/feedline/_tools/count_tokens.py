"""Counts of any inputs' words or tokens, as ``word<TAB>count`` TSV (words: the input of ``train-tokenizer``).

    >>> counts = count_tokens(["shard-0.jsonl.zst"])                 # doctest: +SKIP
    >>> write_counts(counts, "counts-0.tsv")                         # doctest: +SKIP
    >>> merged = count_tokens(["counts-0.tsv", "counts-1.tsv"])      # doctest: +SKIP
    >>> gpt2 = count_tokens(["shard-0.jsonl.zst"], tokenizer="gpt2/")  # doctest: +SKIP
    >>> gpt2.most_common(1)                                          # doctest: +SKIP
    [('Ġthe', 50211)]

Without a tokenizer the text is split on whitespace (words, what ``train-tokenizer`` trains
from); with one, each text is encoded as a task would (no special tokens) and its tokens are
counted under their vocabulary strings (``Ġthe``, ``##ing``, ``▁the``), so the counts sum to the
tokens a run reads. An input that is a ``.tsv`` (optionally compressed) whose first line is
``word<TAB>count`` is a count file and is merged, so shards can be counted apart and summed;
any other input is read as a source (any format, codec, glob or directory). The output is
sorted by count (descending), then word; a token holding a tab or line break is written with
``\\t``, ``\\n``, ``\\r``. Memory holds the vocabulary, never the text.
"""

from __future__ import annotations

import collections
import itertools
import os
from collections.abc import Iterable, Sequence

import numpy as np

from feedline._core.report import Rejections
from feedline._sources.files import open_binary, strip_codec
from feedline._sources.inputs import read_inputs
from feedline._tokenize.tokenizer import Tokenizer
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
                 rejections: Rejections | None = None, tokenizer: str | Tokenizer | None = None) -> collections.Counter[str]:
    """Counts of ``inputs``: whitespace-separated words, or with ``tokenizer`` (a path, hub name or
    :class:`~feedline.Tokenizer`) its tokens by vocabulary string; count files are merged."""
    counts: collections.Counter[str] = collections.Counter()
    sources = []
    for path in inputs:
        if is_count_file(path):
            _merge(path, counts)
        else:
            sources.append(path)
    texts = (rec.data["text"] for rec in track(read_inputs(sources, format=format, text=text, rejections=rejections),
                                                 "count-tokens"))
    if lowercase:
        texts = (t.lower() for t in texts)
    if tokenizer is None:
        for t in texts:
            counts.update(t.split())
        return counts
    if isinstance(tokenizer, str):
        from feedline._tokenize.load import load_tokenizer

        tokenizer = load_tokenizer(tokenizer)
    by_id = _token_ids(tokenizer, texts)
    for i in np.flatnonzero(by_id):
        counts[tokenizer.id_to_token(int(i))] += int(by_id[i])
    return counts


def _token_ids(tok: Tokenizer, texts: Iterable[str], batch: int = 512) -> np.ndarray:
    """How often each token id occurs in ``texts`` (an array indexed by id), encoded ``batch`` texts a call."""
    by_id = np.zeros(tok.vocab_size, dtype=np.int64)
    it = iter(texts)
    while chunk := list(itertools.islice(it, batch)):
        flat, _bounds = tok.encode_batch_flat(chunk)
        found = np.bincount(flat, minlength=len(by_id))
        if len(found) > len(by_id):  # an id past vocab_size (an added token)
            found[:len(by_id)] += by_id
            by_id = found
        else:
            by_id += found
    return by_id


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
            out.write(f"{_escape(w)}\t{c}\n")
    finally:
        if out is not sys.stdout:
            out.close()
    return len(rows)


def _escape(word: str) -> str:
    """A key with a tab or line break (a tokenizer's token; never a whitespace-split word) escaped for one TSV line."""
    if "\t" in word or "\n" in word or "\r" in word:
        return word.replace("\t", "\\t").replace("\n", "\\n").replace("\r", "\\r")
    return word
