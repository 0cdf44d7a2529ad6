"""Keep one aiortc teardown race out of the error log.

When a WebRTC peer vanishes (its process killed, its network gone) while the server still sends on the data channel,
aiortc's SCTP transport may have a transmit task in flight (a send, or a retransmission timer) when its DTLS transport
closes. That task, created and never awaited by aiortc, then fails with ``ConnectionError("Cannot send encrypted data,
not connected")``, and asyncio logs "Task exception was never retrieved" at ERROR for a call that is already being torn
down as it should (the connection-state handler ends the session). Nothing can await that task from outside aiortc.

:func:`install` wraps the running loop's exception handler: exactly that case (a task running aiortc's
``RTCSctpTransport._transmit`` whose exception is a :class:`ConnectionError`) is logged at DEBUG; every other exception
goes to the handler that was there before, unchanged. Idempotent per loop.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

logger = logging.getLogger(__name__)

_TRANSMIT = "RTCSctpTransport._transmit"


def is_sctp_teardown_race(context: dict[str, Any]) -> bool:
    """Whether a loop exception ``context`` is aiortc's unawaited SCTP transmit failing on a closed DTLS transport."""
    task = context.get("future")
    coro = task.get_coro() if isinstance(task, asyncio.Task) else None
    name = getattr(coro, "__qualname__", "")
    return name == _TRANSMIT and isinstance(context.get("exception"), ConnectionError)


class _Handler:
    def __init__(self, previous) -> None:
        self.previous = previous

    def __call__(self, loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        if is_sctp_teardown_race(context):
            logger.debug("webrtc: aiortc's SCTP transmit ended with its DTLS transport: %s", context.get("exception"))
            return
        if self.previous is not None:
            self.previous(loop, context)
        else:
            loop.default_exception_handler(context)


def install(loop: asyncio.AbstractEventLoop | None = None) -> None:
    """Install the filter on ``loop`` (default: the running loop), once."""
    loop = loop or asyncio.get_running_loop()
    current = loop.get_exception_handler()
    if not isinstance(current, _Handler):
        loop.set_exception_handler(_Handler(current))
