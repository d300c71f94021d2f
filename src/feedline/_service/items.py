"""The typed messages between a client's thread and its connection thread (:mod:`.connection`).

Items go to the caller (``conn.items``): :class:`Welcome`, :class:`Delivered`, :class:`Ended`,
:class:`Failed`; commands go to the connection thread: :class:`Consumed`, :class:`Close`.

    >>> Delivered(step=3, state=b"...", arrays={}).step
    3
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from feedline.errors import FeedlineError

__all__ = ["Close", "Consumed", "Delivered", "Ended", "Failed", "Item", "Welcome"]


@dataclass(frozen=True, slots=True)
class Welcome:
    """The server accepted the hello; ``state`` is where the stream starts (first welcome only)."""

    state: str


@dataclass(frozen=True, slots=True)
class Delivered:
    """One batch and the resume state after it (msgpack bytes or JSON: :func:`~.protocol.unpack_state`)."""

    step: int
    state: bytes | str
    arrays: dict[str, np.ndarray]


@dataclass(frozen=True, slots=True)
class Ended:
    """The stream is over after ``step`` global steps."""

    step: int | None


@dataclass(frozen=True, slots=True)
class Failed:
    """The connection failed for good; ``error`` is what the caller raises."""

    error: FeedlineError


Item = Welcome | Delivered | Ended | Failed


@dataclass(frozen=True, slots=True)
class Consumed:
    """The caller finished ``n`` batches, the last of them ``step``: ack it and grant ``n`` credits."""

    step: int | None
    n: int = 1


@dataclass(frozen=True, slots=True)
class Close:
    """Ack ``ack`` (if given), say bye and stop."""

    ack: int | None
