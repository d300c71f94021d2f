"""The reader protocol and the format registry.

A reader turns one *split* of a file (the whole file, a byte range, a row group) into items
``(position, next_position, line, record_or_rejection)``. ``position`` is the record's stable
position in the file (a decoded byte offset or a row number), ``next_position`` where reading
resumes after it, ``line`` its 1-based line (or row) for error reports. ``fetch`` re-reads
records by position, which is how buffered records are restored on resume.

Formats register by name in :data:`FORMATS` as ``"module:Class"`` (imported on first use), and
:func:`detect_format` maps file names to formats. A name with no format extension (``x.zst``,
``x.gz``, ``part-00000``: the Pile's convention) is *sniffed*: its first decompressed line is
JSON Lines when it parses as a JSON object, else text.
"""

from __future__ import annotations

import importlib
import json
import os
from abc import ABC, abstractmethod
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from feedline._core.documents import TokenItems
from feedline._core.options import close_match
from feedline._core.record import Rejection, get_path
from feedline._sources.files import open_binary, strip_codec
from feedline.errors import SourceError, SpecError

__all__ = ["FORMATS", "Item", "Reader", "Split", "detect_format", "get_path", "reader_class", "register_format",
           "sniff_format"]

Item = tuple[int, int, int, "dict[str, Any] | Rejection"]


@dataclass(frozen=True, slots=True)
class Split:
    """A unit of reading: ``file`` index and path, a ``[start, end)`` range of positions, and the
    file's size in bytes when the split was planned (plain local files; to detect truncation)."""

    file: int
    path: str
    start: int = 0
    end: int | None = None
    size: int | None = None


class Reader(ABC):
    """Reads records of one format. Subclasses set ``name`` and implement :meth:`read`."""

    name: ClassVar[str]
    #: Records hold token ids (``{"input_ids": int32 array}``), not text: only tasks that accept
    #: tokens (``clm``) can use them.
    pretokenized: ClassVar[bool] = False

    def __init__(self, spec: Any) -> None:
        self.spec = spec

    def splits(self, file: int, path: str) -> list[Split]:
        """The splits of one file; one per file unless the format can do better."""
        return [Split(file, path)]

    def extent(self, split: Split) -> tuple[int, int] | None:
        """The ``[start, end)`` positions ``split`` may be cut in (a piece ``Split(start=a, end=b)``
        reads the records starting in ``[a, b)``), or ``None`` where it cannot be cut."""
        return None

    @abstractmethod
    def read(self, split: Split, position: int, line: int) -> Iterator[Item]:
        """Yield the items of ``split`` from ``position`` (whose line number is ``line``)."""

    def read_batches(self, split: Split, position: int, line: int) -> Iterator[list[Item] | TokenItems] | None:
        """The items of :meth:`read` in lists (a block at a time), or as runs of documents
        (:class:`~feedline._core.documents.TokenItems`), or ``None`` where the reader has no such path."""
        return None

    def read_ahead(self, split: Split) -> None:
        """A hint: ``split`` is read next, from its start. A reader whose splits cost much to decode
        (Parquet row groups) may start decoding it in the background; the default does nothing."""
        return None

    def fetch(self, path: str, positions: Sequence[int]) -> dict[int, dict[str, Any]]:
        """Re-read the records at ``positions``; the default scans the file once."""
        wanted = set(positions)
        found: dict[int, dict[str, Any]] = {}
        if not wanted:
            return found
        # A split starting at 0 is never re-aligned: ``start`` is an exact record position.
        start = min(wanted)
        for pos, _next, _line, rec in self.read(Split(-1, path, 0, None), start, 0):
            if pos in wanted and not isinstance(rec, Rejection):
                found[pos] = rec
                if len(found) == len(wanted):
                    break
        missing = wanted - found.keys()
        if missing:
            raise SourceError(f"{path}: cannot re-read records at positions {sorted(missing)[:5]}; the file changed since the state was saved")
        return found


FORMATS: dict[str, str] = {
    "arrow": "feedline._sources.arrow:ArrowReader",
    "bert": "feedline._sources.text:BertReader",
    "cirrus": "feedline._sources.cirrus:CirrusReader",
    "flat": "feedline._sources.flat:FlatReader",
    "csv": "feedline._sources.tabular:CsvReader",
    "hf": "feedline._sources.hf:HfReader",
    "iterable": "feedline._sources.iterable:IterableReader",
    "json": "feedline._sources.jsonl:JsonReader",
    "jsonl": "feedline._sources.jsonl:JsonlReader",
    "megatron": "feedline._sources.megatron:MegatronReader",
    "parquet": "feedline._sources.parquet:ParquetReader",
    "text": "feedline._sources.text:TextReader",
    "tokens": "feedline._sources.tokens:TokensReader",
    "tsv": "feedline._sources.tabular:TsvReader",
    "wikixml": "feedline._sources.wikixml:WikiXmlReader",
}

_EXTENSIONS: dict[str, str] = {
    ".txt": "text", ".text": "text", ".md": "text", ".jsonl": "jsonl", ".ndjson": "jsonl",
    ".json": "json", ".csv": "csv", ".tsv": "tsv", ".parquet": "parquet", ".pq": "parquet",
    ".arrow": "arrow", ".feather": "arrow", ".ipc": "arrow", ".xml": "wikixml", ".idx": "megatron",
}

# Name patterns that win over the extension (a CirrusSearch dump is ``*.json.gz``).
_PATTERNS: tuple[tuple[str, str], ...] = (("cirrussearch", "cirrus"), ("pages-articles", "wikixml"),
                                          ("pages-meta", "wikixml"))


def register_format(name: str, target: str, extensions: Sequence[str] = ()) -> None:
    """Register a reader ``"module:Class"`` under ``name``, detected from ``extensions``."""
    FORMATS[name] = target
    for ext in extensions:
        _EXTENSIONS[ext] = name


def detect_format(path: str) -> str:
    """The format of a file from its name (compression extensions ignored)."""
    name = strip_codec(path.rstrip("/"))
    lower = name.lower()
    base = os.path.basename(lower)
    for pattern, fmt in _PATTERNS:
        if pattern in base:
            return fmt
    if lower.endswith(".bin") and name == path:  # token ids: Megatron when its .idx is beside it
        return "megatron" if os.path.isfile(name[:-4] + ".idx") else "flat"
    for suffix, fmt in sorted(_EXTENSIONS.items(), key=lambda kv: -len(kv[0])):
        if lower.endswith(suffix):
            return fmt
    if os.path.splitext(lower)[1] == "":
        return sniff_format(path)
    raise SourceError(
        f"{path}: cannot tell the format from the name; set the source's format: to one of {', '.join(sorted(FORMATS))}"
    )


def sniff_format(path: str) -> str:
    """``jsonl`` when the first non-blank line of the (decompressed) file is a JSON object, else ``text``.

    Reads at most 1 MiB; a first line longer than that counts as JSON when it starts like an
    object with a key (``{"``). An unreadable file is ``text`` (reading it reports the error).
    """
    try:
        with open_binary(path) as f:
            head = f.read(1 << 20)
    except (OSError, EOFError, ValueError, SourceError):
        return "text"
    except Exception as e:  # zstandard's errors are plain Exception subclasses
        if type(e).__name__ == "ZstdError":
            return "text"
        raise
    for line in head.lstrip(b"\xef\xbb\xbf").splitlines(keepends=True):
        if not line.strip():
            continue
        stripped = line.strip()
        if not stripped.startswith(b"{"):
            return "text"
        if not line.endswith(b"\n") and len(head) >= 1 << 20:
            return "jsonl" if stripped[1:].lstrip().startswith(b'"') else "text"
        try:
            return "jsonl" if isinstance(json.loads(stripped), dict) else "text"
        except ValueError:
            return "text"
    return "text"


def reader_class(fmt: str) -> type[Reader]:
    """The reader class registered under ``fmt``."""
    target = FORMATS.get(fmt)
    if target is None:
        raise SpecError(f"format: {fmt!r} is not a format{close_match(fmt, sorted(FORMATS))} (formats: auto, {', '.join(sorted(FORMATS))})")
    module, _, cls = target.partition(":")
    return getattr(importlib.import_module(module), cls)  # type: ignore[no-any-return]
