"""What a client accepts from a server: the welcome's fields and the shape of every batch.

A client trusts nothing it receives. The welcome says what the stream's batches look like (its
``batch`` entry, computed by the server from the stream's spec: :func:`stream_limits`); every
batch is then held to it, and to a byte budget, *before* anything is allocated for it::

    >>> limits = BatchLimits(rows=8, max_length=128, max_docs=64, max_bytes=1 << 30)
    >>> check_plain({"input_ids": np.zeros((8, 129), np.int32)}, limits)
    Traceback (most recent call last):
    ...
    feedline.errors.ProtocolError: batch field 'input_ids': 129 tokens per row, above the stream's max_length 128

Anything inconsistent is a :class:`~feedline.errors.ProtocolError` naming the field: a server
that sends it is broken or hostile, and the client stops instead of holding what it was told to.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from feedline._batching.compact import BatchLimits, id_field
from feedline._batching.pack import row_length
from feedline._service.protocol import PROTOCOL_VERSION, decode_batch
from feedline._service.session import MAX_PREFETCH
from feedline._spec import Spec
from feedline.errors import ProtocolError

__all__ = ["BatchGuard", "BatchLimits", "WelcomeInfo", "check_plain", "check_same_fields", "check_welcome", "id_field", "stream_limits"]

#: The most rows, and tokens per row, a welcome may announce (far above any trainer's batch).
MAX_ROWS = 1 << 20
MAX_ROW_LENGTH = 1 << 24
#: A welcome's heartbeat must lie in this range (seconds); the client pings at most every third of its timeout.
HEARTBEAT_RANGE = (0.01, 3600.0)
_MAX_STATE = 64 << 20
_ROW_FIELDS = ("input_ids", "attention_mask", "position_ids", "token_type_ids")   # [rows, tokens, ...]


@dataclass(frozen=True, slots=True)
class WelcomeInfo:
    """A validated welcome."""

    state: str
    heartbeat: float
    prefetch: int
    limits: BatchLimits


def stream_limits(spec: Spec) -> dict[str, int | None]:
    """The ``batch`` entry of a welcome: what the batches of ``spec``'s stream hold at most (the row
    length as the batchers take it: :func:`~feedline._batching.pack.row_length`).

        >>> stream_limits(Spec.from_mapping({"sources": ["a.txt"], "task": {"kind": "clm", "max_length": 64},
        ...                                  "batching": {"strategy": "pack", "batch_size": 4}}))
        {'rows': 4, 'max_length': 64, 'max_docs': 64}

    Raises:
        SpecError: a strategy with a fixed row length and no length given (as the batcher would).
    """
    b, o = spec.batching, spec.batching.options
    task_length = getattr(spec.task.options, "max_length", None)
    length: int | None = None
    docs: int | None = None
    if b.strategy in ("pack", "concat"):
        length, docs = row_length(o, task_length, b.strategy), o.max_docs_per_row
    elif b.strategy == "pad" and o.pad_to == "max_length":
        length = row_length(o, task_length, "pad")
        if o.pad_to_multiple_of:
            length = -(-length // o.pad_to_multiple_of) * o.pad_to_multiple_of
    return {"rows": b.batch_size, "max_length": length, "max_docs": docs}


def check_welcome(h: Mapping[str, Any], *, stream: str, spec_hash: str | None, timeout: float,
                  max_bytes: int) -> WelcomeInfo:
    """Validate every field of a welcome.

    Raises:
        ProtocolError: another protocol version, or a field missing, of the wrong type or out of range
            (named, with what was expected).
    """
    if h.get("v") != PROTOCOL_VERSION:
        raise ProtocolError(f"the loader service speaks protocol version {h.get('v')!r:.20}, this client speaks "
                            f"{PROTOCOL_VERSION}; install the same feedline version on both sides")
    if h.get("stream") != stream:
        raise ProtocolError(f"welcome: stream {h.get('stream')!r:.40} is not the stream {stream!r} this client asked for")
    got_hash = h.get("spec_hash")
    if not isinstance(got_hash, str) or (spec_hash is not None and got_hash != spec_hash):
        raise ProtocolError(f"welcome: spec_hash {got_hash!r:.40} is not the expected {spec_hash!r}")
    state = h.get("state")
    if not isinstance(state, str) or len(state) > _MAX_STATE:
        raise ProtocolError(f"welcome: state must be a JSON string, got {type(state).__name__}")
    try:
        parsed = json.loads(state)
    except ValueError as e:
        raise ProtocolError(f"welcome: state is not JSON ({e})"[:200]) from None
    if not isinstance(parsed, dict):
        raise ProtocolError(f"welcome: state must be a JSON object, got {type(parsed).__name__}")
    heartbeat = _seconds(h, "heartbeat", *HEARTBEAT_RANGE)
    _seconds(h, "timeout", HEARTBEAT_RANGE[0], 1e9)
    prefetch = _int(h, "prefetch", 1, MAX_PREFETCH)
    batch = h.get("batch")
    if not isinstance(batch, dict):
        raise ProtocolError("welcome: 'batch' (the stream's batch shape) is missing; the server runs another feedline "
                            "version: install the same one on both sides")
    limits = BatchLimits(rows=_int(batch, "rows", 1, MAX_ROWS, "batch.rows"),
                         max_length=_int(batch, "max_length", 1, MAX_ROW_LENGTH, "batch.max_length", optional=True),
                         max_docs=_int(batch, "max_docs", 1, MAX_ROW_LENGTH, "batch.max_docs", optional=True),
                         max_bytes=max_bytes)
    # ping often enough that the server never looks silent to this client's own timeout
    return WelcomeInfo(state=state, heartbeat=min(heartbeat, timeout / 3), prefetch=prefetch, limits=limits)


def check_plain(arrays: Mapping[str, np.ndarray], limits: BatchLimits) -> None:
    """Hold a laid-out batch to the stream's limits: one row count, within ``rows``, token
    fields within ``max_length``, ids as integers.

    Raises:
        ProtocolError: naming the field.
    """
    rows: int | None = None
    for name, a in arrays.items():
        if a.ndim == 0:
            raise ProtocolError(f"batch field {name!r}: a scalar, not rows")
        if rows is None:
            rows = a.shape[0]
            if limits.rows is not None and rows > limits.rows:
                raise ProtocolError(f"batch field {name!r}: {rows} rows, the stream's batches have at most {limits.rows}")
        elif a.shape[0] != rows:
            raise ProtocolError(f"batch field {name!r}: {a.shape[0]} rows where the batch's other fields have {rows}")
        if id_field(name) and a.dtype.kind not in "iu":
            raise ProtocolError(f"batch field {name!r}: dtype {a.dtype} where token ids must be integers")
        if name in _ROW_FIELDS and limits.max_length is not None and a.ndim > 1 and a.shape[1] > limits.max_length:
            raise ProtocolError(f"batch field {name!r}: {a.shape[1]} tokens per row, above the stream's max_length "
                                f"{limits.max_length}")


def check_same_fields(arrays: Mapping[str, np.ndarray], first: Mapping[str, tuple[str, int]]) -> None:
    """Every batch of a stream has the fields, dtypes and ranks of its first.

    Raises:
        ProtocolError: naming the field that differs.
    """
    if arrays.keys() != first.keys():
        odd = sorted(set(arrays) ^ set(first))[:5]
        raise ProtocolError(f"batch fields {odd} differ from the stream's first batch ({sorted(first)[:8]})")
    for name, a in arrays.items():
        if (a.dtype.str, a.ndim) != first[name]:
            raise ProtocolError(f"batch field {name!r}: dtype {a.dtype.str} with {a.ndim} dimensions, where the "
                                f"stream's first batch had {first[name][0]} with {first[name][1]}")


class BatchGuard:
    """What one connection holds its batches to: its stream's limits (the caller's own spec's, else
    the welcome's) and the fields, dtypes and ranks of the stream's first batch.

    Args:
        own: :func:`stream_limits` of the caller's spec, if it gave one (a welcome cannot raise them).
        max_bytes: the byte budget of one batch laid out.
    """

    def __init__(self, own: Mapping[str, int | None] | None, max_bytes: int) -> None:
        self.own = None if own is None else BatchLimits(**own, max_bytes=max_bytes)
        self.limits = self.own
        self.fields: dict[str, tuple[str, int]] | None = None

    def welcome(self, limits: BatchLimits) -> None:
        self.limits = self.own or limits

    def decode(self, h: Mapping[str, Any], frames: Sequence[Any]) -> dict[str, np.ndarray]:
        """The batch of a header and its payload, checked (:func:`check_plain`, :func:`check_same_fields`).

        Raises:
            ProtocolError: naming the field.
        """
        if self.limits is None:
            raise ProtocolError("a batch before the welcome")
        try:
            arrays = decode_batch(h, frames, self.limits)
        except (ValueError, TypeError, OverflowError, IndexError) as e:   # a check missed: still the server's fault
            raise ProtocolError(f"batch {h.get('step')!r:.20} does not decode: {type(e).__name__}: {e}"[:300]) from None
        check_plain(arrays, self.limits)
        if self.fields is None:
            self.fields = {name: (a.dtype.str, a.ndim) for name, a in arrays.items()}
        else:
            check_same_fields(arrays, self.fields)
        return arrays


def _seconds(h: Mapping[str, Any], key: str, low: float, high: float) -> float:
    v = h.get(key)
    if not isinstance(v, (int, float)) or isinstance(v, bool) or not math.isfinite(v) or not low <= v <= high:
        raise ProtocolError(f"welcome: {key} must be a number of seconds in [{low}, {high:g}], got {v!r:.40}")
    return float(v)


def _int(h: Mapping[str, Any], key: str, low: int, high: int, name: str | None = None, *,
         optional: bool = False) -> Any:
    v = h.get(key)
    if optional and v is None:
        return None
    if not isinstance(v, int) or isinstance(v, bool) or not low <= v <= high:
        raise ProtocolError(f"welcome: {name or key} must be an integer in [{low}, {high}], got {v!r:.40}")
    return v
