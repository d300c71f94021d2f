"""The wire format of the loader service: a msgpack header, then raw array buffers.

Every message is one ZeroMQ multipart message. Its first frame is a msgpack map with an ``op``;
a ``batch`` is followed by one frame per array, sent without copying::

    client ─► server                          server ─► client
    hello   {v, stream, mode, rank,           welcome {v, stream, spec_hash, state,
             world_size, prefetch, session,            heartbeat, timeout}
             state?, spec_hash?}              batch   {step, state, fields} + buffers
    credit  {n, step?}  (grant n; ack step)   end     {step}
    ping    {}                                pong    {}
    stats   {}                                stats   {stats}
    bye     {}                                error   {kind, message}
                                              bye     {code, reason}  (reconnect, unless
                                                       code is "replaced")

``state`` travels as a JSON string: the exact resume state after that batch, so a client always
knows what it has received however far prefetching ran. ``fields`` lists ``[name, dtype, shape]``
per buffer; only plain numeric dtypes are accepted and every buffer's size is checked against its
shape. Nothing that comes off the network is ever unpickled.

    >>> header, frames = encode_batch({"x": np.arange(3, dtype=np.int32)}, step=1, state="{}")
    >>> decode_batch(unpack_header(header), frames)["x"].tolist()
    [0, 1, 2]
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import msgpack
import numpy as np

from feedline import errors
from feedline.errors import FeedlineError, ProtocolError, RecordError, TransportError

__all__ = [
    "BYE_REPLACED",
    "BYE_SHUTDOWN",
    "BYE_UNKNOWN",
    "CLIENT_OPS",
    "PROTOCOL_VERSION",
    "decode_batch",
    "encode_batch",
    "error_fields",
    "error_from_header",
    "pack",
    "unpack_header",
]

PROTOCOL_VERSION = 1
BYE_REPLACED = "replaced"    # another connection took this rank: do not reconnect
BYE_SHUTDOWN = "shutdown"    # the server is stopping: reconnect (to its successor)
BYE_UNKNOWN = "unknown"      # the server does not know this client (it restarted): say hello again
CLIENT_OPS = frozenset({"hello", "credit", "ping", "stats", "bye"})
_DTYPE_KINDS = frozenset("biuf")
_MAX_FIELDS = 64
_MAX_NDIM = 8
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


def encode_batch(batch: Mapping[str, np.ndarray], *, step: int, state: str,
                 **extra: Any) -> tuple[bytes, list[np.ndarray]]:
    """The header and the buffers (C-contiguous arrays, sent with ``copy=False``) of a batch."""
    arrays = [np.ascontiguousarray(a) for a in batch.values()]
    fields = [[name, a.dtype.str, list(a.shape)] for name, a in zip(batch, arrays)]
    header = pack("batch", step=step, state=state, fields=fields, **extra)
    return header, arrays


def decode_batch(header: Mapping[str, Any], frames: Sequence[Any]) -> dict[str, np.ndarray]:
    """Rebuild a batch from its header and buffer frames (zero-copy views over the frames).

    Raises:
        ProtocolError: a field list that does not describe the frames exactly.
    """
    fields = header.get("fields")
    if not isinstance(fields, list) or len(fields) != len(frames) or len(fields) > _MAX_FIELDS:
        raise ProtocolError(f"batch header lists {_len(fields)} fields but {len(frames)} buffers followed")
    out: dict[str, np.ndarray] = {}
    for spec, frame in zip(fields, frames):
        if not (isinstance(spec, list) and len(spec) == 3 and isinstance(spec[0], str) and isinstance(spec[1], str)
                and isinstance(spec[2], list) and len(spec[2]) <= _MAX_NDIM
                and all(isinstance(d, int) and d >= 0 for d in spec[2])):
            raise ProtocolError(f"malformed field description {spec!r:.80}")
        name, dtype_str, shape = spec
        try:
            dtype = np.dtype(dtype_str)
        except TypeError:
            raise ProtocolError(f"field {name!r}: unknown dtype {dtype_str!r:.20}") from None
        if dtype.kind not in _DTYPE_KINDS or dtype.hasobject or dtype.fields is not None:
            raise ProtocolError(f"field {name!r}: dtype {dtype_str!r} is not a plain numeric type")
        buf = frame.buffer if hasattr(frame, "buffer") else memoryview(frame)
        want = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        if buf.nbytes != want:
            raise ProtocolError(f"field {name!r}: {buf.nbytes} bytes but shape {shape} of {dtype} needs {want}")
        out[name] = np.frombuffer(buf, dtype=dtype).reshape(shape)
    return out


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
