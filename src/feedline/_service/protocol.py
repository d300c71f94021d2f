"""The wire format of the loader service: a msgpack header, then one frame of array bytes.

Every message is one ZeroMQ multipart message. Its first frame is a msgpack map with an ``op``;
a ``batch`` is followed by exactly one payload frame holding every array of the batch, each at an
offset aligned to 8 bytes, so the receiver gets zero-copy numpy views over one buffer::

    client ─► server                          server ─► client
    hello   {v, stream, mode, rank,           welcome {v, stream, spec_hash, state, heartbeat,
             world_size, prefetch, session,            timeout, prefetch, batch}
             state?, spec_hash?}              batch   {step, state, fields, layout?} + payload
                                              batches {items: [{step, state, fields, layout?,
                                                       at: [offset, size]}, ...]} + payload
    credit  {n, step?}  (grant n; ack step)   end     {step}
    returned {steps}  (of a revoke: the steps revoke {steps}  (shared mode, at the end:
              still queued, not handed on)             give back those not handed on)
    ping    {}                                pong    {}
    stats   {}                                stats   {stats}
    bye     {}                                error   {kind, message}
                                              bye     {code, reason}  (reconnect, unless
                                                       code is "replaced")

``state`` is the exact resume state after that batch, so a client always knows what it has
received however far prefetching ran. A batch carries it as msgpack bytes (:func:`pack_state`:
an order of magnitude cheaper per step than JSON on the server's critical thread, and decoded by
the client only when asked for), or as a JSON string for a state msgpack cannot hold; hello and
welcome carry JSON strings. ``fields`` lists ``[name, dtype, shape,
offset]`` per array; only plain numeric dtypes are accepted and every array must lie inside the
payload at an offset aligned to its item size. Nothing that comes off the network is ever unpickled.

A ``pack`` batch is sent compact: the arrays are its rows' piece counts, piece lengths and
real tokens, and ``layout`` holds what laying them out takes
(:class:`~feedline._batching.compact.CompactBatch`); the client lays the rows out, bit-identical
to the in-process batch. The server's producer thread skips the layout (~0.3 ms of ~1.2 per
batch at 16 x 1024), and the wire carries ~65 KB instead of ~270 KB (16 MB with a block mask).

A welcome's ``batch`` is the stream's batch shape ``{rows, max_length, max_docs}``
(:func:`~feedline._service.trust.stream_limits`); the client holds every batch to it, and a
``batch`` beyond the credit it granted is refused (:mod:`feedline._service.trust`).

``batches`` carries several consecutive steps in one message (what the credit allows of the steps
ready when the server sends): each item is a ``batch`` header whose arrays lie in the payload's
bytes ``[offset, offset + size)`` (ascending, 8-byte aligned, nothing else in the payload). Every
message costs each side a fixed amount (a wake-up, a poll, three frames through ZeroMQ, a header
decoded), so a server that keeps pace with a fast pipeline pays it once per several steps
(:func:`encode_batches`, :func:`split_batches`).

Both sides check ``v`` (:data:`PROTOCOL_VERSION`): version 1 sent one frame per array, version 2
every batch laid out, version 3 one step per message.

    >>> header, payload = encode_batch({"x": np.arange(3, dtype=np.int32)}, step=1, state="{}")
    >>> decode_batch(unpack_header(header), [payload])["x"].tolist()
    [0, 1, 2]
"""

from __future__ import annotations

import functools
import json
import math
from collections.abc import Mapping, Sequence
from typing import Any

import msgpack
import numpy as np

from feedline import errors
from feedline._batching.compact import MAX_FIELDS, BatchLimits, CompactBatch
from feedline._core.deferred import Deferred, materialize
from feedline.errors import FeedlineError, ProtocolError, RecordError, TransportError

__all__ = [
    "BYE_REPLACED",
    "BYE_SHUTDOWN",
    "BYE_UNKNOWN",
    "CLIENT_OPS",
    "PROTOCOL_VERSION",
    "decode_batch",
    "encode_batch",
    "encode_batches",
    "error_fields",
    "error_from_header",
    "pack",
    "pack_state",
    "split_batches",
    "state_as_json",
    "unpack_header",
    "unpack_state",
]

PROTOCOL_VERSION = 4
BYE_REPLACED = "replaced"    # another connection took this rank: do not reconnect
BYE_SHUTDOWN = "shutdown"    # the server is stopping: reconnect (to its successor)
BYE_UNKNOWN = "unknown"      # the server does not know this client (it restarted): say hello again
CLIENT_OPS = frozenset({"hello", "credit", "returned", "ping", "stats", "bye"})
_DTYPE_KINDS = frozenset("biuf")
_MAX_NDIM = 8
_MAX_ITEMS = 1024   # steps in one ``batches`` message (a client's credit bounds it further)
_MAX_DIM = 1 << 40   # no array dimension is larger (numpy refuses shapes whose size overflows)
_ALIGN = 8          # every array starts at a multiple of this in the payload
_PADS = [bytes(n) for n in range(_ALIGN)]
# the whole exception tree crosses the wire by name (a fixed whitelist: nothing else is ever built)
_ERROR_KINDS: dict[str, type[FeedlineError]] = {
    name: cls for name in errors.__all__
    if isinstance(cls := getattr(errors, name), type) and issubclass(cls, FeedlineError)
}


def pack(op: str, **fields: Any) -> bytes:
    """A header frame: ``pack("ping")`` or ``pack("error", kind=..., message=...)``."""
    return msgpack.packb({"op": op, **fields}, use_bin_type=True)


def unpack_header(frame: bytes | memoryview, max_size: int = 64 << 20) -> dict[str, Any]:
    """Decode and minimally validate a header frame.

    Raises:
        ProtocolError: not msgpack, not a map with a string ``op``, or too large.
    """
    if len(frame) > max_size:
        raise ProtocolError(f"header of {len(frame)} bytes exceeds the {max_size}-byte limit")
    try:
        header = msgpack.unpackb(bytes(frame), raw=False, strict_map_key=True)
    except Exception as e:  # msgpack raises many unrelated types on garbage
        raise ProtocolError(f"header is not valid msgpack ({type(e).__name__}: {e})") from None
    if not isinstance(header, dict) or not isinstance(header.get("op"), str):
        raise ProtocolError("header must be a msgpack map with a string 'op'")
    return header


def encode_batch(batch: Mapping[str, np.ndarray] | CompactBatch, *, step: int, state: bytes | str,
                 **extra: Any) -> tuple[bytes, bytes]:
    """The header and the payload (every array's bytes, each at an 8-byte aligned offset) of a batch.

    One payload per batch: the sender hands ZeroMQ three frames (routing id, header, payload)
    whatever the number of fields, which is what the server's event loop pays for per send. A
    :class:`~feedline._batching.compact.CompactBatch` travels as its arrays plus a ``layout``
    entry in the header; :func:`decode_batch` lays it out.
    """
    parts: list[Any] = []
    entry = _entry(batch, step, state, parts, 0)[0]
    return pack("batch", **entry, **extra), b"".join(parts)


def encode_batches(steps: Sequence[tuple[Mapping[str, np.ndarray] | CompactBatch, int, bytes | str]]) -> tuple[bytes, bytes]:
    """One message of several ``(batch, step, state)``: a ``batches`` header and one payload.

    Each item is the header :func:`encode_batch` would send for its step, plus ``at``: where its
    arrays lie in the payload (:func:`split_batches` gives each item its bytes back).

        >>> h, p = encode_batches([({"x": np.arange(3, dtype=np.int8)}, 1, "{}"), ({"x": np.ones(2, np.int64)}, 2, "{}")])
        >>> [(item["step"], decode_batch(item, [buf])["x"].tolist()) for item, buf in split_batches(unpack_header(h), p)]
        [(1, [0, 1, 2]), (2, [1, 1])]
    """
    parts: list[Any] = []
    items: list[dict[str, Any]] = []
    offset = 0
    for batch, step, state in steps:
        pad = -offset % _ALIGN
        if pad:
            parts.append(_PADS[pad])
            offset += pad
        entry, size = _entry(batch, step, state, parts, 0)
        entry["at"] = [offset, size]
        items.append(entry)
        offset += size
    return pack("batches", items=items), b"".join(parts)


def _entry(batch: Mapping[str, np.ndarray] | CompactBatch, step: int, state: bytes | str, parts: list[Any],
           offset: int) -> tuple[dict[str, Any], int]:
    """The header fields of one batch; its arrays are appended to ``parts`` (offsets from ``offset``).
    Returns the fields and the bytes appended."""
    entry: dict[str, Any] = {"step": step, "state": state}
    if isinstance(batch, CompactBatch):
        entry["layout"] = batch.layout()
        batch = batch.arrays()
    fields: list[list[Any]] = []
    start = offset
    for name, a in batch.items():
        if not a.flags.c_contiguous:
            a = np.ascontiguousarray(a)
        pad = -offset % _ALIGN
        if pad:
            parts.append(_PADS[pad])
            offset += pad
        fields.append([name, a.dtype.str, list(a.shape), offset - start])
        parts.append(a)   # bytes.join reads any C-contiguous buffer
        offset += a.nbytes
    entry["fields"] = fields
    return entry, offset - start


def split_batches(header: Mapping[str, Any], frame: Any) -> list[tuple[dict[str, Any], memoryview]]:
    """The items of a ``batches`` header, each with its bytes of the payload ``frame`` (views).

    Raises:
        ProtocolError: no items or more than 1024, an item that is not a map with its ``at``, or
            items that overlap, leave bytes undescribed or lie outside the payload.
    """
    items = header.get("items")
    if not isinstance(items, list) or not 0 < len(items) <= _MAX_ITEMS:
        raise ProtocolError(f"a batches message lists {_len(items)} items (1 to {_MAX_ITEMS})")
    buf = frame.buffer if hasattr(frame, "buffer") else memoryview(frame)
    buf = buf.cast("B") if buf.format != "B" or buf.ndim != 1 else buf
    out: list[tuple[dict[str, Any], memoryview]] = []
    end = 0
    for item in items:
        at = item.get("at") if isinstance(item, dict) else None
        if not (isinstance(at, list) and len(at) == 2 and all(isinstance(x, int) and not isinstance(x, bool) for x in at)
                and end <= at[0] < end + _ALIGN and at[0] % _ALIGN == 0 and 0 <= at[1] <= buf.nbytes - at[0]):
            raise ProtocolError(f"batches item {len(out)}: 'at' {at!r:.60} is not the next aligned range of the "
                                f"{buf.nbytes}-byte payload (after byte {end})")
        end = at[0] + at[1]
        out.append((item, buf[at[0]:end]))
    if buf.nbytes - end >= _ALIGN:
        raise ProtocolError(f"the batches payload has {buf.nbytes - end} bytes that no item describes")
    return out


def decode_batch(header: Mapping[str, Any], frames: Sequence[Any],
                 limits: BatchLimits | None = None) -> dict[str, np.ndarray]:
    """Rebuild a batch from its header and payload frame (zero-copy views over the payload, or a
    compact batch laid out, checked against ``limits`` before anything is allocated for it).

    Raises:
        ProtocolError: a field list that does not describe the payload exactly, or a compact
            batch beyond ``limits`` or that does not lay out.
    """
    arrays = _decode_arrays(header, frames)
    layout = header.get("layout")
    if layout is None:
        return arrays
    return CompactBatch.from_wire(layout, arrays, limits).expand_checked()


def _decode_arrays(header: Mapping[str, Any], frames: Sequence[Any]) -> dict[str, np.ndarray]:
    fields = header.get("fields")
    if len(frames) != 1:
        raise ProtocolError(f"a batch is a header and one payload frame, got {len(frames)} frames after the header "
                            "(a peer speaking protocol version 1?)")
    if not isinstance(fields, list) or len(fields) > MAX_FIELDS:
        raise ProtocolError(f"batch header lists {_len(fields)} fields (at most {MAX_FIELDS})")
    frame = frames[0]
    buf = frame.buffer if hasattr(frame, "buffer") else memoryview(frame)
    size = buf.nbytes
    out: dict[str, np.ndarray] = {}
    end = 0
    for spec in fields:
        if not (isinstance(spec, list) and len(spec) == 4 and isinstance(spec[0], str) and isinstance(spec[1], str)
                and isinstance(spec[2], list) and len(spec[2]) <= _MAX_NDIM
                and all(isinstance(d, int) and not isinstance(d, bool) and 0 <= d <= _MAX_DIM for d in spec[2])
                and isinstance(spec[3], int) and spec[3] >= end):
            raise ProtocolError(f"malformed field description {spec!r:.80}")
        name, dtype_str, shape, offset = spec
        dtype = _dtype(name, dtype_str)
        count = math.prod(shape)
        end = offset + count * dtype.itemsize
        if end > size or offset % dtype.itemsize:
            raise ProtocolError(f"field {name!r}: {count * dtype.itemsize} bytes at offset {offset} do not fit "
                                f"the {size}-byte payload aligned to {dtype.itemsize}")
        if name in out:
            raise ProtocolError(f"field {name!r} is listed twice")
        try:
            out[name] = np.frombuffer(buf, dtype=dtype, count=count, offset=offset).reshape(shape)
        except ValueError as e:   # a shape numpy cannot index (an empty array of huge dimensions)
            raise ProtocolError(f"field {name!r}: shape {shape} ({e})"[:200]) from None
    if size - end >= _ALIGN or (not fields and size):
        raise ProtocolError(f"the payload has {size - end} bytes that no field describes")
    return out


@functools.lru_cache(maxsize=64)
def _plain_dtype(dtype_str: str) -> np.dtype[Any] | None:
    """``dtype_str`` as a plain numeric dtype, else ``None`` (cached: a stream repeats a few)."""
    try:
        dtype = np.dtype(dtype_str)
    except TypeError:
        return None
    if dtype.kind not in _DTYPE_KINDS or dtype.hasobject or dtype.fields is not None:
        return None
    return dtype


def _dtype(name: str, dtype_str: str) -> np.dtype[Any]:
    dtype = _plain_dtype(dtype_str)
    if dtype is None:
        try:
            np.dtype(dtype_str)
        except TypeError:
            raise ProtocolError(f"field {name!r}: unknown dtype {dtype_str!r:.20}") from None
        raise ProtocolError(f"field {name!r}: dtype {dtype_str!r} is not a plain numeric type")
    return dtype


def pack_state(state: Mapping[str, Any]) -> bytes | str:
    """A resume state for a batch header: msgpack bytes, or compact JSON when msgpack cannot hold it
    (an integer beyond 64 bits). Either way :func:`unpack_state` gives back what JSON would. The
    state may be a snapshot: its :class:`~feedline._core.deferred.Deferred` parts are packed as
    their values, without the deep copy :func:`~feedline._core.deferred.materialize` makes.

        >>> unpack_state(pack_state({"step": 3, "big": 2**70}))
        {'step': 3, 'big': 1180591620717411303424}
    """
    try:
        return msgpack.packb(state, use_bin_type=True, default=_deferred_value)  # type: ignore[no-any-return]
    except (OverflowError, TypeError, ValueError):
        return json.dumps(materialize(state), separators=(",", ":"))


def _deferred_value(value: Any) -> Any:
    """msgpack's hook for what it cannot pack: a snapshot's deferred part is packed as its value."""
    if type(value) is Deferred:
        return value()
    raise TypeError(f"cannot pack {type(value).__name__} in a state")


def unpack_state(raw: bytes | str) -> dict[str, Any]:
    """The state a batch header carries, as the JSON of the same state would give it.

    Raises:
        ProtocolError: neither a msgpack map nor a JSON object.
    """
    try:
        if isinstance(raw, str):
            value = json.loads(raw)
        else:   # the JSON round trip turns what only msgpack keeps (integer keys, bytes) into JSON's form
            value = json.loads(json.dumps(msgpack.unpackb(raw, raw=False, strict_map_key=False)))
    except Exception as e:
        raise ProtocolError(f"a batch state that does not decode ({type(e).__name__}: {e})"[:300]) from None
    if not isinstance(value, dict):
        raise ProtocolError(f"a batch state must be a map, got {type(value).__name__}")
    return value


def state_as_json(raw: bytes | str) -> str:
    """The state of a batch header as a JSON string (what hello, welcome and HTTP carry)."""
    return raw if isinstance(raw, str) else json.dumps(unpack_state(raw), separators=(",", ":"))


def error_fields(e: BaseException) -> dict[str, Any]:
    """The fields of an ``error`` message for ``e``: its kind in the exception tree, message, details.

    A feedline error keeps its class (and a ``RecordError`` its path, line and reason), so a
    failure raises the same type remotely as in-process; anything else is a ``TransportError``.

        >>> error_fields(RecordError("x.jsonl:3: bad_json", path="x.jsonl", line=3, reason="bad_json"))["line"]
        3
    """
    kind = type(e).__name__ if isinstance(e, FeedlineError) and type(e).__name__ in _ERROR_KINDS else "TransportError"
    fields: dict[str, Any] = {"kind": kind, "message": str(e) if isinstance(e, FeedlineError)
                              else f"{type(e).__name__}: {e}"}
    if isinstance(e, RecordError):
        fields.update(path=e.path, line=e.line, reason=e.reason)
    return fields


def error_from_header(header: Mapping[str, Any]) -> FeedlineError:
    """The typed exception an ``error`` message describes (``TransportError`` if unknown)."""
    cls = _ERROR_KINDS.get(str(header.get("kind")), TransportError)
    message = f"loader service: {header.get('message', 'unspecified error')}"
    if cls is RecordError:
        line = header.get("line")
        return RecordError(message, path=str(header.get("path") or ""), reason=str(header.get("reason") or ""),
                           line=line if isinstance(line, int) and not isinstance(line, bool) else None)
    return cls(message)


def _len(x: Any) -> int:
    return len(x) if isinstance(x, list) else 0
