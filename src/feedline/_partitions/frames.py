"""Worker-to-parent messages with their arrays out of band.

A laid-out batch of 16 x 1024 tokens is ~270 KB. Through ``Connection.send`` it was pickled (a
copy into the pickle, ~0.36 ms of the worker's CPU per batch), and the parent's receiving thread
read it in chunks into a ``BytesIO`` (a copy per chunk and another as the buffer grows) and
unpickled it (one more). A :class:`FrameWriter` pickles a message with protocol 5, so its arrays
(and any other contiguous buffer) stay out of the pickle, and writes::

    <u32 buffers> <u32 header bytes> <u64 size of each buffer ...> <header (the pickle)> <buffer 0> <buffer 1> ...

A :class:`FrameReader` reads each buffer straight into the memory of a new array and unpickles the
header over them: one copy, from the socket into the array the consumer gets. Per batch the
worker then spends ~0.07 ms and the parent's thread ~0.07 ms instead of ~0.11
(``bench/partitions.py --transport``). Where the system has shared memory with descriptor passing
(Linux), the buffers go into the worker's ring instead (:mod:`.ring`: the descriptor travels once,
with the first message that uses it) and the frame says where they lie::

    <u32 buffers | IN_RING [| VIEWS]> <u32 header bytes> <u64 sizes ...> <u64 positions ...> <u64 end> <header>

With ``VIEWS`` (a batch without a state: nothing the parent keeps for long) the consumer's arrays
are the ring's memory, held until nothing refers to them; otherwise they are copied out. A message
of laid-out batches (dicts of plain number arrays, one layout) is not pickled at all: ``<u32
IN_RING | FLAT> <u32 header bytes> <header>``, the header a few integers per batch (:mod:`.flat`:
its arrays handed out where they lie, a state beside them pickled and copied out): on documents
the parent's CPU per step went from ~0.17-0.20 to ~0.14 ms, the worker's down ~0.01-0.02 ms. Such
a message whose arrays were laid out in one of the worker's blocks (:mod:`.blocks`: the batcher
made them there) is not copied at all: ``<u32 IN_RING | FLAT | BLOCK> ...``, its positions in
the blocks. A message
whose buffers do not fit in the ring's free part goes as above. The parent's end reads what the
socket has into a buffer of its own (:mod:`.sockets`), so a prefix and its header (or several small
messages) cost one system call, and a header is read where it lies there. Messages the other way (the parent's starts, stops and wakes) stay on the
``Connection``: the duplex pipe is a socket pair, whose two directions are separate byte streams.
Where the pipe is not a socket (Windows), both ends use the ``Connection`` as before.

    >>> import multiprocessing, numpy as np
    >>> a, b = multiprocessing.Pipe(duplex=True)
    >>> FrameWriter(b).send(("batch", {"input_ids": np.arange(4, dtype=np.int32)}))
    >>> FrameReader(a).recv()[1]["input_ids"].tolist()
    [0, 1, 2, 3]
"""

from __future__ import annotations

import array
import io
import pickle
import socket
import struct
from collections import OrderedDict
from multiprocessing.connection import Connection
from typing import Any

import numpy as np

from feedline._core.deferred import shipping
from feedline._partitions.blocks import BLOCK, BlockArena
from feedline._partitions.flat import PLAIN_KINDS, Layouts, encode
from feedline._partitions.ring import CAPACITY, HAS_RING, RingReader, RingWriter
from feedline._partitions.sockets import BufferedSocket, send_all, socket_of

__all__ = ["FrameReader", "FrameWriter"]

_PREFIX = struct.Struct("<II")
_SIZE = struct.Struct("<Q")
#: The most out-of-band buffers one message may announce (a batch has one per field; a "many"
#: message one per field of each batch in it); more means the stream is corrupt.
MAX_BUFFERS = 1 << 16
_IN_RING = 1 << 31   # (in the buffer count) the arrays are in the worker's shared memory: :mod:`.ring`
_VIEWS = 1 << 30     # (with it) and may be handed out where they lie
_FLAT = 1 << 29      # (with IN_RING) batches described as integers: :mod:`.flat`
_BLOCK = 1 << 28     # (with FLAT) their arrays where the batcher made them, in a block: :mod:`.blocks`


class _Pickler(pickle.Pickler):
    """Protocol 5 with a plain contiguous array made by ``numpy.ndarray(shape, dtype, buffer)``:
    a C call on the reading side, where numpy's own reduction runs a Python function per array
    (~15 of the ~30 us a 6-field batch took to unpickle)."""

    def reducer_override(self, obj: Any) -> Any:
        if type(obj) is np.ndarray and obj.flags.c_contiguous and obj.dtype.kind in PLAIN_KINDS:   # (times export no buffer)
            return np.ndarray, (obj.shape, obj.dtype.str, pickle.PickleBuffer(obj))  # type: ignore[arg-type]
        return NotImplemented


def _dumps(msg: Any, buffers: list[pickle.PickleBuffer]) -> bytes:
    """``msg`` pickled with its arrays' memory left out of band (appended to ``buffers``)."""
    out = io.BytesIO()
    _Pickler(out, protocol=5, buffer_callback=buffers.append).dump(msg)
    return out.getvalue()


class FrameWriter:
    """The worker's end: :meth:`send` writes one message (from one thread)."""

    def __init__(self, conn: Connection, ring: int = CAPACITY, blocks: int = 0, block: int = BLOCK) -> None:
        self.conn = conn
        self.blocks, self.block = blocks, block   # the blocks after the ring, for the batcher's gathers (:mod:`.blocks`)
        self.sock = socket_of(conn)
        self.sent: OrderedDict[bytes, Any] = OrderedDict()   # what went whole lately (a pack window: see shipping)
        self.ring: RingWriter | None = None   # made at the first message with arrays (its descriptor goes with it)
        self.capacity = ring   # its bytes (0: none, every array through the socket)
        self.shared = HAS_RING and self.sock is not None and ring > 0   # arrays through shared memory (:mod:`.ring`)
        self.unsent_fd = False   # the ring is made and its descriptor has not gone yet
        self.layouts: dict[Any, int] = {}   # the batch layouts sent (:mod:`.flat`)

    def send(self, msg: Any, views: bool = False) -> None:
        """Write ``msg``; its contiguous arrays go after the header as they are, or into the ring
        (:mod:`.ring`), where the parent hands them out as they lie with ``views`` (it keeps nothing
        of the message for long: batches without a state), else copies them out.

        Raises:
            OSError: the parent is gone (a broken pipe).
        """
        if self.sock is None:
            with shipping(self.sent):
                self.conn.send(msg)
            return
        if self.shared and self._send_flat(msg):
            return
        buffers: list[pickle.PickleBuffer] = []
        with shipping(self.sent):
            header = _dumps(msg, buffers)
        raw = [b.raw() for b in buffers]
        sizes = b"".join(_SIZE.pack(v.nbytes) for v in raw)
        placed = self._place(raw) if raw and self.shared else None
        if placed is not None:   # the socket carries where they lie, not the arrays
            at, end, ancillary = placed
            where = b"".join(_SIZE.pack(a) for a in at) + _SIZE.pack(end)
            kind = _IN_RING | (_VIEWS if views else 0)
            send_all(self.sock, [_PREFIX.pack(len(raw) | kind, len(header)) + sizes + where + header], ancillary)
            return
        send_all(self.sock, [_PREFIX.pack(len(raw), len(header)) + sizes + header, *raw], self._fresh())

    def _send_flat(self, msg: Any) -> bool:
        """Send ``msg`` as integers (:mod:`.flat`) where it is batches of plain arrays and they fit in the ring."""
        assert self.sock is not None
        kind = msg[0]
        flat = encode(self.layouts, [msg] if kind == "batch" else msg[1] if kind == "many" else [])
        if flat is None:
            return False
        extra, before = flat.extra(), None
        if extra is None and self.ring is not None:
            found = self.ring.blocks.locate(flat.arrays)
            if found is not None:   # laid out in place: only where they lie goes
                at, start, end, b = found
                header = flat.header(self.layouts, at, start, end, b"", [])
                send_all(self.sock, [_PREFIX.pack(_IN_RING | _FLAT | _BLOCK, len(header)) + header], self._fresh(), True)
                self.ring.blocks.sent[b] += 1
                return True
            if kind == "many" and any(self.ring.blocks.holds(m[3]) for m in msg[1]):
                for one in msg[1]:   # several partitions' blocks: each batch where it lies, back to back
                    self.send(one, True)   # (the parent reads them in one call, as it would the one message)
                return True
        buffers: list[pickle.PickleBuffer] = []
        if extra is not None:   # pickled before it surely goes: what it notes as sent is put back if it does not
            before = OrderedDict(self.sent)
            with shipping(self.sent):
                extra = _dumps(extra, buffers)
        raw = [memoryview(a).cast("B") if a.size else memoryview(b"") for a in flat.arrays]  # type: ignore[arg-type]
        raw += [b.raw() for b in buffers]
        placed = self._place(raw)
        if placed is None:
            if before is not None:
                self.sent.clear()
                self.sent.update(before)
            return False
        at, end, ancillary = placed
        header = flat.header(self.layouts, at, at[0] if at else end, end, extra or b"",
                             [v.nbytes for v in raw[len(flat.arrays):]])
        send_all(self.sock, [_PREFIX.pack(_IN_RING | _FLAT, len(header)) + header], ancillary)
        return True

    def arena(self, key: Any, nbytes: int) -> BlockArena | None:
        """A block for the next gather of partition ``key``'s batcher (:mod:`feedline._core.memory`'s
        source), its last one retired; ``None`` where there is none free (or no shared memory)."""
        if not self.blocks or not self._made():
            return None
        assert self.ring is not None
        return self.ring.blocks.arena(key, nbytes)

    def retire(self, key: Any) -> None:
        """Partition ``key`` sends nothing more from its block (it restarts, or ended)."""
        if self.ring is not None:
            self.ring.blocks.retire(key)

    def _made(self) -> bool:
        """Whether the ring is there (made now if it is not yet: its descriptor goes with the next message)."""
        if self.ring is None and self.shared:
            try:
                self.ring = RingWriter(self.capacity, self.blocks, self.block)
                self.unsent_fd = True
            except OSError:   # no memfd here (a sandbox): the socket carries everything
                self.shared = False
        return self.ring is not None

    def _place(self, raw: list[memoryview]) -> tuple[list[int], int, list[Any]] | None:
        """``raw`` copied into the ring (made now if it is not yet): their positions, the region's end
        and what goes with the message (the ring's descriptor, with the first one after it is made);
        ``None`` where it cannot hold them (or there is no ring: the socket carries them)."""
        if not self._made():
            return None
        assert self.ring is not None
        placed = self.ring.place(raw)
        if placed is None:
            return None
        return placed[0], placed[1], self._fresh()

    def _fresh(self) -> list[Any]:
        """The ring's descriptor where the parent has not had it yet (it goes with the next message's first byte)."""
        if not self.unsent_fd or self.ring is None:
            return []
        self.unsent_fd = False
        return [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [self.ring.fd]))]

    def close(self) -> None:
        if self.sock is not None:
            self.sock.close()
        if self.ring is not None:
            self.ring.close()
            self.ring = None


class FrameReader:
    """The parent's end: :meth:`recv` reads one message, :meth:`recv_ready` one that has begun to
    arrive (from one thread at a time), through a :class:`~feedline._partitions.sockets.BufferedSocket`."""

    def __init__(self, conn: Connection) -> None:
        self.conn = conn
        sock = socket_of(conn)
        self.io = BufferedSocket(sock, self._shared) if sock is not None else None
        self.kept: OrderedDict[bytes, Any] = OrderedDict()   # what came whole lately (see FrameWriter.sent)
        self.ring: RingReader | None = None   # the worker's shared memory, once its descriptor came
        self.layouts = Layouts()   # the batch layouts the worker sent (:mod:`.flat`)

    @property
    def sock(self) -> socket.socket | None:
        """The socket over the pipe (``None`` where it is not one: every message on the ``Connection``)."""
        return self.io.sock if self.io is not None else None

    def _shared(self, fd: int) -> None:
        self.ring = RingReader(fd)

    def buffered(self) -> bool:
        """Whether part of a message was read and not yet taken."""
        return self.io is not None and self.io.buffered() > 0

    @property
    def drained(self) -> bool:
        """Whether the last read took all the socket had then."""
        return self.io is not None and self.io.drained

    def recv(self) -> Any:
        """The next message.

        Raises:
            EOFError: the worker closed its end (exited or died), also in the middle of a message.
            OSError: the pipe failed.
        """
        if self.io is None:
            with shipping(self.kept):
                return self.conn.recv()
        return self._recv()

    def recv_ready(self) -> Any:
        """The next message where any of it has arrived (then it waits for the rest), else ``None`` at once."""
        if self.io is None:
            return self.recv() if self.conn.poll() else None
        if not self.io.buffered() and not self.io.fill(socket.MSG_DONTWAIT):
            return None
        return self.recv()

    def _recv(self) -> Any:
        io = self.io
        assert io is not None
        count, header_size = _PREFIX.unpack(io.take(_PREFIX.size))
        if count & _FLAT:   # batches as integers, their arrays in the ring or a block (:mod:`.flat`)
            if self.ring is None or count & ~_BLOCK != _IN_RING | _FLAT:
                raise EOFError("a partition worker's message is in shared memory it never sent: the stream is corrupt")
            region = self.ring.block_region if count & _BLOCK else self.ring.region
            msgs = self.layouts.decode(io.take(header_size), region, self.kept)   # (at once: the header may lie in the buffer)
            return msgs[0] if len(msgs) == 1 else ("many", msgs)
        shared, as_views, count = count & _IN_RING, count & _VIEWS, count & ~(_IN_RING | _VIEWS | _FLAT)
        if count > MAX_BUFFERS:
            raise EOFError(f"a partition worker's message announces {count} buffers: the stream is corrupt")
        skip = _SIZE.size * (2 * count + 1 if shared else count)
        head = io.take(skip + header_size)   # (read before anything more is: the arrays go to their own memory)
        sizes = [_SIZE.unpack_from(head, _SIZE.size * i)[0] for i in range(count)]
        if shared:
            if self.ring is None:
                raise EOFError("a partition worker's message is in shared memory it never sent: the stream is corrupt")
            at = [_SIZE.unpack_from(head, _SIZE.size * (count + i))[0] for i in range(count)]
            buffers = self.ring.take(at, _SIZE.unpack_from(head, _SIZE.size * 2 * count)[0], sizes, copy=not as_views)
        else:
            if self.ring is not None:   # (the ring's parts no longer held are given back at every message)
                self.ring.release()
            buffers = [np.empty(size, dtype=np.uint8) for size in sizes]
            io.read_all([b.data for b in buffers])   # the arrays' own memory: the socket writes into it
        with shipping(self.kept):
            return pickle.loads(memoryview(head)[skip:], buffers=buffers)

    def close(self) -> None:
        """Stop reading: a thread inside :meth:`recv` gets ``EOFError``, and the worker sees the pipe closed
        once the ``Connection`` is closed too. Idempotent."""
        if self.sock is not None:
            try:
                self.sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            self.sock.close()
        self.ring = None   # (unmapped once a thread still taking from it is done)
