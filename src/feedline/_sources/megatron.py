"""Megatron-LM indexed datasets (``.bin`` + ``.idx``, the ``MMIDIDX`` format), memory-mapped.

    sources: [{path: "data/wiki_text_document.bin"}]      # detected: a .bin with an .idx beside it
    sources: [{path: "data/*.bin", format: megatron}]

What Megatron-LM's ``tools/preprocess_data.py`` writes. The ``.idx`` holds, little-endian::

    b"MMIDIDX\\x00\\x00"   9-byte magic
    u64 version = 1
    u8  dtype code          1 uint8, 2 int8, 3 int16, 4 int32, 5 int64, 6 float64, 7 float32, 8 uint16
    u64 S                   number of sequences
    u64 D                   number of entries of the document index (documents + 1)
    i32 x S                 sequence lengths (elements)
    i64 x S                 sequence byte offsets into the .bin
    i64 x D                 document index: document d is sequences [doc[d], doc[d+1])
    (i8 x S                 sequence modes, multimodal datasets only; not read)

and the ``.bin`` the sequences' tokens back to back. A record is one *document* (its sequences
concatenated: one sequence per document unless the data was sentence-split), as
``{"input_ids": int32 array}``, exactly as stored: ``--append-eod`` data ends each document with
its EOD token, and the clm task adds no BOS/EOS to pre-tokenized documents.
Positions are document indices, so resume and re-reads go straight to a document; splits are
ranges of documents of about ``split_bytes`` of tokens each. A directory or glob that lists both
files of a pair reads the pair once.

:func:`write_indexed_dataset` writes the same format (for tests and tools).
"""

from __future__ import annotations

import itertools
import os
import struct
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, ClassVar

import numpy as np

from feedline._core.documents import TokenItems
from feedline._sources.reader import Item, Reader, Split
from feedline.errors import SourceError

__all__ = ["MegatronIndex", "MegatronReader", "write_indexed_dataset"]

MAGIC = b"MMIDIDX\x00\x00"
VERSION = 1
DTYPES: dict[int, type] = {1: np.uint8, 2: np.int8, 3: np.int16, 4: np.int32, 5: np.int64, 6: np.float64,
                           7: np.float32, 8: np.uint16}
CODES = {np.dtype(v): k for k, v in DTYPES.items()}
_HEAD = len(MAGIC) + 8 + 1 + 8 + 8
_RUN = 1 << 14  # documents a run of read_batches


def prefix_of(path: str) -> str:
    """``data/x`` for ``data/x.bin``, ``data/x.idx`` or ``data/x``."""
    root, ext = os.path.splitext(path)
    return root if ext in (".bin", ".idx") else path


class MegatronIndex:
    """The memory-mapped ``.idx`` and ``.bin`` of one indexed dataset."""

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix
        idx, bin_ = prefix + ".idx", prefix + ".bin"
        for p in (idx, bin_):
            if not os.path.isfile(p):
                raise SourceError(f"{p}: not found; a Megatron dataset needs both {prefix}.bin and {prefix}.idx")
        try:
            with open(idx, "rb") as f:
                head = f.read(_HEAD)
        except OSError as e:
            raise SourceError(f"{idx}: cannot read ({e.strerror})") from e
        if len(head) < _HEAD or head[:len(MAGIC)] != MAGIC:
            raise SourceError(f"{idx}: not a Megatron MMIDIDX index (bad magic); was it written by preprocess_data.py?")
        version, code, seqs, docs = struct.unpack("<QBQQ", head[len(MAGIC):])
        if version != VERSION:
            raise SourceError(f"{idx}: index version {version}; only version {VERSION} is known")
        if code not in DTYPES or not np.issubdtype(DTYPES[code], np.integer):
            raise SourceError(f"{idx}: dtype code {code} is not an integer token type (codes: 1-5, 8)")
        self.dtype = np.dtype(DTYPES[code])
        size = os.path.getsize(idx)
        need = _HEAD + seqs * 4 + seqs * 8 + docs * 8
        if size < need or docs < 1:
            raise SourceError(f"{idx}: truncated ({size} bytes, the header announces {need}); rewrite the dataset")
        mm = np.memmap(idx, mode="r", dtype=np.uint8)
        self.lengths = np.frombuffer(mm, dtype=np.int32, count=seqs, offset=_HEAD)
        self.pointers = np.frombuffer(mm, dtype=np.int64, count=seqs, offset=_HEAD + seqs * 4)
        self.doc_index = np.frombuffer(mm, dtype=np.int64, count=docs, offset=_HEAD + seqs * 12)
        nbytes = os.path.getsize(bin_)
        ends = self.pointers + self.lengths.astype(np.int64) * self.dtype.itemsize
        if (self.doc_index[0] != 0 or self.doc_index[-1] != seqs or np.any(np.diff(self.doc_index) < 0)
                or (seqs and (ends.max() > nbytes or self.pointers.min() < 0))):
            raise SourceError(f"{idx}: the index does not match {bin_} ({nbytes} bytes); the pair is corrupt or mismatched")
        # a plain ndarray view of the map (slicing an np.memmap runs Python code; the map stays open through its base)
        self.data = np.memmap(bin_, mode="r", dtype=self.dtype).view(np.ndarray) if nbytes else np.zeros(0, self.dtype)

    def __len__(self) -> int:
        return len(self.doc_index) - 1

    def document(self, d: int) -> np.ndarray:
        """Document ``d``'s tokens as int32 (a copy)."""
        s0, s1 = int(self.doc_index[d]), int(self.doc_index[d + 1])
        size = self.dtype.itemsize
        parts = [self.data[int(self.pointers[s]) // size:int(self.pointers[s]) // size + int(self.lengths[s])] for s in range(s0, s1)]
        if not parts:
            return np.zeros(0, np.int32)
        return (parts[0] if len(parts) == 1 else np.concatenate(parts)).astype(np.int32)

    def document_bytes(self) -> np.ndarray:
        """Byte offset of each document's first sequence (the last entry: the data's end)."""
        starts = np.append(self.pointers, self.pointers[-1] + self.lengths[-1] * self.dtype.itemsize if len(self.pointers) else 0)
        return starts[self.doc_index]  # type: ignore[no-any-return]


class MegatronReader(Reader):
    """Reads Megatron indexed datasets; positions are document indices."""

    name = "megatron"
    pretokenized: ClassVar[bool] = True

    def __init__(self, spec: Any) -> None:
        super().__init__(spec)
        self._seen: set[str] = set()
        self._open: dict[str, MegatronIndex] = {}

    def index(self, path: str) -> MegatronIndex:
        prefix = prefix_of(path)
        if prefix not in self._open:
            self._open[prefix] = MegatronIndex(prefix)
        return self._open[prefix]

    def splits(self, file: int, path: str) -> list[Split]:
        prefix = prefix_of(path)
        if prefix in self._seen:  # the other file of a pair already listed
            return []
        self._seen.add(prefix)
        ix = self.index(path)
        n = len(ix)
        if n == 0:
            return [Split(file, path, 0, 0)]
        starts = ix.document_bytes()
        cuts = np.searchsorted(starts[:-1], np.arange(0, int(starts[-1]) or 1, self.spec.split_bytes), side="left")
        bounds = sorted({0, *(int(c) for c in cuts if 0 < c < n), n})
        return [Split(file, path, a, b) for a, b in itertools.pairwise(bounds)]

    def extent(self, split: Split) -> tuple[int, int] | None:
        return None if split.end is None else (split.start, split.end)

    def read(self, split: Split, position: int, line: int) -> Iterator[Item]:
        ix = self.index(split.path)
        end = len(ix) if split.end is None else min(split.end, len(ix))
        for d in range(position, end):
            yield d, d + 1, d + 1, {"input_ids": ix.document(d)}

    def read_batches(self, split: Split, position: int, line: int) -> Iterator[list[Item] | TokenItems]:
        """:meth:`read` as runs of documents (views of the memory-mapped ``.bin``); documents of
        several sequences (sentence-split data) come as lists of items."""
        ix = self.index(split.path)
        end = len(ix) if split.end is None else min(split.end, len(ix))
        for lo in range(position, end, _RUN):
            hi = min(lo + _RUN, end)
            seqs = ix.doc_index[lo:hi + 1]
            if int(seqs[-1] - seqs[0]) != hi - lo:
                yield list(itertools.islice(self.read(split, lo, lo), hi - lo))
                continue
            docs = np.arange(lo, hi, dtype=np.int64)
            s0 = int(seqs[0])
            starts = ix.pointers[s0:s0 + hi - lo] // ix.dtype.itemsize
            yield TokenItems(docs, docs + 1, docs + 1, starts, ix.lengths[s0:s0 + hi - lo].astype(np.int64), ix.data)

    def fetch(self, path: str, positions: Sequence[int]) -> dict[int, dict[str, Any]]:
        ix = self.index(path)
        bad = [p for p in positions if not 0 <= p < len(ix)]
        if bad:
            raise SourceError(f"{path}: no documents {sorted(bad)[:5]} (it has {len(ix)}); the data changed since the state was saved")
        return {p: {"input_ids": ix.document(p)} for p in set(positions)}


def write_indexed_dataset(prefix: str, documents: Iterable[Sequence[int] | np.ndarray], dtype: Any = np.uint16) -> int:
    """Write ``prefix.bin`` and ``prefix.idx`` (one sequence per document); returns the document count.

    The prefix's folder is created if missing. Both files are written beside their final names and
    renamed into place at the end, so a failure (ids that do not fit ``dtype``) leaves no half pair.
    """
    dt = np.dtype(dtype)
    if dt not in CODES:
        raise ValueError(f"dtype {dt} cannot be stored in an MMIDIDX dataset (allowed: {sorted(str(d) for d in CODES)})")
    os.makedirs(os.path.dirname(prefix) or ".", exist_ok=True)
    bin_tmp, idx_tmp = f"{prefix}.bin.{os.getpid()}.tmp", f"{prefix}.idx.{os.getpid()}.tmp"
    lengths: list[int] = []
    try:
        with open(bin_tmp, "wb") as f:
            for doc in documents:
                arr = np.asarray(doc)
                if arr.size and (arr.min() < np.iinfo(dt).min or arr.max() > np.iinfo(dt).max):
                    raise ValueError(f"document {len(lengths)}: token ids {arr.min()}..{arr.max()} do not fit {dt}; "
                                     "pass a wider dtype (e.g. dtype=np.int32)")
                f.write(arr.astype(dt).tobytes())
                lengths.append(int(arr.size))
        sizes = np.asarray(lengths, dtype=np.int32)
        pointers = np.concatenate([[0], np.cumsum(sizes.astype(np.int64) * dt.itemsize)[:-1]]).astype(np.int64) \
            if lengths else np.zeros(0, np.int64)
        doc_index = np.arange(len(lengths) + 1, dtype=np.int64)
        with open(idx_tmp, "wb") as f:
            f.write(MAGIC + struct.pack("<QBQQ", VERSION, CODES[dt], len(lengths), len(doc_index)))
            f.write(sizes.tobytes() + pointers.tobytes() + doc_index.tobytes())
        os.replace(bin_tmp, prefix + ".bin")
        os.replace(idx_tmp, prefix + ".idx")
    finally:
        for tmp in (bin_tmp, idx_tmp):
            if os.path.exists(tmp):
                os.unlink(tmp)
    return len(lengths)
