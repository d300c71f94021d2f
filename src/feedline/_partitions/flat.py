"""A worker's batches described without pickling: their arrays in the ring, their layout as integers.

A laid-out batch is a dict of a few plain arrays (``input_ids``, ``labels``, ...). Pickling the
message that carries it cost the worker ~50 us a batch (the pickler's Python hook runs for every
object) and the parent ~25 us to unpickle. Where every batch of a message is such a dict, of one
*layout* (its field names, dtypes and dimensions: the same for every batch of a stream), and its
arrays went into the worker's ring (:mod:`.ring`), :func:`encode` describes the message with one
``struct`` per batch (its generation, partition, number, and each array's offset and shape); the
layout goes once per stream as a number (pickled with the message that first uses it), and a state
(every :data:`~feedline._partitions.streams.ANCHOR_EVERY` batches) is pickled on its own, after the
integers. :class:`Layouts` (the parent's) builds the arrays over the ring where they lie
(``numpy.ndarray(shape, dtype, buffer, offset)``: one region per message, handed back when none of
its arrays is left). Anything else (a compact batch, an object array, a full ring) goes pickled as
before (:mod:`.frames`).

    >>> import numpy as np
    >>> batch = {"ids": np.arange(6, dtype=np.int32).reshape(2, 3), "n": np.array(7)}
    >>> flat = encode({}, [("batch", 0, 1, batch, None, 5)])
    >>> region = np.zeros(128, dtype=np.uint8)
    >>> at = [0, 64]
    >>> for a, pos in zip(flat.arrays, at):
    ...     region[pos:pos + a.nbytes] = a.reshape(-1).view(np.uint8)
    >>> extra = pickle.dumps(flat.extra())   # a new layout: it goes once
    >>> from collections import OrderedDict
    >>> msgs = Layouts().decode(flat.header({}, at, 0, 128, extra, []), lambda start, end: region, OrderedDict())
    >>> msgs[0][:3], msgs[0][3]["ids"].tolist(), int(msgs[0][3]["n"]), msgs[0][4:]
    (('batch', 0, 1), [[0, 1, 2], [3, 4, 5]], 7, (None, 5))
"""

from __future__ import annotations

import functools
import pickle
import struct
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import numpy as np

from feedline._core.deferred import shipping

__all__ = ["PLAIN_KINDS", "Flat", "Layouts", "encode"]

#: ``<u32 batches> <u32 layout> <u32 pickled bytes> <u32 its buffers> <u64 region start> <u64 region end>``,
#: then each of the pickled part's buffers (``<u64 offset> <u64 bytes>``), the pickled part (a new
#: layout, states: only where there are any), and one struct per batch.
_HEAD = struct.Struct("<IIIIQQ")
_BUF = struct.Struct("<QQ")
#: The dtype kinds whose arrays export their memory as a buffer: numbers and booleans (times do not).
PLAIN_KINDS = frozenset("biufc")


@functools.lru_cache(maxsize=64)
def _struct(ndims: tuple[int, ...]) -> struct.Struct:
    """A batch's integers: generation, partition, number, each array's offset, then every dimension."""
    return struct.Struct("<qqq" + "Q" * len(ndims) + "Q" * sum(ndims))


class Flat:
    """A message of batches as :func:`encode` found it: its arrays (batch after batch, field after
    field), its layout (``key``) and that layout's number in the writer's memory (``known``: sent before)."""

    __slots__ = ("arrays", "key", "known", "msgs", "number")

    def __init__(self, msgs: list[tuple[Any, ...]], arrays: list[np.ndarray], key: Any, layouts: dict[Any, int]) -> None:
        self.msgs, self.arrays, self.key = msgs, arrays, key
        number = layouts.get(key)
        self.known = number is not None
        self.number = len(layouts) if number is None else number

    def extra(self) -> Any:
        """What goes pickled (``None``: nothing): the layout where it is new, and the states where any is sent."""
        if self.known and all(m[4] is None for m in self.msgs):
            return None
        return (None if self.known else (self.number, self.key), [m[4] for m in self.msgs])

    def header(self, layouts: dict[Any, int], at: list[int], start: int, end: int, extra: bytes,
               sizes: list[int]) -> bytes:
        """The header, the arrays placed at ``at`` (then the pickled part's buffers, ``sizes`` bytes
        each) in the region ``start``..``end``; the layout is noted in ``layouts`` as sent."""
        layouts[self.key] = self.number
        n, one, arrays = len(self.key[0]), _struct(self.key[2]), self.arrays
        k = len(arrays)
        parts = [_HEAD.pack(len(self.msgs), self.number, len(extra), len(sizes), start, end),
                 *[_BUF.pack(p - start, size) for p, size in zip(at[k:], sizes)], extra]
        for j, m in enumerate(self.msgs):
            i = j * n
            parts.append(one.pack(m[1], m[2], m[5], *[p - start for p in at[i:i + n]],
                                  *[d for a in arrays[i:i + n] for d in a.shape]))
        return b"".join(parts)


def encode(layouts: dict[Any, int], msgs: list[tuple[Any, ...]]) -> Flat | None:
    """``msgs`` (``("batch", gen, p, batch, state, seq)`` each) as a :class:`Flat`; ``None`` where a
    message is not a batch of plain arrays of one layout (the caller pickles it). ``layouts`` is
    the writer's memory of the layouts it sent (key -> number)."""
    names: tuple[str, ...] | None = None
    arrays: list[np.ndarray] = []
    for m in msgs:
        if len(m) != 6 or m[0] != "batch" or type(m[3]) is not dict:
            return None
        if names is None:
            names = tuple(m[3])
        elif tuple(m[3]) != names:
            return None
        arrays += m[3].values()
    if not names:   # (no message, or a batch without fields: pickled)
        return None
    ndarray, kinds = np.ndarray, PLAIN_KINDS
    for a in arrays:
        if type(a) is not ndarray or not a.flags.c_contiguous or a.dtype.kind not in kinds:
            return None
    n = len(names)
    key = (names, tuple([a.dtype for a in arrays[:n]]), tuple([a.ndim for a in arrays[:n]]))
    for i in range(n, len(arrays), n):
        if tuple([a.dtype for a in arrays[i:i + n]]) != key[1] or tuple([a.ndim for a in arrays[i:i + n]]) != key[2]:
            return None
    return Flat(msgs, arrays, key, layouts)


class _Layout:
    """One layout as the parent reads it: a batch's struct, and where each field's offset and
    dimensions lie among its integers."""

    __slots__ = ("fields", "one")

    def __init__(self, names: tuple[str, ...], dtypes: tuple[Any, ...], ndims: tuple[int, ...]) -> None:
        self.one = _struct(ndims)
        self.fields, d = [], 3 + len(names)
        for i, (name, dtype, nd) in enumerate(zip(names, dtypes, ndims)):
            self.fields.append((name, np.dtype(dtype), 3 + i, d, d + nd))
            d += nd

    def batch(self, v: tuple[int, ...], buf: np.ndarray) -> dict[str, np.ndarray]:
        """One batch's arrays over ``buf``, from its integers ``v``."""
        nd = np.ndarray
        return {name: nd(v[lo:hi], dtype, buf, v[at]) for name, dtype, at, lo, hi in self.fields}


class Layouts:
    """The parent's end: the layouts a worker sent, and :meth:`decode`."""

    def __init__(self) -> None:
        self.known: dict[int, _Layout] = {}

    def decode(self, head: bytes | bytearray | memoryview, region: Callable[[int, int], np.ndarray],
               kept: OrderedDict[bytes, Any]) -> list[tuple[Any, ...]]:
        """The messages a header describes, their arrays over ``region(start, end)`` (the ring's part
        the message's arrays lie in, as ``uint8``); ``kept``: the stream's memory, for its pickled
        part (:func:`~feedline._core.deferred.shipping`).

        Raises:
            EOFError: the header is not one :func:`encode` made (a corrupt stream).
        """
        count, number, extra, nbufs, start, end = _HEAD.unpack_from(head, 0)
        at = _HEAD.size + nbufs * _BUF.size
        states: list[Any] = [None] * count
        if extra:
            buf = region(start, end)
            try:   # the pickled part's arrays are copied out: a state is kept long, and must not hold the ring
                bufs = [buf[o:o + size].copy() for o, size in _BUF.iter_unpack(head[_HEAD.size:at])]
                with shipping(kept):   # (what came whole lately, kept by key: a pack window)
                    layout, states = pickle.loads(memoryview(head)[at:at + extra], buffers=bufs)
            except (struct.error, pickle.UnpicklingError, ValueError, TypeError) as e:
                raise EOFError(f"a partition worker's message has a broken header ({e}): the stream is corrupt") from e
            at += extra
            if layout is not None:
                self.known[layout[0]] = _Layout(*layout[1])
        known = self.known.get(number)
        if known is None or len(states) != count:
            raise EOFError("a partition worker's message names a batch layout it never sent: the stream is corrupt")
        one = known.one
        if len(head) != at + count * one.size:
            raise EOFError(f"a partition worker's message of {count} batches has a {len(head)}-byte header: the stream is corrupt")
        if not extra:
            buf = region(start, end)
        try:
            return [("batch", v[0], v[1], known.batch(v, buf), state, v[2])
                    for v, state in zip(one.iter_unpack(memoryview(head)[at:]), states)]
        except (TypeError, ValueError) as e:   # an array outside its region
            raise EOFError(f"a partition worker's message places an array outside its memory ({e}): the stream is corrupt") from e
