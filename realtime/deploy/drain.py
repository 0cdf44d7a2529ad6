"""Graceful drain of one server: no new sessions, running ones get a grace period, then a clear close.

:class:`Drain` closes the server's admission (:meth:`realtime.engines.placement.EngineSlots.close_admission`): every new
session is refused through the server's usual refusal path with :func:`draining_refusal`: on WebSocket an ``error``
event of code :attr:`DrainCode.SERVER_DRAINING`, then close 1013 "try again later" (another replica serves the retry);
on ``POST /v1/realtime/calls`` an HTTP error with the same code.

:class:`Drain` then waits
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

logger = logging.getLogger(__name__)

POLL_S = 0.1
"""How often the drain looks at the live session count."""


class DrainCode(enum.StrEnum):
    """Wire error code of a refusal during a drain (the ``error.code`` field); never change it."""

    SERVER_DRAINING = "server_draining"


def draining_refusal() -> LimitExceeded:
    """The refusal of a new session while the server drains."""
    return LimitExceeded(
        "this server is shutting down and takes no new sessions; connect again to be served by another",
        code=DrainCode.SERVER_DRAINING,
    )


class Admission(Protocol):
    """The server's session admission (:class:`realtime.engines.placement.EngineSlots`), as a drain uses it."""

    @property
    def active(self) -> int: ...

    def close_admission(self, refusal: LimitExceeded) -> None: ...


class Stoppable(Protocol):
    """What a drain needs of the server (:class:`realtime.server.app.RealtimeServer`): its admission, read once the
    server has started (its engines are loaded then), and ``stop``."""

    @property
    def slots(self) -> Admission: ...

    async def stop(self) -> None: ...


class Drain:
    """The drain of one server (see the module docstring). ``grace_s``: how long running sessions may go on."""

    def __init__(self, server: Stoppable, grace_s: float) -> None:
        if not grace_s >= 0:
            raise ValueError(f"the drain's grace period must be >= 0 seconds, got {grace_s}")
        self._server = server
        self.grace_s = grace_s
        self._task: asyncio.Task | None = None

    @property
    def started(self) -> bool:
        return self._task is not None

    def start(self) -> asyncio.Task:
        """Start draining now (idempotent); the task ends once the server is stopped."""
        if self._task is None:
            self._server.slots.close_admission(draining_refusal())
            self._task = asyncio.create_task(self._run(), name="drain")
        return self._task

    async def wait(self) -> None:
        """Start the drain if it has not started, and wait until it is done."""
        await asyncio.shield(self.start())

    async def _run(self) -> None:
        slots = self._server.slots
        live = slots.active
        logger.info("draining: no new sessions; %d live sessions have %.1f s to finish", live, self.grace_s)
        deadline = time.monotonic() + self.grace_s
        while slots.active > 0 and time.monotonic() < deadline:
            await asyncio.sleep(min(POLL_S, max(0.0, deadline - time.monotonic())))
        if slots.active > 0:
            logger.warning(
                "drain: %d sessions still live after %.1f s: closing them (1001 server shutting down)",
                slots.active,
                self.grace_s,
            )
        await self._server.stop()
        logger.info("drained")
