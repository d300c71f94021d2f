"""A worker's batch arrays through shared memory: a ring that the worker writes and the parent reads.

Through the socket a 270 KB batch cost a copy into the kernel's buffers in the worker and one out
of them into fresh arrays in the parent. A :class:`RingWriter` (the worker's) copies each of a
message's arrays once into a region of shared memory (a ``memfd``, :data:`CAPACITY` bytes; its
descriptor goes to the parent once, with the first message that uses it); the socket carries only
the header and where the arrays lie. The :class:`RingReader` (the parent's) hands them out where
they lie: each is a ``uint8`` array over the ring, which numpy makes the base of every array built
over it and of their views and tensors, so a region lives exactly as long as anything refers to its
memory. Regions are taken and given back in order (the messages' order on the socket): the control
word at the ring's start holds the position up to which the parent is done, advanced (at each
message read) past the oldest regions none of whose arrays is left, and the worker writes only
behind it. What the parent keeps for long (a state: an anchor, a pack window) is copied out
(``copy``), so it never holds the ring; a batch the consumer keeps holds its region and those after
it are not reused meanwhile: a message whose arrays do not fit in the free part goes through the
socket as before, so the worker never waits for the ring and nothing kept is ever overwritten. A
worker that dies leaves nothing behind (the memory goes with the last mapping).

The control area (a page) also carries each of the worker's partitions' credit: the parent counts
there every batch it takes (:meth:`RingReader.took`), and the worker reads the count
(:meth:`RingWriter.taken`) instead of credit messages; a worker out of credit for a partition writes
the count it wants to be woken at (:meth:`RingWriter.wake_at`), and the take that reaches it wakes
the worker by message (an eventcount: each side writes, fences, then reads the other's word, so one
of them sees the other). After the ring lie the worker's blocks (:mod:`.blocks`: gathers laid out
in place, sent without a copy), their words in the control area too; the ring's and the blocks'
sizes are written there, before the descriptor goes.

    >>> w = RingWriter(1 << 16)
    >>> at = w.place([memoryview(b"abc"), memoryview(b"de")])
    >>> r = RingReader(os.dup(w.fd))
    >>> got = r.take(*at, sizes=[3, 2])
    >>> [bytes(a) for a in got], w.free() == w.capacity
    ([b'abc', b'de'], False)
    >>> del got; _ = r.take(*w.place([memoryview(b"f")]), sizes=[1])   # released at the next take
    >>> w.free() == w.capacity - 64
    True
"""

from __future__ import annotations

import mmap
import os
import socket
import struct
import weakref
from collections import deque

import numpy as np

from feedline._partitions.blocks import BLOCK, MAX_BLOCKS, Blocks, HeldBlocks, fence, words_of

__all__ = ["CAPACITY", "HAS_RING", "SLOTS", "RingReader", "RingWriter"]

#: Shared memory per worker for the arrays of the messages on their way (4 batches of 16 x 1024 laid
#: out take ~1.1 MB; a worker of several partitions may have more on the way: those go by the socket).
CAPACITY = 4 << 20
#: ``memfd`` and descriptor passing (Linux); elsewhere every message goes through the socket.
HAS_RING = hasattr(os, "memfd_create") and hasattr(socket, "SCM_RIGHTS")
_SLOT = 16      # a partition's credit: the batches the parent took (u64, the parent's) and the count to wake the worker at (u64)
_SIZES_AT = 8   # after the released position (u64): the ring's bytes, the blocks and their bytes (u64 each, the worker's)
_SLOTS_AT = 64  # (padded to a cache line)
_COUNT = _SLOTS_AT // 8   # (the first slot's count, as a control word)
#: The partitions of one worker whose credit goes through the ring (the others' goes by message).
SLOTS = 248
_WORDS_AT = _SLOTS_AT + SLOTS * _SLOT   # each block's word (:mod:`.blocks`)
_CONTROL = _WORDS_AT + MAX_BLOCKS * 8   # the control area: one page
_ALIGN = 64


class RingWriter:
    """The worker's end: :meth:`place` copies arrays in, where there is room."""

    def __init__(self, capacity: int = CAPACITY, blocks: int = 0, block: int = BLOCK) -> None:
        self.capacity = capacity
        blocks = min(blocks, MAX_BLOCKS)
        self.fd = os.memfd_create("feedline-ring", os.MFD_CLOEXEC)  # type: ignore[attr-defined]
        try:   # (memory is used only where written: the blocks a worker never takes cost nothing)
            os.ftruncate(self.fd, _CONTROL + capacity + blocks * block)
            self.map = mmap.mmap(self.fd, _CONTROL + capacity + blocks * block)
        except BaseException:
            os.close(self.fd)
            raise
        self.mem = memoryview(self.map)
        self.word = words_of(self.mem[:_CONTROL])   # the control words, read and written whole
        struct.pack_into("<QQQ", self.map, _SIZES_AT, capacity, blocks, block)
        self.head = 0   # the position after the last region taken (positions only grow; index = position % capacity)
        self.blocks = Blocks(self.mem, _CONTROL + capacity, _WORDS_AT, blocks, block)

    def free(self) -> int:
        """The bytes the parent released and the worker may write."""
        return self.capacity - (self.head - self.word[0])  # type: ignore[no-any-return]

    def place(self, views: list[memoryview]) -> tuple[list[int], int] | None:
        """Copy ``views`` (bytes) into one region: ``(their positions, the region's end)``, or ``None``
        where the free part cannot hold them (the message then goes through the socket)."""
        offsets, total = [], 0
        for v in views:
            offsets.append(total)
            total += -(-v.nbytes // _ALIGN) * _ALIGN
        start = self.head
        if start % self.capacity + total > self.capacity:   # not at the end: from the ring's start
            start += self.capacity - start % self.capacity
        released = self.word[0]
        if start + total - released > self.capacity:
            return None
        at = [start + o for o in offsets]
        base = _CONTROL + start % self.capacity
        for o, v in zip(offsets, views):
            self.mem[base + o:base + o + v.nbytes] = v
        self.head = start + total
        return at, self.head

    def taken(self, slot: int) -> int:
        """The batches of the partition in ``slot`` the parent took so far (:meth:`RingReader.took`)."""
        return self.word[_COUNT + 2 * slot]  # type: ignore[no-any-return]

    def wake_at(self, slot: int, count: int) -> bool:
        """Ask to be woken (by message) when the parent's count of ``slot`` reaches ``count`` (0: not
        waiting); ``False`` where it already has, so the caller goes on without waiting. The word is
        written, fenced, then the count read again: a take the read missed sees the word (the parent
        counts, fences, then reads it), so exactly one of the two acts."""
        self.word[_COUNT + 2 * slot + 1] = count
        if not count:
            return True
        fence()
        if self.taken(slot) >= count:
            self.word[_COUNT + 2 * slot + 1] = 0
            return False
        return True

    def close(self) -> None:
        try:
            self.word.release()
            self.blocks.word.release()
            self.mem.release()
            self.map.close()
        except BufferError:   # arrays of a block still referred to (a pipeline being closed): unmapped at exit
            pass
        os.close(self.fd)


class RingReader:
    """The parent's end, over the descriptor the worker sent: :meth:`take` hands a message's arrays out."""

    def __init__(self, fd: int) -> None:
        try:
            size = os.fstat(fd).st_size
            self.map = mmap.mmap(fd, size)
        finally:
            os.close(fd)   # (the mapping keeps the memory, and the arrays handed out keep the mapping)
        self.capacity, blocks, block = struct.unpack_from("<QQQ", self.map, _SIZES_AT)
        if size < _CONTROL or blocks > MAX_BLOCKS or _CONTROL + self.capacity + blocks * block != size:
            self.map.close()
            raise EOFError(f"a partition worker's shared memory is {size} bytes, not the {self.capacity}-byte ring and "
                           f"{blocks} blocks of {block} bytes it says: the stream is corrupt")
        self.mem = memoryview(self.map)
        self.word = words_of(self.mem[:_CONTROL])   # the control words, read and written whole
        self.blocks = HeldBlocks(self.mem, _CONTROL + self.capacity, _WORDS_AT, blocks, block)
        # each message's region: its end, and its arrays (weakly: it is done when none is left)
        self.held: deque[tuple[int, list[weakref.ref[np.ndarray]]]] = deque()

    def take(self, at: list[int], end: int, sizes: list[int], copy: bool = False) -> list[np.ndarray]:
        """The arrays at positions ``at`` (``sizes`` bytes each) as ``uint8`` arrays over the ring (copied
        out with ``copy``: what the parent keeps for long, a state, must not hold the ring's parts behind
        it), and the ring released up to the last message none of whose arrays is held any more."""
        out = []
        for pos, size in zip(at, sizes):
            i = pos % self.capacity
            if i + size > self.capacity or not 0 <= end - pos <= self.capacity:
                raise EOFError(f"a partition worker's message places {size} bytes at {pos} of a {self.capacity}-byte "
                               "ring: the stream is corrupt")
            # over a memoryview, not another array: numpy makes this the base of every array built over
            # it (and of their views), so it lives exactly as long as anything that reads its memory
            buf = np.frombuffer(self.mem[_CONTROL + i:_CONTROL + i + size], dtype=np.uint8)
            out.append(buf.copy() if copy else buf)
        self.held.append((end, [] if copy else [weakref.ref(a) for a in out]))
        self.release()
        return out

    def region(self, start: int, end: int) -> np.ndarray:
        """The ring from position ``start`` to ``end`` (one message's arrays) as one ``uint8`` array
        where it lies, the base of every array built over it; given back once none is left (in order)."""
        i, size = start % self.capacity, end - start
        if not 0 <= size <= self.capacity or i + size > self.capacity:
            raise EOFError(f"a partition worker's message places {size} bytes at {start} of a {self.capacity}-byte "
                           "ring: the stream is corrupt")
        buf = np.frombuffer(self.mem[_CONTROL + i:_CONTROL + i + size], dtype=np.uint8)
        self.held.append((end, [weakref.ref(buf)]))
        self.release()
        return buf

    def took(self, slot: int) -> bool:
        """Count a batch of the partition in ``slot`` taken (its credit: one more batch may come);
        ``True`` where this is the count its worker asked to be woken at (:meth:`RingWriter.wake_at`)."""
        at = _COUNT + 2 * slot
        n = self.word[at] + 1
        self.word[at] = n
        fence()
        return self.word[at + 1] == n  # type: ignore[no-any-return]

    def block_region(self, start: int, end: int) -> np.ndarray:
        """A message's arrays in one of the worker's blocks (:meth:`region`'s, for :mod:`.blocks`)."""
        buf = self.blocks.region(start, end)
        self.release()
        return buf

    def release(self) -> None:
        """Give the worker back the ring up to the last message none of whose arrays is held (in order),
        and the blocks it is done with."""
        self.blocks.release()
        released = None
        while self.held and all(ref() is None for ref in self.held[0][1]):
            released = self.held.popleft()[0]
        if released is not None:
            fence()
            self.word[0] = released
