"""Sentence segmentation for tasks that need sentences (``sop``) when the source has none.

Three segmenters:

- ``blingfire`` (default): Microsoft's compiled finite-state segmenter; English-oriented, fast
  (about 0.2 ms per 100 sentences; two orders of magnitude above ``pysbd`` and faster than the
  tokenizer, so segmentation costs little on top of tokenization).
- ``pysbd``: rule-based, 22 languages (``language``), much slower (see below).
- ``lines``: each non-blank line is one sentence.

``pysbd`` (rule-based, maintained, 22 languages) is pure Python and slow on
long strings (its cost grows faster than linearly with the string), so text is first cut at
line breaks, and long paragraphs into blocks of about ``_BLOCK`` characters at an obvious
sentence end (``.``/``!``/``?`` after a word of 4+ letters, then space and a capital), and each
block is segmented on its own; ``bench/bench_segment.py`` measures the cost. Give a
source that already has sentences (the ``bert`` format: one sentence per line, blank line
between documents) to skip segmentation entirely::

    >>> split_sentences("Dr. Smith went home. He slept.\\nNext paragraph.", "pysbd")
    ['Dr. Smith went home. ', 'He slept.', 'Next paragraph.']
    >>> split_sentences("one\\n\\ntwo", "lines")
    ['one', 'two']
"""

from __future__ import annotations

import re
import threading
from typing import Any, Literal

from feedline._core.optional import require

__all__ = ["Segmenter", "split_sentences"]

Segmenter = Literal["blingfire", "pysbd", "lines"]

_local = threading.local()
_BLOCK = 1000
_OBVIOUS_END = re.compile(r"\w{4,}[.!?][\"')\]]*\s+(?=[A-Z])")


def _blocks(paragraph: str) -> list[str]:
    """Cut a long paragraph at obvious sentence ends roughly every ``_BLOCK`` characters."""
    out, start = [], 0
    while len(paragraph) - start > 2 * _BLOCK:
        m = _OBVIOUS_END.search(paragraph, start + _BLOCK)
        if m is None:
            break
        out.append(paragraph[start:m.end()])
        start = m.end()
    out.append(paragraph[start:])
    return out


def _pysbd(language: str) -> Any:
    cache = getattr(_local, "segmenters", None)
    if cache is None:
        cache = _local.segmenters = {}
    seg = cache.get(language)
    if seg is None:
        pysbd: Any = require("pysbd", "sop")
        seg = cache[language] = pysbd.Segmenter(language=language, clean=False)
    return seg


def split_sentences(text: str, segmenter: Segmenter = "blingfire", language: str = "en") -> list[str]:
    """The non-blank sentences of ``text`` (``lines``: each non-blank line is one sentence)."""
    paragraphs = [p for p in text.splitlines() if p.strip()]
    if segmenter == "lines":
        return paragraphs
    if segmenter == "blingfire":
        bf: Any = require("blingfire", "text")
        return [s for p in paragraphs for s in bf.text_to_sentences(p).split("\n") if s.strip()]
    seg = _pysbd(language)
    out: list[str] = []
    for p in paragraphs:
        for block in _blocks(p):
            out.extend(s for s in seg.segment(block) if s.strip())
    return out
