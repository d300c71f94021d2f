"""``RemoteLoader``: the in-process :class:`~feedline.Loader` interface, served by ``feedline serve``.

    >>> loader = feedline.Loader("tcp://127.0.0.1:5555", rank=1, world_size=4)   # doctest: +SKIP
    >>> for batch in loader: ...                                                 # doctest: +SKIP
    >>> state = loader.state_dict()      # resumes any rank, in-process or remote  # doctest: +SKIP

Batches and states are bit-identical to the in-process loader's. Each batch arrives with the
state after it, so :meth:`RemoteLoader.state_dict` is exact however far prefetching ran. The
connection lives in a background thread (:mod:`.connection`) that keeps it alive and
reconnects, with the state of the last batch received, when the server restarts.

``mode="shared"`` joins the stream's work queue instead: whole global batches, each delivered
to one client; a batch is acked when the next one is requested (or on :meth:`close`).
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import time
from collections.abc import Iterator, Mapping
from typing import Any, Literal

from feedline._batching.base import Batch
from feedline._core.options import check_count
from feedline._service.auth import ClientKeys
from feedline._service.connection import Connection, Delivered, Ended, Failed, Item, Welcome
from feedline._service.protocol import PROTOCOL_VERSION, unpack_state
from feedline._service.session import MAX_PREFETCH
from feedline._service.trust import stream_limits
from feedline._spec import Spec
from feedline._state import check_state, make_state, parse_state_json
from feedline.errors import SpecError, StateError, TransportError

__all__ = ["RemoteLoader"]

log = logging.getLogger("feedline.service")

#: A caller waiting this long for its next batch is told why (then every :data:`WAIT_WARN_EVERY_S`).
WAIT_WARN_S = 10.0
WAIT_WARN_EVERY_S = 60.0


class RemoteLoader:
    """One consumer of a loader service.

    Args:
        address: ``tcp://host:port`` or ``ipc://path`` of ``feedline serve``.
        rank, world_size: this consumer's rank (ranked mode).
        state: a :meth:`state_dict` (from a remote or in-process loader) to resume from.
        stream: the named stream (``train`` unless the server has more).
        prefetch: batches in flight or queued locally (the credit window; default 8).
        mode: ``ranked`` (training) or ``shared`` (work queue).
        keys: a folder from ``feedline keys generate`` (default: ``$FEEDLINE_KEYS``), for a
            server that uses CurveZMQ.
        spec: the spec the caller expects the server to serve; a different one is refused.
        timeout: seconds of server silence before reconnecting (honoured whatever the server says).
        reconnect: seconds of failed reconnects before giving up with ``TransportTimeout`` (a keyed
            client whose handshakes keep failing gives up sooner, with ``AuthError``).
        max_message: the largest message accepted from the server, in bytes, and the largest a
            compact batch may lay out to; with ``prefetch`` it bounds this client's memory.
    """

    def __init__(self, address: str, rank: int = 0, world_size: int = 1,
                 state: Mapping[str, Any] | str | None = None, *, stream: str = "train", prefetch: int | None = None,
                 mode: Literal["ranked", "shared"] = "ranked", keys: str | os.PathLike[str] | None = None,
                 spec: Spec | Mapping[str, Any] | str | None = None, timeout: float = 30.0, reconnect: float = 300.0,
                 max_message: int = 1 << 30) -> None:
        if mode not in ("ranked", "shared"):
            raise SpecError(f"mode {mode!r} must be 'ranked' or 'shared'")
        if mode == "shared":
            rank, world_size = 0, 1
        if not 0 <= rank < world_size:
            raise SpecError(f"rank {rank} is not in [0, world_size={world_size})")
        self.address = address
        self.rank, self.world_size, self.mode, self.stream = rank, world_size, mode, stream
        self.prefetch = 8 if prefetch is None else check_count(prefetch, "prefetch", high=MAX_PREFETCH)
        self.timeout, self.reconnect, self.max_message = timeout, reconnect, max_message
        keys = keys if keys is not None else os.environ.get("FEEDLINE_KEYS") or None
        self.keys = ClientKeys.load(keys) if keys is not None else None
        own = Spec.load(spec) if spec is not None else None
        self.spec_hash = own.hash() if own is not None else None
        self._limits = stream_limits(own) if own is not None else None   # else the welcome says them
        self._session = secrets.token_hex(8)
        self._state_raw: bytes | str | None = None   # as the last batch carried it; decoded when asked for
        self._state: dict[str, Any] | None = None
        if state is not None:
            if isinstance(state, (str, bytes)):
                state = parse_state_json(state)
            if not isinstance(state, Mapping):
                raise StateError(f"resume state must be a mapping from Loader.state_dict(), got {type(state).__name__}")
            g = check_state(state, str(state.get("spec_hash")))
            if own is not None:   # any hash the spec accepts (an earlier release's too), as the server does
                check_state(state, own.accepted_hashes())
            self._set_state(json.dumps(make_state(str(state["spec_hash"]), g, world_size), separators=(",", ":")))
        self._conn: Connection | None = None
        self._last_step: int | None = None
        self._finished = False

    # ------------------------------------------------------------ connection
    def _connect(self) -> Connection:
        if self._conn is None:
            hello = {"v": PROTOCOL_VERSION, "stream": self.stream, "mode": self.mode, "rank": self.rank,
                     "world_size": self.world_size, "prefetch": self.prefetch, "session": self._session,
                     "spec_hash": self.spec_hash}
            self._conn = Connection(self.address, hello=hello, resume=self._state_raw, prefetch=self.prefetch,
                                    keys=self.keys, timeout=self.timeout, reconnect=self.reconnect,
                                    max_message=self.max_message, limits=self._limits)
            self._conn.start()
            self._last_step = None
        return self._conn

    def _next_item(self) -> Item:
        """The connection thread's next item, failing if the thread died with nothing queued.

        A wait of :data:`WAIT_WARN_S` is logged with what is known of its cause (no server
        answering, or the server's own account of a stalled stream), so a trainer is never stuck
        in silence.
        """
        conn = self._connect()
        start = warned = time.monotonic()
        first = True
        while (item := conn.next_item(timeout=1.0)) is None:
            now = time.monotonic()
            if now - warned >= (WAIT_WARN_S if first else WAIT_WARN_EVERY_S):
                warned, first = now, False
                log.warning("%s", self._waiting(conn, now - start))
        return item

    def _waiting(self, conn: Connection, waited: float) -> str:
        who = f"rank {self.rank} of {self.world_size}" if self.mode == "ranked" else "shared consumer"
        if not conn.connected:
            return (f"no answer from the loader service at {self.address} for {waited:.0f}s ({who}); is 'feedline "
                    f"serve' running there? Retrying for up to {self.reconnect:.0f}s (reconnect=) before TransportTimeout")
        note = conn.server_note
        if note:
            return f"waited {waited:.0f}s for a batch from {self.address} ({who}); the server says: {note}"
        return (f"waited {waited:.0f}s for a batch from {self.address} ({who}); the server is connected but has "
                "nothing new to send (a slow source or tokenizer, or a stalled stream: see the server's log)")

    def _get(self) -> Delivered | Ended | Failed:
        while True:
            item = self._next_item()
            if isinstance(item, Welcome):
                if self._state_raw is None:
                    self._set_state(item.state)
                continue
            return item

    def _set_state(self, raw: bytes | str) -> None:
        self._state_raw, self._state = raw, None

    # ------------------------------------------------------------- iteration
    def __iter__(self) -> Iterator[Batch]:
        while not self._finished:
            conn = self._connect()
            if self._last_step is not None:
                conn.consumed(self._last_step)   # acks the previous batch, grants one credit
            item = self._get()
            if isinstance(item, Delivered):
                self._set_state(item.state)
                self._last_step = item.step
                yield item.arrays
            elif isinstance(item, Ended):
                self._finished = True
                self._close_connection()
            else:
                self._close_connection()
                raise item.error

    def __next__(self) -> Batch:
        for batch in self:
            return batch
        raise StopIteration

    # ----------------------------------------------------------------- state
    def state_dict(self) -> dict[str, Any]:
        """The JSON state after the last batch this loader returned (bit-identical to in-process)."""
        if self._state_raw is None:
            self._get_welcome()
        if self._state is None:
            assert self._state_raw is not None
            self._state = unpack_state(self._state_raw)
        return json.loads(json.dumps(self._state))  # type: ignore[no-any-return]

    def _get_welcome(self) -> None:
        while self._state_raw is None:
            item = self._next_item()
            if isinstance(item, Welcome):
                self._set_state(item.state)
            elif isinstance(item, Failed):
                self._close_connection()
                raise item.error
            else:  # cannot happen: the welcome always comes first
                raise TransportError(f"expected a welcome from the server, got {type(item).__name__}")

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restart from ``state`` (the next batch is the one that followed it)."""
        self._close_connection()
        g = check_state(state, str(state.get("spec_hash")))
        self._set_state(json.dumps(make_state(str(state["spec_hash"]), g, self.world_size), separators=(",", ":")))
        self._finished = False

    @property
    def step(self) -> int:
        """Global steps received so far."""
        return int(self.state_dict()["step"])

    # ----------------------------------------------------------------- close
    def _close_connection(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.close(ack=self._last_step)

    def close(self) -> None:
        """Ack the last batch (shared mode), say bye and release the connection. Idempotent."""
        self._close_connection()

    def __enter__(self) -> RemoteLoader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        conn, self._conn = getattr(self, "_conn", None), None
        if conn is not None:
            try:
                conn.close(ack=self._last_step, wait=1.0)
            except Exception:
                pass
