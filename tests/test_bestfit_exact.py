"""The packer's loop keeps a bin's room in its sorted key only (no room cell per bin): the same
placements as the loop it replaced, which is kept here as the reference, on random lengths, windows,
caps and carried bins, flush and restore included; and the held-bin fast path (the last bin kept out of
the sorted rooms while best fit picks it again) on rooms that tie."""

from __future__ import annotations

import bisect
import collections
import random
import sys

import numpy as np
import pytest

from feedline._batching.bestfit import BestFitPacker

_ID_BITS = 40
_ID_MASK = (1 << _ID_BITS) - 1


class Reference:
    """The best-fit loop before (rooms in a one-element list per bin), placements only."""

    def __init__(self, capacity: int, window: int, open_bins: int, max_items: int | None) -> None:
        self.capacity, self.window, self.open_bins, self.max_items = capacity, window, open_bins, max_items
        self.ready: collections.deque[list[int]] = collections.deque()
        self.pending: list[tuple[int, int]] = []
        self.bins: dict[int, tuple[list[int], list[int]]] = {}
        self.rooms: list[int] = []
        self.next_id = 0

    def push(self, length: int, item: int) -> None:
        self.pending.append((length, item))
        if len(self.pending) >= self.window:
            self.pack()

    def pack(self) -> None:
        window, self.pending = self.pending, []
        window.sort(key=lambda x: x[0], reverse=True)
        max_items = self.max_items if self.max_items is not None else sys.maxsize
        for length, item in window:
            i = bisect.bisect_left(self.rooms, length << _ID_BITS)
            bid = self.rooms.pop(i) & _ID_MASK if i < len(self.rooms) else self.new_bin()
            items, room = self.bins[bid]
            items.append(item)
            room[0] -= length
            if room[0] == 0 or len(items) >= max_items:
                self.ready.append(self.bins.pop(bid)[0])
            else:
                bisect.insort(self.rooms, room[0] << _ID_BITS | bid)
        excess = len(self.rooms) - self.open_bins
        if excess > 0:
            for key in self.rooms[:excess]:
                self.ready.append(self.bins.pop(key & _ID_MASK)[0])
            del self.rooms[:excess]

    def flush(self) -> None:
        self.pack()
        for bid in sorted(self.bins):
            self.ready.append(self.bins.pop(bid)[0])
        self.rooms.clear()

    def new_bin(self) -> int:
        bid = self.next_id
        self.next_id += 1
        self.bins[bid] = ([], [self.capacity])
        return bid

    def open_contents(self) -> list[list[int]]:
        return [self.bins[b][0] for b in sorted(self.bins)]


@pytest.mark.parametrize("seed", range(60))
def test_placements_equal_the_previous_loop(seed: int) -> None:
    rng = random.Random(seed)
    capacity = rng.choice([16, 64, 512, 1024, 2048])
    window, open_bins = rng.choice([1, 7, 100, 1000]), rng.choice([0, 1, 8, 64])
    max_items = rng.choice([None, 1, 3, 16, 64])
    short = rng.random() < 0.5  # many short pieces (many per row) or lengths up to the row
    n = rng.randint(1, 5000)
    lengths = [rng.randint(1, max(1, capacity // 12)) if short else rng.randint(1, capacity) for _ in range(n)]
    got, want = BestFitPacker[int](capacity, window=window, open_bins=open_bins, max_items=max_items), \
        Reference(capacity, window, open_bins, max_items)
    for i, length in enumerate(lengths):
        got.push(length, i)
        want.push(length, i)
        if i % 997 == 0:
            assert list(got.ready) == list(want.ready) and got.open_contents() == want.open_contents()
    assert list(got.ready) == list(want.ready) and got.open_contents() == want.open_contents()
    # restored from its open bins and ready rows (between windows, as the pack batcher saves it), it
    # goes on as the reference does
    got.pack()
    want.pack()
    by_id = dict(enumerate(lengths))
    again = BestFitPacker[int](capacity, window=window, open_bins=open_bins, max_items=max_items)
    again.restore(list(got.ready), [[(by_id[i], i) for i in row] for row in got.open_contents()])
    more = [rng.randint(1, capacity) for _ in range(300)]
    for j, length in enumerate(more, start=n):
        by_id[j] = length
        again.push(length, j)
        want.push(length, j)
    again.flush()
    want.flush()
    assert list(again.ready) == list(want.ready)


@pytest.mark.parametrize("seed", range(20))
def test_whole_row_items_close_at_once_in_window_order(seed: int) -> None:
    """Pieces of a whole row (documents longer than a row cut into rows: most pieces of long documents)
    go to ready rows of their own ahead of the window's other items, in arrival order, and take a bin
    id each (ties among the other bins still go to the oldest); placements stay the reference's."""
    rng = random.Random(2000 + seed)
    capacity = rng.choice([8, 64, 1024])
    window, open_bins, max_items = rng.choice([1, 5, 50, 400]), rng.choice([0, 1, 8]), rng.choice([None, 1, 4])
    got = BestFitPacker[int](capacity, window=window, open_bins=open_bins, max_items=max_items)
    want = Reference(capacity, window, open_bins, max_items)
    for i in range(3000):
        length = capacity if rng.random() < 0.6 else rng.randint(1, capacity)
        got.push(length, i)
        want.push(length, i)
        if i % 499 == 0:
            assert list(got.ready) == list(want.ready) and got.open_contents() == want.open_contents()
    got.flush()
    want.flush()
    assert list(got.ready) == list(want.ready)


@pytest.mark.parametrize("seed", range(40))
def test_held_bin_fast_path_keeps_best_fit_on_ties(seed: int) -> None:
    """The loop holds the last bin out of the sorted rooms while best fit would pick it again: with
    rows of 6-12 and pieces of 1-4, rooms tie often (the oldest bin must win) and the held bin's room
    falls below other bins' within a few pieces; placements stay the reference's."""
    rng = random.Random(1000 + seed)
    capacity, window = rng.randint(6, 12), rng.choice([5, 37, 300])
    open_bins, max_items = rng.choice([0, 2, 8]), rng.choice([None, 2, 5])
    got = BestFitPacker[int](capacity, window=window, open_bins=open_bins, max_items=max_items)
    want = Reference(capacity, window, open_bins, max_items)
    for i in range(3000):
        length = rng.randint(1, 4)
        got.push(length, i)
        want.push(length, i)
    got.flush()
    want.flush()
    assert list(got.ready) == list(want.ready)


@pytest.mark.parametrize("seed", range(20))
def test_windows_fed_in_chunks_place_as_item_by_item(seed: int) -> None:
    """The pack batcher hands a window over as chunks (numpy lengths, a ``range`` of piece ids each),
    sorted at once (16-bit radix under rows of 32,768, 64-bit beyond) into steps; chunks of ranges, of lists and
    single items mixed in one window place as the reference does, ties in arrival order."""
    rng = random.Random(3000 + seed)
    capacity = rng.choice([12, 1024, 40_000, 1 << 23])  # (rows of 2**22 and more: steps shifted as Python ints)
    window, open_bins, max_items = rng.choice([1, 50, 1000]), rng.choice([0, 8, 64]), rng.choice([None, 3, 64])
    got = BestFitPacker[int](capacity, window=window, open_bins=open_bins, max_items=max_items)
    want = Reference(capacity, window, open_bins, max_items)
    at = 0
    while at < 6000:
        k = rng.choice([1, 7, 300])
        lengths = np.array([rng.randint(1, min(capacity, rng.choice([4, 80, capacity]))) for _ in range(k)])
        kind = rng.choice(["range", "list", "one"])
        if kind == "one":  # packed as soon as the window is full
            for j, n in enumerate(lengths.tolist()):
                got.push(n, at + j)
                want.push(n, at + j)
        else:  # the chunk whole, then packed if the window is full (as the pack batcher reads)
            got.add_many(lengths, range(at, at + k) if kind == "range" else list(range(at, at + k)))
            want.pending.extend((n, at + j) for j, n in enumerate(lengths.tolist()))
            if got.pending >= window:
                got.pack()
                want.pack()
        at += k
        assert list(got.ready) == list(want.ready) and got.pending == len(want.pending)
    got.flush()
    want.flush()
    assert list(got.ready) == list(want.ready)


@pytest.mark.parametrize("case", ["renumbered", "widened", "restored wide"])
def test_keys_of_one_digit_renumber_and_widen_as_the_reference_places(case: str) -> None:
    """Keys stay under 2**30 (one CPython digit: the interpreter's fast int compare and subtract) by
    giving bin ids only the bits the row leaves (12 for rows of 2**17); when a window could outgrow
    them the open bins are renumbered in order, and where too many bins stay open for even that, keys
    widen to 40 bits of id (also restored with that many open bins). Placements stay the reference's."""
    rng = random.Random(4000)
    capacity, window = 1 << 17, 16
    open_bins = 64 if case == "renumbered" else 10 ** 6
    got = BestFitPacker[int](capacity, window=window, open_bins=open_bins)
    want = Reference(capacity, window, open_bins, None)
    if case == "restored wide":   # 5,000 open bins of one item (more than 12 bits of id hold)
        lengths = {i: rng.randint(capacity // 2 + 1, capacity - 1) for i in range(5000)}
        got.restore([], [[(n, i)] for i, n in lengths.items()])
        for i, n in lengths.items():
            want.bins[want.new_bin()][0].append(i)
            want.bins[i][1][0] -= n
            bisect.insort(want.rooms, want.bins[i][1][0] << _ID_BITS | i)
    small: list[bool] = []
    for i in range(5000, 20000):
        # renumbered: rows of 2-3 items (ids run past 4,096 in ~600 windows); widened: items over
        # half a row each, a bin each, all kept open (4,096 open bins by the 256th window)
        n = rng.randint(capacity // 4, capacity // 2) if case == "renumbered" else rng.randint(capacity // 2 + 1, capacity - 1)
        got.push(n, i)
        want.push(n, i)
        if i % 16 == 15 and got._rooms:
            small.append(max(got._rooms) < 1 << 30)
            if i < 6024 or i % 128 == 127:   # every window of the first 64, then every 8th (each compare is O(bins))
                assert list(got.ready) == list(want.ready) and got.open_contents() == want.open_contents()
    got.flush()
    want.flush()
    assert list(got.ready) == list(want.ready)
    # one digit throughout where renumbering holds the ids; 40 bits once 4,096 bins stay open
    assert all(small) if case == "renumbered" else small[0] == (case == "widened") and not small[-1]
