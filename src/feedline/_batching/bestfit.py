"""Online best-fit-decreasing bin packing over bounded windows, carrying partly filled bins.

Items (documents, or pieces of documents) arrive one by one with a length. Every ``window`` items,
the window is sorted longest first (ties keep arrival order) and each item goes into the open bin
with the *least* room that still fits it (ties: the oldest bin), or into a new bin. A bin that
becomes full, or reaches ``max_items``, is closed at once. After the window, if more than
``open_bins`` bins are still open, the fullest are closed until ``open_bins`` remain; the rest
wait for the next window's small items. Closed bins queue in :attr:`BestFitPacker.ready` in the
order they closed::

    capacity 8, window 4, open_bins 1; items arrive as  a5 b3 c6 d2 | e4 f4 ...
    window 1 sorted:   c6 a5 b3 d2
      c6 -> new bin 0 [c]      room 2
      a5 -> new bin 1 [a]      room 3
      b3 -> bin 1 [a b]        room 0   full: closed            ready: [a b]
      d2 -> bin 0 [c d]        room 0   full: closed            ready: [a b] [c d]
    window 2 sorted:   e4 f4  -> bin 2 [e f], closed full       ready: ... [e f]

Carrying bins across windows is what lets a window of 1000 reach 99.88 % on the Wikipedia-512
histogram where packing each window from scratch (TRL's per-map-batch BFD) reaches 99.76 %;
``docs/benchmarks.md`` has the measurements. Memory is bounded by ``window`` items plus the items
in ``open_bins`` bins.
"""

from __future__ import annotations

import bisect
import collections
import itertools
import operator
import sys
from collections.abc import Iterable, Sequence
from typing import Generic, TypeVar

import numpy as np

from feedline.errors import SpecError

__all__ = ["BestFitPacker"]

T = TypeVar("T")

#: An open bin's key in the sorted room list is ``room << bits | id``: one int compare per step. Keys
#: are kept under ``2 ** _SMALL`` (one CPython digit) where the row allows: ints that small compare and
#: subtract on the interpreter's fast paths (~400 instructions an item less than 40-bit ids); the open
#: bins are renumbered (in order) when the ids would outgrow their bits. Otherwise ids get :data:`_ID_BITS`.
_ID_BITS = 40
_SMALL = 30


class BestFitPacker(Generic[T]):
    """Pack ``(length, item)`` pairs into bins of ``capacity``; see the module docstring.

    Args:
        capacity: room per bin (tokens per row).
        window: items sorted and placed together.
        open_bins: partly filled bins carried to the next window (the fullest beyond it close).
        max_items: close a bin when it holds this many items (``None``: no cap).

        >>> p = BestFitPacker(8, window=4, open_bins=1)
        >>> for n, name in [(5, "a"), (3, "b"), (6, "c"), (2, "d"), (4, "e")]:
        ...     p.push(n, name)
        >>> list(p.ready)
        [['a', 'b'], ['c', 'd']]
        >>> p.flush(); list(p.ready)[-1]
        ['e']
    """

    def __init__(self, capacity: int, *, window: int, open_bins: int, max_items: int | None = None) -> None:
        if capacity < 1 or window < 1 or open_bins < 0 or (max_items is not None and max_items < 1):
            raise SpecError(f"packer: capacity {capacity} and window {window} must be >= 1, open_bins {open_bins} >= 0, "
                            f"max_items {max_items} >= 1")
        self.capacity = capacity
        self.window = window
        self.open_bins = open_bins
        self.max_items = max_items
        self.ready: collections.deque[list[T]] = collections.deque()
        self._lengths: list[np.ndarray] = []  # the pending window's lengths and items, in arrival order (chunks)
        self._items: list[Sequence[T]] = []
        self._pending = 0
        self._bins: dict[int, list[T]] = {}  # id -> items of the open bins
        self._rooms: list[int] = []  # sorted keys (room << bits | id) of open bins: by room, then age
        self._next_id = 0
        self._bits = _key_bits(capacity, window)

    # ----------------------------------------------------------------- feeding
    def push(self, length: int, item: T) -> None:
        """Add an item; when the window is full it is packed."""
        self.add(length, item)
        if self._pending >= self.window:
            self.pack()

    def add(self, length: int, item: T) -> None:
        """Add an item to the current window without packing (call :meth:`pack` later)."""
        if not 0 < length <= self.capacity:
            raise ValueError(f"item length {length} is not in [1, {self.capacity}]")
        self._lengths.append(np.array([length], dtype=np.int64))
        self._items.append([item])
        self._pending += 1

    def add_many(self, lengths: Sequence[int] | np.ndarray, items: Iterable[T]) -> None:
        """:meth:`add` of each ``(length, item)`` pair, in order (a ``range`` of items is kept as one)."""
        arr = np.array(lengths, dtype=np.int64)  # (a copy: the caller's array may change)
        if len(arr) and not 0 < int(arr.min()) <= int(arr.max()) <= self.capacity:
            raise ValueError(f"item lengths {arr.min()}..{arr.max()} are not in [1, {self.capacity}]")
        kept: Sequence[T] = items if isinstance(items, range) else list(items)  # type: ignore[assignment]
        if len(kept) != len(arr):
            raise ValueError(f"{len(arr)} lengths for {len(kept)} items")
        if len(arr):
            self._lengths.append(arr)
            self._items.append(kept)
            self._pending += len(arr)

    @property
    def pending(self) -> int:
        """Items waiting for the next window."""
        return self._pending

    def pack(self) -> None:
        """Place the pending window, then close the fullest bins beyond ``open_bins``."""
        if self._next_id + self._pending > (1 << self._bits) - 1:   # (a window can open a bin an item)
            self._renumber()
        steps, items_ = _longest_first(self._lengths, self._items, self.capacity, self._bits)
        self._lengths, self._items, self._pending = [], [], 0
        shift = self._bits
        rooms, bins, ready, mask = self._rooms, self._bins, self.ready, (1 << shift) - 1
        # Items of a whole row come first (longest first) and fit no open bin (each holds an item):
        # each is a new bin, full at once, closed in window order. (Long documents: most of their pieces.)
        whole = steps.count(self.capacity << shift)
        if whole:
            ready.extend([item] for item in items_[:whole])
            self._next_id += whole
        window = zip(steps[whole:], items_[whole:])
        max_items = self.max_items if self.max_items is not None else sys.maxsize
        find, insort, full = bisect.bisect_left, bisect.insort, 1 << shift
        # The bin that took the last item is held out of ``rooms`` (its key ``key``, its items
        # ``items``, ``count`` of them) while the next item fits it and no other bin's key lies in
        # [the item's step, key): best fit then picks it again, and the sorted list is not touched.
        # The other keys do not change meanwhile, so the largest below it, ``below``, decides that.
        # Where it does not hold, the bin goes back into ``rooms`` and the item is placed by bisection.
        key, below, count = -1, 0, 0
        items: list[T] = []
        close = ready.append
        for step, item in window:  # best fit: the least room that holds it (ties: the oldest bin)
            # a bin's room lives in its key only: placing an item lowers the key by its step
            if below < step <= key:
                key -= step
                items.append(item)
                count += 1
                if key < full or count >= max_items:  # no room left, or the item cap: closed
                    close(bins.pop(key & mask))
                    key = -1
                continue
            if key >= 0:
                insort(rooms, key)
            i = find(rooms, step)
            below = rooms[i - 1] if i else -1
            if i < len(rooms):
                key = rooms.pop(i) - step
                items = bins[key & mask]
            else:  # a new bin (:meth:`_new_bin`, inline)
                bid = self._next_id
                self._next_id = bid + 1
                key = (self.capacity << shift | bid) - step
                items = bins[bid] = []
            items.append(item)
            count = len(items)
            if key < full or count >= max_items:
                close(bins.pop(key & mask))
                key = -1
        if key >= 0:
            insort(rooms, key)
        excess = len(rooms) - self.open_bins
        if excess > 0:
            for k in rooms[:excess]:
                self._close(k & mask)
            del rooms[:excess]

    def flush(self) -> None:
        """Pack what is pending and close every open bin (oldest first): the end of the stream."""
        self.pack()
        for bid in sorted(self._bins):
            self._close(bid)
        self._rooms.clear()

    # ----------------------------------------------------------------- state
    def open_contents(self) -> list[list[T]]:
        """The items of the open bins, oldest bin first."""
        return [self._bins[bid] for bid in sorted(self._bins)]

    def restore(self, ready: Iterable[Sequence[T]], open_bins: Iterable[Sequence[tuple[int, T]]]) -> None:
        """Reset to the given closed rows and open bins (``(length, item)`` pairs, oldest first)."""
        self.ready = collections.deque(list(r) for r in ready)
        self._lengths, self._items, self._pending, self._bins, self._rooms, self._next_id = [], [], 0, {}, [], 0
        self._bits = _key_bits(self.capacity, self.window)
        for contents in open_bins:
            if self._next_id >= (1 << self._bits) - 1:
                self._renumber(_ID_BITS)
            key = self._new_bin()
            for length, item in contents:
                self._bins[key & ((1 << self._bits) - 1)].append(item)
                key -= length << self._bits
            bisect.insort(self._rooms, key)

    # ----------------------------------------------------------------- internals
    def _new_bin(self) -> int:
        """A new empty bin; returns its key (a whole row of room)."""
        bid = self._next_id
        self._next_id += 1
        self._bins[bid] = []
        return self.capacity << self._bits | bid

    def _renumber(self, bits: int | None = None) -> None:
        """Give the open bins ids ``0, 1, ...`` in their order (their keys' order is kept), before a
        window whose new bins could outgrow the ids' bits; where even that does not leave room (or
        ``bits`` says so), keys get :data:`_ID_BITS` of id from now on."""
        old, olds = self._bits, (1 << self._bits) - 1
        if bits is not None or len(self._bins) + self._pending > olds - 1:
            self._bits = bits or _ID_BITS
        new = {bid: i for i, bid in enumerate(sorted(self._bins))}
        self._bins = {new[bid]: items for bid, items in self._bins.items()}
        self._rooms = sorted((k >> old) << self._bits | new[k & olds] for k in self._rooms)
        self._next_id = len(new)

    def _close(self, bid: int) -> None:
        self.ready.append(self._bins.pop(bid))


def _key_bits(capacity: int, window: int) -> int:
    """Bits of bin id in a key: what keeps ``capacity << bits | id`` under ``2 ** _SMALL`` where that
    leaves ids for a few windows of new bins, else :data:`_ID_BITS`."""
    bits = _SMALL - capacity.bit_length()
    return bits if bits >= window.bit_length() + 2 else _ID_BITS


def _longest_first(lengths: list[np.ndarray], items: list[Sequence[T]], capacity: int,
                   bits: int = _ID_BITS) -> tuple[list[int], Sequence[T]]:
    """The window's steps (``length << bits``: what placing an item takes off a bin's key) and items
    (chunks in arrival order) longest first, ties in arrival order: a stable sort of the negated
    lengths (what ``sort(key=length, reverse=True)`` of the pairs gives), in 16 bits where the row
    allows (numpy's stable sort is then a radix sort). Items that are ``range`` objects (the pack
    batcher's piece ids) are reordered as one array."""
    if not lengths:
        return [], []
    arr = np.concatenate(lengths) if len(lengths) > 1 else lengths[0]
    if len(arr) < 2:
        return _steps(arr, bits), list(items[0])
    neg = np.negative(arr, dtype=np.int16 if capacity < 1 << 15 else np.int64)
    order = np.argsort(neg, kind="stable")
    if all(isinstance(chunk, range) for chunk in items):
        ids = np.concatenate([np.arange(c.start, c.stop, c.step, dtype=np.int64) for c in items])  # type: ignore[attr-defined]
        return _steps(arr[order], bits), ids[order].tolist()
    flat = list(itertools.chain.from_iterable(items))
    return _steps(arr[order], bits), operator.itemgetter(*order.tolist())(flat)  # (a tuple: two or more)


def _steps(lengths: np.ndarray, bits: int) -> list[int]:
    """``length << bits`` of each, as Python ints (shifted in int64 where that holds them)."""
    if len(lengths) and int(lengths.max()) >= 1 << (62 - bits):
        return [n << bits for n in lengths.tolist()]
    return (lengths << bits).tolist()  # type: ignore[no-any-return]
