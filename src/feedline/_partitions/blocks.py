"""Blocks of a worker's shared memory that its batcher lays batches out in, read by the parent in place.

The ring (:mod:`.ring`) takes a copy of each batch's arrays: ~30 us of a worker's CPU for a 270 KB
batch (16 x 1024, six fields), ~5 % of a batch of long documents. The pack batcher lays out a
gather of ready rows (up to 16 batches) at once, and each batch is a slice of it
(:mod:`feedline._batching.readyrows`); where the worker gives its thread an arena
(:mod:`feedline._core.memory`), that gather is made in a *block* of the same shared memory (after
the ring: one descriptor, one mapping), and a batch whose arrays all lie in one block goes as
integers saying where (:mod:`.flat`), with no copy. A block is the worker's from the moment the
batcher takes it until the parent frees it:

- the worker takes a free block (its word 0) for a partition's gather, and sends the batches of it;
- at that partition's next gather (or its restart, or its end) the worker *retires* it: it writes
  the number of messages it sent from it in the block's word (with :data:`RETIRED`);
- the parent counts the messages it read from each block and holds their arrays weakly; once the
  word is retired, every message counted and none of their arrays left, it writes 0: free.

So the parent frees a block only after it has read all that will ever come from it (the count),
and the worker writes one only after the parent freed it; neither waits for the other. Where no
block is free (a consumer that keeps batches; more partitions than blocks) or a gather does not
fit one, the batcher makes its arrays on the heap and the batches go through the ring as before.

    >>> import os
    >>> from feedline._partitions.ring import RingReader, RingWriter
    >>> w = RingWriter(1 << 16, blocks=1, block=1 << 12)   # the worker's (one block of 4 KB)
    >>> r = RingReader(os.dup(w.fd))                         # the parent's, over the same memory
    >>> x = w.blocks.arena("p0", 256).empty((4,), np.dtype(np.int64))   # the batcher's gather
    >>> x[:] = [1, 2, 3, 4]
    >>> at, start, end, b = w.blocks.locate([x])
    >>> w.blocks.sent[b] += 1                                 # (a message says where it lies)
    >>> got = r.block_region(start, end)
    >>> got.view(np.int64).tolist()
    [1, 2, 3, 4]
    >>> w.blocks.arena("p0", 256) is None   # its next gather: retired, but the parent holds it
    True
    >>> del got; r.release(); w.blocks.arena("p0", 256).block   # read and dropped: free again
    0
"""

from __future__ import annotations

import ctypes
import threading
import weakref
from typing import Any

import numpy as np

__all__ = ["BLOCK", "MAX_BLOCKS", "RETIRED", "BlockArena", "Blocks", "HeldBlocks", "fence", "words_of"]

#: A block's bytes: a gather of 16 batches of 16 x 1024 with six int32 fields and their counts is ~4.4 MB.
BLOCK = 8 << 20
#: At most this many blocks per worker (two per partition and one more: the gather being sent and the one
#: before, whose last batches the parent may still hold).
MAX_BLOCKS = 8
RETIRED = 1 << 63
_ALIGN = 64
_LOCK = threading.Lock()


def fence() -> None:
    """A full memory barrier (a lock taken and given back): what one process read out of shared memory
    is read before a word it writes next lets the other overwrite it, on every architecture (the ring's
    and the blocks' words)."""
    with _LOCK:
        pass


def words_of(mem: memoryview) -> memoryview:
    """``mem`` (shared memory, 8-byte aligned) as native 64-bit words, each read and written in one
    access, so the other process never sees one half written. (``struct.pack_into`` clears a word's
    bytes and then writes them one at a time: a concurrent read saw ~3 % of a running count as 0, a
    wake was lost, and a worker slept a heartbeat with its credit back.)

        >>> w = words_of(memoryview(bytearray(16)))
        >>> w[1] = 1 << 63; w[1] == RETIRED
        True
    """
    return mem.cast("Q")


def _address(buf: Any) -> int:
    """Where ``buf``'s first byte lies in this process (a writable buffer of a byte or more; a
    tenth of what ``__array_interface__`` costs)."""
    return ctypes.addressof(ctypes.c_char.from_buffer(buf))


class BlockArena:
    """One block handed out in order (:class:`feedline._core.memory.Arena`)."""

    __slots__ = ("at", "block", "mem")

    def __init__(self, block: int, mem: memoryview) -> None:
        self.block, self.mem, self.at = block, mem, 0

    def empty(self, shape: tuple[int, ...], dtype: np.dtype[Any]) -> np.ndarray | None:
        n = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        start = -(-self.at // _ALIGN) * _ALIGN
        if start + n > len(self.mem):
            return None
        self.at = start + n
        return np.frombuffer(self.mem[start:start + n], dtype=dtype).reshape(shape)


class Blocks:
    """The worker's side: blocks taken for a key's (a partition's) gathers, retired at its next."""

    def __init__(self, mem: memoryview, at: int, words: int, count: int, size: int) -> None:
        self.mem, self.at, self.count, self.size = mem, at, count, size
        self.word = words_of(mem[words:words + 8 * count])   # each block's word
        self.base = _address(mem[at:]) if count else 0
        self.current: dict[Any, int] = {}   # key -> its block now
        self.sent = [0] * count             # messages sent from each block in its current use

    def arena(self, key: Any, nbytes: int) -> BlockArena | None:
        """A free block for ``key``'s next gather of ``nbytes`` (its last one is retired), or ``None``."""
        self.retire(key)
        if nbytes > self.size:
            return None
        held = set(self.current.values())
        for b in range(self.count):
            if b not in held and self.word[b] == 0:
                fence()   # (the parent's reads of what it freed came before its word)
                self.current[key], self.sent[b] = b, 0
                return BlockArena(b, self.mem[self.at + b * self.size:self.at + (b + 1) * self.size])
        return None

    def retire(self, key: Any) -> None:
        """``key``'s block will carry no more messages: the parent frees it once it read them all."""
        b = self.current.pop(key, None)
        if b is not None:
            self.word[b] = RETIRED | self.sent[b]

    def holds(self, batch: dict[str, np.ndarray]) -> bool:
        """Whether ``batch``'s first array lies in a block in use (its batcher laid it out there)."""
        first = next(iter(batch.values()), None)
        try:
            pos = _address(first) - self.base
        except (TypeError, ValueError):   # (none, read-only, empty)
            return False
        return 0 <= pos < self.count * self.size and pos // self.size in self.current.values()

    def locate(self, arrays: list[np.ndarray]) -> tuple[list[int], int, int, int] | None:
        """Where ``arrays`` lie where they all lie in one block in use: their positions (``block *
        size + offset``), the span's start and end, and the block; ``None`` otherwise."""
        if not self.current or not arrays:
            return None
        base, address, buffer = self.base, ctypes.addressof, ctypes.c_char.from_buffer
        try:
            at = [address(buffer(a)) - base for a in arrays]  # type: ignore[arg-type]
        except (TypeError, ValueError):   # read-only, or empty: not the batcher's
            return None
        lo = min(at)
        b = lo // self.size
        if lo < 0 or b not in self.current.values():
            return None
        hi = max([p + a.nbytes for p, a in zip(at, arrays)])
        return (at, lo, hi, b) if hi <= (b + 1) * self.size else None


class HeldBlocks:
    """The parent's side: the arrays of each block's messages, and each block freed once done."""

    def __init__(self, mem: memoryview, at: int, words: int, count: int, size: int) -> None:
        self.mem, self.at, self.count, self.size = mem, at, count, size
        self.word = words_of(mem[words:words + 8 * count])   # each block's word
        self.read = [0] * count   # messages read from each block in its current use
        self.total = 0            # (and in all: for tests and monitoring)
        self.held: list[list[weakref.ref[np.ndarray]]] = [[] for _ in range(count)]

    def region(self, start: int, end: int) -> np.ndarray:
        """The memory from ``start`` to ``end`` (one message's arrays, in one block) as ``uint8``, the
        base of every array built over it: its block is not freed while any is left."""
        b = start // self.size if self.size else -1
        if not 0 <= b < self.count or not start <= end <= (b + 1) * self.size:
            raise EOFError(f"a partition worker's message places its arrays at {start}..{end} of {self.count} blocks "
                           f"of {self.size} bytes: the stream is corrupt")
        buf = np.frombuffer(self.mem[self.at + start:self.at + end], dtype=np.uint8)
        self.held[b].append(weakref.ref(buf))
        self.read[b] += 1
        self.total += 1
        return buf

    def release(self) -> None:
        """Free each block that the worker retired, whose messages were all read and none of whose arrays is left."""
        for b in range(self.count):
            word, held = self.word[b], self.held[b]
            # (the newest message's arrays are, as a rule, dropped last: looked at first)
            if word & RETIRED and word & ~RETIRED == self.read[b] and not (held and held[-1]() is not None) \
                    and all(r() is None for r in held):
                self.held[b], self.read[b] = [], 0
                fence()
                self.word[b] = 0
