"""One source read over its splits, epoch after epoch, with exact positions.

State (version 1)::

    {"epoch": 0,          # current epoch (0-based)
     "split": 3,          # index into this epoch's split order
     "pos": 81920,        # reader position to resume at within that split
     "line": 1204,        # line number at "pos" (for error reports)
     "rejected": {"bad_json": 2},
     "deal": "9f2c41d07a3e5b18"}   # partitions K > 1 only: this partition's share, fingerprinted

The split order of epoch ``e`` is a permutation keyed by ``(seed, source index, e)`` when shard
shuffling is on, else file order. Nothing else is random here.

With ``partitions`` K > 1 the source reads partition ``partition``'s share of the splits
(:func:`~feedline._sources.deal.deal`); a share that is empty, or whose every record is rejected
(counted as ever), is an exhausted source rather than an error (a small source need not feed every
partition; the composing stage says so when no partition delivered anything).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from feedline._core.dataset import Dataset, DatasetIterator, State
from feedline._core.documents import TokenItems, join_records
from feedline._core.record import Key, Record, Rejection
from feedline._core.report import Rejections, nothing_delivered
from feedline._core.rng import permutation
from feedline._sources.arrow import saved_dataset_files
from feedline._sources.cache import ObjectCache
from feedline._sources.deal import deal, fingerprint, moved_share
from feedline._sources.files import expand, is_url, use_cache
from feedline._sources.reader import Item, Reader, Split, detect_format, reader_class
from feedline._sources.taking import chunk_plan, following_split, run_sizes, run_states, take_batched
from feedline._spec import SourceSpec
from feedline.errors import RecordError, SourceError, StateError

__all__ = ["FileSource", "list_files", "make_reader", "source_format"]

log = logging.getLogger("feedline")

_SALT = 0x5047
_FILE_LEVEL = frozenset({"unreadable", "truncated"})  # reasons about a file, not a record


def source_format(spec: SourceSpec, files: Sequence[str]) -> str:
    """The format of a source: ``spec.format``, or the one format all its files' names imply."""
    if spec.format != "auto":
        return spec.format
    if spec.hf:
        return "hf"
    if spec.iterable is not None:
        return "iterable"
    found = sorted({detect_format(f) for f in files})
    if len(found) > 1:
        raise SourceError(f"{spec.label}: files of several formats ({', '.join(found)}); "
                          "narrow the path with a glob or give each format its own source")
    return found[0]


_told_uncached: set[tuple[int, str]] = set()  # (source index, label) already warned in this process


def uncached(spec: SourceSpec, files: Sequence[str]) -> tuple[list[str], list[str]]:
    """The files a source's ``cache:`` does nothing for: local files (read in place) and Parquet
    objects (read by ranged requests, footer and column chunks, never as a whole object)."""
    local = [f for f in files if not is_url(f)]
    parquet = [f for f in files if is_url(f) and (spec.format == "parquet" or _is_parquet(f))]
    return local, parquet


def _is_parquet(path: str) -> bool:
    try:
        return detect_format(path) == "parquet"
    except SourceError:
        return False


def say_uncached(spec: SourceSpec, index: int, files: Sequence[str]) -> None:
    """Warn, once per process and source, that ``cache:`` is set on files it never serves.

    A warning, not an error: the cache is no part of the stream's identity (the same batches
    with or without it), and one spec rightly runs on a store and on a local copy (``root:``).
    """
    local, parquet = uncached(spec, files)
    if not (local or parquet) or (index, spec.label) in _told_uncached:
        return
    _told_uncached.add((index, spec.label))
    why = []
    if local:
        why.append(f"{len(local)} local file(s), read in place (such as {local[0]})")
    if parquet:
        why.append(f"{len(parquet)} Parquet object(s), read by ranged requests of the columns used, never "
                   f"copied whole (such as {parquet[0]})")
    log.warning("sources[%d] (%s): cache: does nothing for %s of its %d file(s); only whole objects of other "
                "formats at URLs (s3://, gs://, https://) are copied. Remove cache: from this source to silence this",
                index, spec.label, " and ".join(why), len(files))


def make_reader(spec: SourceSpec, files: Sequence[str]) -> Reader:
    """The reader for a source, detecting the format from its files when ``auto``."""
    return reader_class(source_format(spec, files))(spec)


def list_files(spec: SourceSpec) -> list[str]:
    """The files of a source: expanded path, or a ``datasets`` ``save_to_disk`` folder's data files."""
    if spec.path is None:
        return [spec.hf or "<iterable>"]
    saved = saved_dataset_files(spec.path)
    return saved if saved is not None else expand(spec.path)


class FileSource(Dataset[Record]):
    """The records of one source (index ``index`` in the spec) for ``epochs`` epochs (None: endless)."""

    def __init__(self, spec: SourceSpec, index: int, *, seed: int, shuffle_splits: bool,
                 epochs: int | None, on_error: str = "skip", reject_limit: int = 0,
                 on_unreadable: str = "skip", partition: int = 0, partitions: int = 1,
                 fixes: Mapping[str, str] | None = None) -> None:
        self.spec = spec
        self.fixes = fixes  # the likely fix by rejection reason, where the pipeline knows better (a chat source's text:)
        self.partition, self.partitions = partition, partitions
        self.index = index
        self.seed = seed
        self.shuffle_splits = shuffle_splits
        self.epochs = epochs
        self.on_error = on_error
        self.reject_limit = reject_limit
        self.on_unreadable = on_unreadable  # "raise": a file that cannot be read stops the stream
        self._files: list[str] | None = None
        self._reader: Reader | None = None
        self._splits: list[Split] | None = None
        self._deal: str | None = None

    # Listing is deferred to first use: constructing a recipe does no I/O.
    @property
    def files(self) -> list[str]:
        if self._files is None:
            self._files = list_files(self.spec)
            c = self.spec.cache  # every listing says it: a later source of these URLs without cache: reads directly
            use_cache(self._files, ObjectCache(c.dir, c.max_bytes) if c is not None else None)
            if c is not None:
                say_uncached(self.spec, self.index, self._files)
        return self._files

    @property
    def reader(self) -> Reader:
        if self._reader is None:
            self._reader = make_reader(self.spec, self.files)
        return self._reader

    @property
    def splits(self) -> list[Split]:
        if self._splits is None:
            splits: list[Split] = []
            for i, f in enumerate(self.files):
                try:
                    splits += self.reader.splits(i, f)
                except SourceError:  # unreadable now: reading it later reports the rejection
                    splits.append(Split(i, f))
            if self.partitions > 1:
                splits = deal(splits, [self._extent(sp) for sp in splits], self.partitions)[self.partition]
            self._splits = splits
        return self._splits

    @property
    def deal(self) -> str:
        """This partition's share, fingerprinted (:func:`~feedline._sources.deal.fingerprint`)."""
        if self._deal is None:
            self._deal = fingerprint(self.splits)
        return self._deal

    def _extent(self, split: Split) -> tuple[int, int] | None:
        try:
            return self.reader.extent(split)
        except SourceError:  # unreadable: dealt whole, and reading it reports the rejection
            return None

    def order(self, epoch: int) -> list[int]:
        n = len(self.splits)
        return permutation(n, self.seed, _SALT, self.index, epoch) if self.shuffle_splits and n > 1 else list(range(n))

    def fetch(self, keys: Sequence[Key]) -> dict[Key, dict[str, Any]]:
        """Re-read records by key (grouped by file, one pass each)."""
        by_file: dict[int, list[int]] = {}
        for _s, f, p in keys:
            by_file.setdefault(f, []).append(p)
        out: dict[Key, dict[str, Any]] = {}
        for f, positions in by_file.items():
            for p, rec in self.reader.fetch(self.files[f], positions).items():
                out[(self.index, f, p)] = rec
        return out

    def locate(self, key: Key, budget: float = 2.0) -> tuple[str, int | None]:
        """The file and 1-based line (or row) of the record at ``key``, for reports.

        Reads the file up to the record, for at most ``budget`` seconds (then the line is ``None``
        and the report names the file and the record's position).
        """
        import time

        path = self.files[key[1]]
        deadline = time.monotonic() + budget
        for n, (position, _next, line, _item) in enumerate(self.reader.read(Split(key[1], path), 0, 0)):
            if position == key[2]:
                return path, line
            if position > key[2] or (n % 1024 == 0 and time.monotonic() > deadline):
                break
        return f"{path} (position {key[2]})", None

    def __iter__(self) -> FileSourceIterator:
        return FileSourceIterator(self)

    def __repr__(self) -> str:
        return f"FileSource({self.spec.label!r}, index={self.index})"


class FileSourceIterator(DatasetIterator[Record]):
    """Cursor over a :class:`FileSource` (a leaf: its state is all its own)."""

    STATE_KEYS = ("epoch", "split", "pos", "line", "rejected")   # and "deal" with partitions > 1

    def __init__(self, source: FileSource) -> None:
        self.src = source
        self.rejections = Rejections(source.on_error)
        self.epoch = 0
        self.split = 0
        self.pos: int | None = None
        self.line = 0
        self._order: list[int] | None = None
        self._items: Any = None
        self._batched = False  # _items yields lists of items (the reader's read_batches)
        self._pending: list[Item] | TokenItems = []  # the current list of items (or run), from _at on not yet taken
        self._at = 0
        # Records delivered in the current epoch (1 after a restore: unknown, assume some).
        self._delivered = 0
        # Until the first record is delivered on a fresh read, a source that yields nothing is
        # an error (reject_limit; see _check_nothing). A restored cursor delivered before.
        self._watch = source.reject_limit > 0
        self._saved_deal: str | None = None   # a restored state's share, checked when reading starts

    def _start_split(self) -> bool:
        """Open the current split; False when the epochs are exhausted."""
        while True:
            if self.src.epochs is not None and self.epoch >= self.src.epochs:
                return False
            if self._saved_deal is not None:
                saved, self._saved_deal = self._saved_deal, None
                if saved != self.src.deal:
                    raise moved_share(self.src.spec.label, self.src.partition, self.src.partitions)
            if self._order is None:
                self._order = self.src.order(self.epoch)
            if self.split < len(self._order):
                sp = self.src.splits[self._order[self.split]]
                if self.pos is None:
                    self.pos, self.line = sp.start, 0
                reader = self.src.reader
                batches = reader.read_batches(sp, self.pos, self.line)
                self._batched = batches is not None
                self._items = batches if batches is not None else reader.read(sp, self.pos, self.line)
                self._pending, self._at = [], 0
                if (following := following_split(self)) is not None:
                    reader.read_ahead(following)
                return True
            if self.src.partitions > 1 and self._delivered == 0 and self.epoch == 0:
                return False  # this partition's share holds no record it can deliver (none, or all rejected: they
                # are counted); whether the whole stream delivered nothing is the composing stage's to say
            if self._watch and self.src.epochs is not None:
                self._check_nothing(at_end=True)
            if self.src.epochs is None and self._delivered == 0:
                # Endless reading of a source that yields nothing would spin forever.
                rejected = ", ".join(f"{k}: {v}" for k, v in sorted(self.rejections.counts.items())) or "none"
                raise SourceError(
                    f"source {self.src.spec.label!r} delivered no record in a whole epoch (rejected so far: {rejected}); "
                    "check its path, format and text: field (chat data needs text: null)"
                )
            self.epoch, self.split, self.pos, self._order = self.epoch + 1, 0, None, None
            self._delivered = 0
            if not self.src.splits:
                return False

    def __next__(self) -> Record:
        got = self.take(1)
        if not got:
            raise StopIteration
        return got[0]

    def take(self, n: int) -> Sequence[Record]:
        """The next ``n`` records (fewer at the end); the state is as after ``n`` calls of ``next``.
        A reader's runs (:class:`~feedline._core.documents.TokenItems`) come as ``TokenRecords``."""
        parts: list[Sequence[Record]] = []
        out: list[Record] = []
        got, index = 0, self.src.index
        while got + len(out) < n:
            if self._items is None and not self._start_split():
                break
            items, epoch = self._items, self.epoch
            file = self.src.splits[self._order[self.split]].file  # type: ignore[index]
            if self._batched:
                parts, got, out = [*parts, out], got + len(out), []
                got += self._take_batched(n - got, parts, items, epoch, file)
                continue
            add, want = out.append, n - got
            while len(out) < want:
                item = self._next_item(items)  # (one call per record: read() is a generator)
                if item is None:
                    self._items, self.split, self.pos = None, self.split + 1, None
                    break
                pos, self.pos, self.line, rec = item
                if isinstance(rec, Rejection):
                    self.rejections.add(rec)
                    if self._watch:
                        self._check_nothing(at_end=False)
                    continue
                add(Record((index, file, pos), epoch, rec))
                if self._watch:
                    self._watch = False
                self._delivered += 1
        return join_records([*parts, out])

    def chunk_plan(self, most: int, budget: int) -> int | None:
        """The records :func:`~feedline._tasks.sizing.read_chunk` would take, where the current run's sizes tell."""
        return chunk_plan(self, most, budget)

    def run_sizes(self, most: int) -> Any:
        """Sizes of the next records the current run holds (:func:`~feedline._sources.taking.run_sizes`)."""
        return run_sizes(self, most)

    def run_states(self, counts: Sequence[int]) -> list[State]:
        """States after taking each of ``counts`` records of the run (:func:`~feedline._sources.taking.run_states`)."""
        return run_states(self, counts)

    def _take_batched(self, n: int, parts: list[Sequence[Record]], items: Iterator[Any], epoch: int, file: int) -> int:
        return take_batched(self, n, parts, items, epoch, file)

    def _next_item(self, items: Iterator[Any]) -> Any:
        """The reader's next item (or list of items); ``None`` at the end of the split or when its file cannot be read."""
        try:
            return next(items, None)
        except RecordError:
            raise
        except SourceError as e:
            # A file that cannot be opened or read (missing, 404, permission) is one
            # rejection; the other files are still read.
            sp = self.src.splits[self._order[self.split]]  # type: ignore[index]
            self.close()
            if self.src.on_unreadable == "raise":
                raise SourceError(f"{e}; the run stops rather than train on part of the data: fix the path or its "
                                  "permissions, or set on_unreadable: skip to count such files as 'unreadable' "
                                  "and read the others") from e
            self.rejections.add(Rejection(sp.path, None, "unreadable", str(e).removeprefix(f"{sp.path}: ")))
            return None

    def _check_nothing(self, *, at_end: bool) -> None:
        """Raise when a fresh read rejected every record: at the end of its first pass, or after ``reject_limit``."""
        counts = self.rejections.counts
        # Whole files that cannot be read are counted and the others read (a 404 beside good
        # files is not a wrong spec); an empty source among others is fine too: a stream with
        # no example at all is caught by TaskMap.
        records = sum(n for k, n in counts.items() if k not in _FILE_LEVEL)
        if at_end and not records:
            return
        if at_end or records >= self.src.reject_limit:
            where = f"source {self.src.spec.label!r}"
            first = None if at_end else self.src.reject_limit
            raise SourceError(nothing_delivered(where, counts, self.rejections.samples, first=first, fixes=self.src.fixes))

    def get_state(self) -> State:
        state: dict[str, Any] = {"epoch": self.epoch, "split": self.split, "pos": self.pos, "line": self.line,
                 "rejected": self.rejections.get_state()}
        if self.src.partitions > 1:
            state["deal"] = self.src.deal
        return state

    def set_state(self, state: Mapping[str, Any]) -> None:
        try:
            self.epoch, self.split = int(state["epoch"]), int(state["split"])
            self.pos = None if state["pos"] is None else int(state["pos"])
            self.line = int(state["line"])
            self.rejections.set_state(state.get("rejected", {}))
            deal = state.get("deal")
            self._saved_deal = None if deal is None or self.src.partitions == 1 else str(deal)
        except (KeyError, TypeError, ValueError) as e:
            raise StateError(f"source {self.src.spec.label!r}: malformed state {dict(state)!r} ({e})") from e
        self._order, self._items, self._pending, self._at = None, None, [], 0
        self._delivered = 1 if (self.split or self.pos) else 0
        self._watch = False

    def close(self) -> None:
        if self._items is not None and hasattr(self._items, "close"):
            self._items.close()
        self._items, self._pending, self._at = None, [], 0
