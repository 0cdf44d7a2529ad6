"""Graceful drain of one server: no new sessions, running ones get a grace period, then a clear close.

:class:`DrainingSlots` is the server's session counter (:class:`realtime.limits.SessionSlots`) with a drain switch:
once :meth:`DrainingSlots.start_draining` is called it admits nothing more, and the server's usual refusal path
answers the client with :meth:`DrainingSlots.refusal`: on WebSocket an ``error`` event of code
:attr:`DrainCode.SERVER_DRAINING`, then close 1013 "try again later" (another replica serves the retry); on
``POST /v1/realtime/calls`` an HTTP error with the same code.

:class:`Drain` runs the drain of a :class:`realtime.server.RealtimeServer` whose slots are draining slots: it waits
until every session (WebSocket and WebRTC) has ended or ``grace_s`` seconds have passed, whichever comes first, then
stops the server, which closes each remaining WebSocket session with 1001 "server shutting down" and hangs up every
WebRTC call. Starting it twice runs it once.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import time
from typing import Protocol

from realtime.errors import LimitExceeded
from realtime.limits import SessionSlot, SessionSlots

logger = logging.getLogger(__name__)

POLL_S = 0.1
"""How often the drain looks at the live session count."""


class DrainCode(str, enum.Enum):
    """Wire error code of a refusal during a drain (the ``error.code`` field); never change it."""

    SERVER_DRAINING = "server_draining"

    def __str__(self) -> str:
        return self.value


class DrainingSlots(SessionSlots):
    """Session slots that refuse every new session once draining (see the module docstring). Event loop only."""

    def __init__(self, limit: int) -> None:
        super().__init__(limit)
        self._draining = False

    @property
    def draining(self) -> bool:
        return self._draining

    def start_draining(self) -> None:
        """Admit no more sessions, for good; live ones keep their slots."""
        self._draining = True

    def try_acquire(self) -> SessionSlot | None:
        return None if self._draining else super().try_acquire()

    def refusal(self) -> LimitExceeded:
        if not self._draining:
            return super().refusal()
        return LimitExceeded(
            "this server is shutting down and takes no new sessions; connect again to be served by another",
            code=DrainCode.SERVER_DRAINING,
        )


class Stoppable(Protocol):
    """What a drain needs of the server (:class:`realtime.server.RealtimeServer`)."""

    slots: SessionSlots

    async def stop(self) -> None: ...


class Drain:
    """The drain of one server (see the module docstring). ``grace_s``: how long running sessions may go on."""

    def __init__(self, server: Stoppable, slots: DrainingSlots, grace_s: float) -> None:
        if not grace_s >= 0:
            raise ValueError(f"the drain's grace period must be >= 0 seconds, got {grace_s}")
        self._server = server
        self._slots = slots
        self.grace_s = grace_s
        self._task: asyncio.Task | None = None

    @property
    def started(self) -> bool:
        return self._task is not None

    def start(self) -> asyncio.Task:
        """Start draining now (idempotent); the task ends once the server is stopped."""
        if self._task is None:
            self._slots.start_draining()
            self._task = asyncio.create_task(self._run(), name="drain")
        return self._task

    async def wait(self) -> None:
        """Start the drain if it has not started, and wait until it is done."""
        await asyncio.shield(self.start())

    async def _run(self) -> None:
        live = self._slots.active
        logger.info("draining: no new sessions; %d live sessions have %.1f s to finish", live, self.grace_s)
        deadline = time.monotonic() + self.grace_s
        while self._slots.active > 0 and time.monotonic() < deadline:
            await asyncio.sleep(min(POLL_S, max(0.0, deadline - time.monotonic())))
        if self._slots.active > 0:
            logger.warning(
                "drain: %d sessions still live after %.1f s: closing them (1001 server shutting down)",
                self._slots.active,
                self.grace_s,
            )
        await self._server.stop()
        logger.info("drained")
