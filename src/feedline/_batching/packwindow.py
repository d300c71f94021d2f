"""The rows a pack window left, as the pack state names them: packed only where a state is read.

The pack batcher's state holds, for the last window it read, its ready rows and its open rows as
packed tables of piece refs (:func:`~feedline._core.packed.pack_ragged_array`). Looking the refs up
and packing them (zlib) costs ~0.3 ms a window on short records, so a snapshot defers it
(:class:`~feedline._core.deferred.Deferred`) to whoever reads the state. A partition worker sends
every batch's snapshot to its parent: a :class:`WindowRows` pickles as its unpacked parts (one
array, out of band), once per stream while both ends keep it (:func:`~feedline._core.deferred.sent_before`:
later batches of the same window send its key), and the receiver packs them once per window, when
a state is read. Its states are the same bytes as the sender's.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Sequence
from typing import Any

import numpy as np

from feedline._batching.pieces import PiecePool, lookup_refs
from feedline._core.deferred import arrived, materialize, sent_before
from feedline._core.packed import pack_ragged_array
from feedline.errors import StateError

__all__ = ["WindowRows"]


class WindowRows:
    """The rows a window left, from parts nobody changes again: the closed rows (a closed row is
    never appended to), copies of the open ones, and the pool's id and ref tables (the pool
    replaces them, never writes into them). Their refs are looked up and packed once, when a
    state is first read."""

    __slots__ = ("_flat", "_ids", "_key", "_open", "_packed", "_ready", "_refs", "_wire")

    def __init__(self, ready: Sequence[list[int]] | None, open_rows: Sequence[list[int]], pool: PiecePool | None) -> None:
        self._ready = None if ready is None else list(ready)   # None: a window never received (see _arrived)
        self._open = [list(r) for r in open_rows]
        tables = pool.ref_table() if pool is not None else (np.zeros(0, np.int64), np.zeros((0, 6), np.int64))
        self._ids: np.ndarray = tables[0]
        self._refs: np.ndarray = tables[1]
        self._packed: tuple[Any, Any] | None = None
        self._flat: tuple[np.ndarray, ...] | None = None
        self._key: bytes | None = None
        self._wire: Any = None

    @classmethod
    def restored(cls, ready: Any, open_rows: Any) -> WindowRows:
        """The window a restored state names (its packed rows as they were saved)."""
        window = cls([], [], None)
        window._packed = (materialize(ready), materialize(open_rows))
        return window

    def flat(self) -> tuple[np.ndarray, ...]:
        """The ready rows' lengths, the open rows' lengths and the ids of both, in order."""
        if self._flat is None:
            ready, open_rows = self._ready, self._open
            if ready is None:
                raise StateError("pack: this state's window rows came with an earlier message that was dropped "
                                 "(a message from before a restore): the state cannot be read")
            self._flat = (np.fromiter((len(row) for row in ready), dtype=np.int64, count=len(ready)),
                          np.fromiter((len(r) for r in open_rows), dtype=np.int64, count=len(open_rows)),
                          np.fromiter(itertools.chain.from_iterable(itertools.chain(ready, open_rows)), dtype=np.int64))
        return self._flat

    def packed(self) -> tuple[Any, Any]:
        """The packed ready rows and open rows."""
        if self._packed is None:
            lengths, open_lengths, ids = self.flat()
            refs = lookup_refs(self._ids, self._refs, ids)
            n = int(lengths.sum())
            self._packed = (pack_ragged_array(lengths, refs[:n]), pack_ragged_array(open_lengths, refs[n:]))
        return self._packed

    def ready_state(self, taken: int) -> Any:
        """The window's ready rows and how many of them were delivered since."""
        return {"rows": self.packed()[0], "skip": taken}

    def open_state(self) -> Any:
        return self.packed()[1]

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        if self._key is None:   # names this window to the receiver, whatever process it came from
            self._key, self._wire = os.urandom(16), self._packed
        if sent_before(self._key):
            return _arrived, (self._key, None)
        if self._wire is None:   # one array (one buffer out of band), made once per window
            lengths, open_lengths, ids = self.flat()
            self._wire = np.concatenate([np.array([len(lengths), len(open_lengths), len(ids)]), lengths, open_lengths,
                                         ids, self._ids, self._refs.ravel()])
        return _arrived, (self._key, self._wire)


def _arrived(key: bytes, wire: Any) -> WindowRows:
    """A pickled window (its packed rows, its parts as one array, or ``None``: sent before, the one
    this stream's end keeps under ``key``; unknown where a message was dropped unread)."""
    if wire is None:
        window = arrived(key, None)
        return window if window is not None else WindowRows(None, [], None)
    window = WindowRows([], [], None)
    window._key, window._wire, window._packed = key, wire, None if isinstance(wire, np.ndarray) else wire
    if isinstance(wire, np.ndarray):
        at = np.cumsum([3, *wire[:3].tolist()])
        window._flat = (wire[at[0]:at[1]], wire[at[1]:at[2]], wire[at[2]:at[3]])
        table = wire[at[3]:]
        window._ids, window._refs = table[:len(table) // 7], table[len(table) // 7:].reshape(-1, 6)
    return arrived(key, window)  # type: ignore[no-any-return]
