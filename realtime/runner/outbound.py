"""The outbound queue of one session's server events, bounded, and the errors of a client that stopped reading."""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable


class ClientNotReading(Exception):
    """The client stopped reading: the session ends (:attr:`SessionEnd.CLIENT_NOT_READING`). A
    transport raises it from ``send`` when one send makes no progress for too long."""


class OutboundOverflow(ClientNotReading):
    """The client stopped reading: its outbound queue reached the hard limit."""


class OutboundQueue:
    """FIFO of server events waiting for the transport.

    Policy: events are never reordered and never dropped, except audio deltas the session asked to
    drop (:meth:`drop`, after a cancel). Putting never blocks, so the session's event order is
    kept across producers. Bulk producers (response pumps) call :meth:`wait_for_room` before
    pulling more engine output: they pause while ``high_water`` or more events wait. Client
    requests are still served then; if the queue nevertheless reaches ``hard_limit``, the client
    is not reading at all and :meth:`put` raises :class:`OutboundOverflow`, which ends the session.
    """

    def __init__(self, high_water: int = 256, hard_limit: int = 4096) -> None:
        if not 0 < high_water <= hard_limit:
            raise ValueError(f"need 0 < high_water <= hard_limit, got {high_water}, {hard_limit}")
        self.high_water = high_water
        self.hard_limit = hard_limit
        self._events: deque[dict] = deque()
        self._readable = asyncio.Event()
        self._room = asyncio.Event()
        self._room.set()

    def __len__(self) -> int:
        return len(self._events)

    def put(self, event: dict) -> None:
        if len(self._events) >= self.hard_limit:
            raise OutboundOverflow(f"{len(self._events)} server events unsent: the client is not reading")
        self._events.append(event)
        self._update()

    async def get(self) -> dict:
        """The oldest event (waits for one)."""
        while not self._events:
            await self._readable.wait()
        event = self._events.popleft()
        self._update()
        return event

    async def wait_for_room(self) -> None:
        """Return once fewer than ``high_water`` events wait."""
        await self._room.wait()

    def drop(self, keep: Callable[[dict], bool]) -> int:
        """Remove the waiting events ``keep`` rejects; returns how many were removed."""
        before = len(self._events)
        self._events = deque(e for e in self._events if keep(e))
        self._update()
        return before - len(self._events)

    def _update(self) -> None:
        if self._events:
            self._readable.set()
        else:
            self._readable.clear()
        if len(self._events) < self.high_water:
            self._room.set()
        else:
            self._room.clear()
