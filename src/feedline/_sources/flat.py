"""Flat token files: one array of token ids, documents separated by an EOS id (nanoGPT, llm.c).

    sources: [{path: train.bin, format: flat, tokens: {dtype: uint16, eos: 50256}}]

nanoGPT's ``prepare.py`` writes raw ``uint16`` ids with the EOS (``<|endoftext|>``) *after*
each document; llm.c writes a 1 KB header (256 int32: magic 20240520, version 1 = uint16 or
2 = uint32, token count) and puts the EOS *before* each document. Both read here: a record is
one document ``{"input_ids": int32 array}`` *with* its separator where the writer put it, so the
records concatenated are the file (concat/pack reproduce the token stream; the clm task adds no
BOS/EOS to pre-tokenized documents). Positions are token indices of document starts; splits
are ranges of about ``split_bytes``, each document belonging to the split where it starts.

``tokens.dtype``: declare ``uint16``/``uint32``, or leave ``auto``: the llm.c header names it;
otherwise a file whose first 65,536 values read as uint32 are all below 2**20 (a real vocabulary:
a uint16 file of text never has every other id under 16) is ``uint32``, one whose size is odd
in 4-byte words, or whose uint32 reading exceeds that, is ``uint16``; files under 4,096 bytes
must declare it. ``tokens.eos`` is required.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from typing import Any, ClassVar

import numpy as np

from feedline._core.documents import TokenItems
from feedline._sources.reader import Item, Reader, Split
from feedline._spec import TokensSpec
from feedline.errors import SourceError, SpecError

__all__ = ["FlatReader", "FlatTokens"]

LLMC_MAGIC = 20240520
LLMC_HEADER = 256 * 4
_LLMC_DTYPES = {1: np.uint16, 2: np.uint32}
_SAMPLE = 1 << 16
_BLOCK = 1 << 22  # tokens searched for separators at once: a run of documents (runahead.RUN_BYTES) is at most this
_MIN_INFER = 4096


def infer_dtype(path: str, header: np.ndarray | None) -> tuple[np.dtype, int]:
    """``(dtype, header bytes)`` of a flat file whose dtype was not declared."""
    if header is not None:
        return np.dtype(_LLMC_DTYPES[int(header[1])]), LLMC_HEADER
    size = os.path.getsize(path)
    if size < _MIN_INFER:
        raise SourceError(f"{path}: too short ({size} bytes) to tell uint16 from uint32; set tokens: {{dtype: uint16}} (or uint32)")
    if size % 4:
        return np.dtype(np.uint16), 0
    sample = np.fromfile(path, dtype="<u4", count=_SAMPLE)
    return (np.dtype(np.uint32) if int(sample.max()) < 1 << 20 else np.dtype(np.uint16)), 0


def _llmc_header(path: str) -> np.ndarray | None:
    head = np.fromfile(path, dtype="<i4", count=256) if os.path.getsize(path) >= LLMC_HEADER else None
    if head is None or int(head[0]) != LLMC_MAGIC:
        return None
    if int(head[1]) not in _LLMC_DTYPES:
        raise SourceError(f"{path}: llm.c header version {int(head[1])}; known: 1 (uint16), 2 (uint32)")
    return head


class FlatTokens:
    """A memory-mapped flat token file and its document boundaries."""

    def __init__(self, path: str, opts: TokensSpec) -> None:
        if opts.eos is None:
            raise SpecError(f"{path}: format flat needs tokens: {{eos: ID}}, the separator between documents (50256 for GPT-2)")
        try:
            header = _llmc_header(path)
        except FileNotFoundError:
            raise SourceError(f"{path}: file not found") from None
        except OSError as e:
            raise SourceError(f"{path}: cannot read ({e.strerror})") from e
        if opts.dtype == "auto":
            dtype, offset = infer_dtype(path, header)
        else:
            dtype, offset = np.dtype(opts.dtype), (LLMC_HEADER if header is not None else 0)
            if header is not None and np.dtype(_LLMC_DTYPES[int(header[1])]) != dtype:
                raise SourceError(f"{path}: the llm.c header says {_LLMC_DTYPES[int(header[1])].__name__}, "
                                  f"tokens.dtype says {opts.dtype}; remove one")
        size = os.path.getsize(path) - offset
        if size % dtype.itemsize:
            raise SourceError(f"{path}: {size} bytes of data is not a whole number of {dtype} ids; check tokens.dtype")
        self.path, self.dtype, self.eos = path, dtype, int(opts.eos)
        if opts.eos >= 1 << (8 * dtype.itemsize):
            raise SpecError(f"{path}: tokens.eos {opts.eos} does not fit {dtype}")
        self.at_start = opts.eos_at == "start" or (opts.eos_at == "auto" and header is not None)
        n = size // dtype.itemsize
        if header is not None and int(header[2]) != n:
            raise SourceError(f"{path}: the llm.c header announces {int(header[2])} tokens, the file holds {n}; it is truncated")
        # a plain ndarray view of the map (slicing an np.memmap runs Python code; the map stays open through its base)
        self.tokens = np.memmap(path, mode="r", dtype=dtype, offset=offset, shape=(n,)).view(np.ndarray) if n else np.zeros(0, dtype)

    def __len__(self) -> int:
        return len(self.tokens)

    def _next_eos(self, i: int) -> int:
        """Index of the first separator at or after ``i`` (``len`` when none)."""
        n = len(self.tokens)
        while i < n:
            hits = np.flatnonzero(self.tokens[i:i + _BLOCK] == self.eos)
            if hits.size:
                return i + int(hits[0])
            i += _BLOCK
        return n

    def align(self, i: int) -> int:
        """The first document start at or after token ``i``."""
        if i <= 0:
            return 0
        if self.at_start:
            return self._next_eos(i)
        return i if self.tokens[i - 1] == self.eos else min(self._next_eos(i) + 1, len(self.tokens))

    def end_of(self, start: int) -> int:
        """Where the document starting at ``start`` ends (exclusive)."""
        if self.at_start:
            return self._next_eos(start + 1)
        return min(self._next_eos(start) + 1, len(self.tokens))

    def runs(self, start: int, stop: int) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        """``(starts, ends)`` of the documents starting in ``[start, stop)``, a block of tokens at a
        time: what :meth:`documents` yields, as arrays."""
        s = self.align(start)
        n, first = len(self.tokens), int(self.at_start)
        while s < min(stop, n):
            block_end = min(s + _BLOCK, n)
            hits = np.flatnonzero(self.tokens[s + first:block_end] == self.eos) + (s + first)
            ends = hits if self.at_start else hits + 1
            if not ends.size:
                e = self.end_of(s)
                yield np.array([s], np.int64), np.array([e], np.int64)
                s = e
                continue
            starts = np.empty(len(ends), np.int64)
            starts[0], starts[1:] = s, ends[:-1]
            keep = int(np.searchsorted(starts, stop, side="left"))
            if keep < len(ends):
                yield starts[:keep], ends[:keep]
                return
            yield starts, ends.astype(np.int64)
            s = int(ends[-1])

    def documents(self, start: int, stop: int) -> Iterator[tuple[int, int]]:
        """``(start, end)`` of the documents starting in ``[start, stop)``, found a block at a time."""
        s = self.align(start)
        n = len(self.tokens)
        while s < min(stop, n):
            block_end = min(s + _BLOCK, n)
            hits = np.flatnonzero(self.tokens[s + int(self.at_start):block_end] == self.eos) + s + int(self.at_start)
            ends = hits if self.at_start else hits + 1
            if not ends.size:
                e = self.end_of(s)
                yield s, e
                s = e
                continue
            for e in ends.tolist():
                if s >= stop:
                    return
                yield s, e
                s = e


class FlatReader(Reader):
    """Reads flat token files (nanoGPT / llm.c ``.bin``); positions are token indices."""

    name = "flat"
    pretokenized: ClassVar[bool] = True

    def __init__(self, spec: Any) -> None:
        super().__init__(spec)
        self._open: dict[str, FlatTokens] = {}

    def file(self, path: str) -> FlatTokens:
        if path not in self._open:
            self._open[path] = FlatTokens(path, self.spec.tokens or TokensSpec())
        return self._open[path]

    def splits(self, file: int, path: str) -> list[Split]:
        f = self.file(path)
        step = max(1, self.spec.split_bytes // f.dtype.itemsize)
        return [Split(file, path, a, min(a + step, len(f))) for a in range(0, len(f), step)] or [Split(file, path, 0, 0)]

    def extent(self, split: Split) -> tuple[int, int] | None:
        return None if split.end is None else (split.start, split.end)

    def read(self, split: Split, position: int, line: int) -> Iterator[Item]:
        f = self.file(split.path)
        stop = len(f) if split.end is None else split.end
        for s, e in f.documents(position, stop):
            yield s, e, s + 1, {"input_ids": f.tokens[s:e].astype(np.int32)}

    def read_batches(self, split: Split, position: int, line: int) -> Iterator[list[Item] | TokenItems]:
        """:meth:`read` as runs of documents: views of the memory map, no object per document."""
        f = self.file(split.path)
        for starts, ends in f.runs(position, len(f) if split.end is None else split.end):
            yield TokenItems(starts, ends, starts + 1, starts, ends - starts, f.tokens)

    def fetch(self, path: str, positions: Sequence[int]) -> dict[int, dict[str, Any]]:
        f = self.file(path)
        out: dict[int, dict[str, Any]] = {}
        for p in set(positions):
            if not 0 <= p < len(f) or f.align(p) != p:
                raise SourceError(f"{path}: no document starts at token {p}; the data changed since the state was saved")
            out[p] = {"input_ids": f.tokens[p:f.end_of(p)].astype(np.int32)}
        return out
