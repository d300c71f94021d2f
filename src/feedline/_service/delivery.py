"""The one interface of the two delivery modes, so the dispatcher never asks which mode it serves.

A *delivery* holds produced global steps and decides what each client receives next:
:class:`~.ranked.RankedCursor` (ranked mode: every rank gets its slice of every step, in lockstep)
and :class:`~.shared.SharedQueue` (shared mode: whole batches, each leased to one client). The
dispatcher drives both the same way::

    delivery.join(client)                    # a client was seated on it
    delivery.pump(now)                       # move produced steps in (and expire leases)
    n, oldest, final = delivery.ready(client) # what take would give now (to gather several per send)
    item = delivery.take(client, now)        # Produced | End | None (wait)
    part = delivery.part_for(client)         # which slice of item.slices to send
    state = delivery.state_for(item)         # the resume state that travels with it
    delivery.sent(client, item)              # it is on its way (the next take gives the next), or:
    delivery.giveback(client, item)          #   its send failed: undo take and sent (last first)
    delivery.ack(client, step)               # the client consumed ``step``
    n = delivery.release(client)             # the client left; n batches re-queued for others
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Protocol

from feedline._service.producer import End, Produced

__all__ = ["Client", "Delivery", "Mode"]

Mode = Literal["ranked", "shared"]


@dataclass(kw_only=True, slots=True)
class Client:
    """One connected client: the delivery it is seated on, its credit, and liveness."""

    ident: bytes
    stream: str
    mode: Mode
    rank: int
    world_size: int
    delivery: Delivery
    prefetch: int
    last_seen: float
    credit: int = 0
    sent: int = 0
    acked: int = 0
    ended: bool = False
    revocable: bool = False   # its hello said it answers ``revoke`` (shared mode, at the stream's end)
    unreachable: bool = False   # a send found it gone: dropped at the next dispatch, after what it sent last is read


class Delivery(Protocol):
    """What the dispatcher needs of a delivery mode; see the module docstring."""

    stream: str
    error: BaseException | None
    stall_reason: str | None   # why production waits, when it does (told to waiting clients)

    @property
    def produced(self) -> int:
        """The last global step produced into this delivery."""

    def join(self, client: Client) -> None:
        """Count ``client`` as a consumer (after it was seated)."""

    def pump(self, now: float) -> None:
        """Take produced steps in while there is room; expire what must expire."""

    def ready(self, client: Client) -> tuple[int, float, bool]:
        """How many steps ``client`` could take now, when the first of them was produced (monotonic
        seconds), and whether no more can come before an ack."""

    def take(self, client: Client, now: float) -> Produced | End | None:
        """What ``client`` receives next, ``End``, or ``None`` when it must wait."""

    def part_for(self, client: Client) -> int:
        """The index of ``client``'s slice in ``Produced.slices``."""

    def state_for(self, item: Produced) -> bytes | str:
        """The resume state sent with ``item`` (:func:`~.protocol.pack_state`'s form)."""

    def sent(self, client: Client, item: Produced) -> None:
        """``item`` is being sent to ``client`` (the next :meth:`take` gives what follows it)."""

    def giveback(self, client: Client, item: Produced) -> None:
        """Undo a :meth:`take` and :meth:`sent` whose send failed (several: the last first)."""

    def ack(self, client: Client, step: int) -> None:
        """``client`` consumed ``step``."""

    def release(self, client: Client) -> int:
        """``client`` left; returns how many of its batches were re-queued for others."""

    def close(self) -> None:
        """Stop production and drop everything held."""
