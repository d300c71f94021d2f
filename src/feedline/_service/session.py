"""What the server knows of each connection, and the validation of a client's hello.

    >>> h = {"op": "hello", "v": 1, "stream": "train", "rank": 0, "world_size": 1}
    >>> validate_hello(h, {"train": None}, {"train": "abc"}).mode     # doctest: +SKIP
    'ranked'
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from feedline._service.delivery import Client, Mode
from feedline._service.protocol import PROTOCOL_VERSION
from feedline._state import check_state, parse_state_json
from feedline.errors import ProtocolError, SpecError

if TYPE_CHECKING:
    from feedline._pipeline import Pipeline

__all__ = ["MAX_PREFETCH", "Client", "Hello", "validate_hello"]

MAX_PREFETCH = 1024   # the largest prefetch a client may declare (the server caps it lower)


@dataclass(frozen=True, kw_only=True, slots=True)
class Hello:
    """A validated hello: who the client is and where it starts."""

    stream: str
    mode: Mode
    rank: int
    world_size: int
    prefetch: int
    session: str
    state: dict[str, Any] | None
    state_json: str | None
    revocable: bool = False


def _int(h: Mapping[str, Any], key: str, default: int | None = None) -> int:
    v = h.get(key, default)
    if not isinstance(v, int) or isinstance(v, bool):
        raise ProtocolError(f"hello: {key} must be an integer, got {type(v).__name__}")
    return v


def validate_hello(h: Mapping[str, Any], streams: Mapping[str, Pipeline], hashes: Mapping[str, str]) -> Hello:
    """Check a hello against the server's streams.

    Raises:
        ProtocolError: another protocol version or malformed fields.
        SpecError: unknown stream, bad rank or world size, or a spec the client did not expect.
        StateError: a resume state that is malformed or from another spec.
    """
    v = h.get("v")
    if v != PROTOCOL_VERSION:
        raise ProtocolError(f"client speaks protocol version {v!r}, this server speaks {PROTOCOL_VERSION}; "
                            "install the same feedline version on both sides")
    stream = h.get("stream", "train")
    if not isinstance(stream, str) or stream not in streams:
        raise SpecError(f"no stream named {str(stream)!r:.60} on this server; it serves: {', '.join(sorted(streams))}")
    mode = h.get("mode", "ranked")
    if mode not in ("ranked", "shared"):
        raise ProtocolError(f"hello: mode {str(mode)!r:.20} must be 'ranked' or 'shared'")
    rank, world_size = _int(h, "rank", 0), _int(h, "world_size", 1)
    prefetch = _int(h, "prefetch", 4)
    if not 1 <= prefetch <= MAX_PREFETCH:
        raise ProtocolError(f"hello: prefetch {prefetch} must be in [1, {MAX_PREFETCH}]")
    if mode == "shared":
        rank, world_size = 0, 1
    if world_size < 1 or not 0 <= rank < world_size:
        raise SpecError(f"rank {rank} is not in [0, world_size={world_size})")
    batch_size = streams[stream].spec.batching.batch_size
    if batch_size % world_size:
        raise SpecError(f"stream {stream!r}: batching.batch_size {batch_size} is not a multiple of world_size {world_size}")
    expected = h.get("spec_hash")
    if expected is not None and expected != hashes[stream]:
        raise SpecError(f"the client expects spec {str(expected)!r:.40} but stream {stream!r} serves spec "
                        f"{hashes[stream]!r}; start the server with the same spec")
    session = h.get("session", "")
    if not isinstance(session, str) or len(session) > 64:
        raise ProtocolError("hello: session must be a short string")
    raw = h.get("state")
    state = state_json = None
    if raw is not None:
        if not isinstance(raw, str):
            raise ProtocolError("hello: state must be a JSON string")
        state = check_state(parse_state_json(raw), streams[stream].spec.accepted_hashes())
        state_json = raw
    return Hello(stream=stream, mode=mode, rank=rank, world_size=world_size, prefetch=prefetch, session=session,
                 state=state, state_json=state_json, revocable=h.get("revoke") is True)
