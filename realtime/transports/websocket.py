"""The WebSocket transport: runner's :class:`~realtime.runner.Transport` over a Starlette WebSocket.

Handshake (:func:`negotiate`, before ``accept``): beta clients announce themselves with the
``OpenAI-Beta: realtime=v1`` header or the ``openai-beta.realtime-v1`` subprotocol; everyone else
speaks GA. Of the offered subprotocols the server echoes ``realtime`` (else the beta one), never
the ``openai-insecure-api-key.<key>`` one. Browsers fail a handshake whose reply names none of the
subprotocols they offered, so browser clients must offer ``realtime`` along with their key.

Messages (:class:`WebSocketTransport`): each client message passes a
:class:`~realtime.limits.MessageGate` first; a rejected one (binary frame, over the size limit,
over the event rate) never reaches the session: the transport answers it with an ``error`` event
and keeps the connection. Sends are serialized by a lock, so these answers never interleave with
the runner's own sends.
"""

from __future__ import annotations

import asyncio
import enum
import json
import logging
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass

from starlette.websockets import WebSocket, WebSocketDisconnect, WebSocketState

from realtime.auth import is_key_subprotocol
from realtime.errors import RealtimeError, to_error_payload
from realtime.ids import IdGenerator, RandomIds
from realtime.limits import MessageGate
from realtime.protocol.names import Dialect
from realtime.protocol.server import ServerEvents
from realtime.runner import TransportClosed

logger = logging.getLogger(__name__)

REALTIME_SUBPROTOCOL = "realtime"
BETA_SUBPROTOCOL = "openai-beta.realtime-v1"
BETA_HEADER = "openai-beta"
BETA_HEADER_VALUE = "realtime=v1"


class CloseCode(enum.IntEnum):
    """WebSocket close codes this server uses (RFC 6455 §7.4)."""

    NORMAL = 1000
    GOING_AWAY = 1001
    """The server is shutting down."""
    POLICY_VIOLATION = 1008
    """Refused before the handshake when the server cannot send an HTTP denial (see ``server``)."""
    INTERNAL_ERROR = 1011
    TRY_AGAIN_LATER = 1013
    """Too many sessions: the client may retry later."""


@dataclass(frozen=True)
class Handshake:
    dialect: Dialect
    subprotocol: str | None
    """The subprotocol to accept (echo), or ``None``."""


def beta_requested(openai_beta_header: str | None) -> bool:
    """True when an ``OpenAI-Beta`` header value (a comma-separated list) asks for ``realtime=v1``."""
    return any(part.strip().lower() == BETA_HEADER_VALUE for part in (openai_beta_header or "").split(","))


def negotiate(headers: Mapping[str, str], subprotocols: Sequence[str]) -> Handshake:
    """The dialect and the subprotocol to echo for an upgrade request (``headers`` lower-case keys
    or case-insensitive)."""
    beta = beta_requested(headers.get(BETA_HEADER)) or BETA_SUBPROTOCOL in subprotocols
    dialect = Dialect.BETA if beta else Dialect.GA
    echo = next((p for p in (REALTIME_SUBPROTOCOL, BETA_SUBPROTOCOL) if p in subprotocols), None)
    assert echo is None or not is_key_subprotocol(echo)
    return Handshake(dialect, echo)


class WebSocketTransport:
    """One accepted WebSocket as a runner transport.

    Iterating yields the admitted text messages and ends when the client disconnects.
    ``send`` JSON-encodes one event, reports it to ``on_send`` (metrics) and raises
    :class:`TransportClosed` once the socket is closed. ``close`` is idempotent and uses
    :attr:`close_code` (set it before cancelling a runner to close with another code)."""

    def __init__(
        self,
        websocket: WebSocket,
        *,
        gate: MessageGate,
        dialect: Dialect,
        on_send: Callable[[dict], None] | None = None,
        ids: IdGenerator | None = None,
    ) -> None:
        self._ws = websocket
        self._gate = gate
        self._events = ServerEvents(dialect, ids or RandomIds())
        self._on_send = on_send
        self._lock = asyncio.Lock()
        self.close_code = CloseCode.NORMAL
        self.close_reason = ""

    async def __aiter__(self) -> AsyncIterator[str]:
        while True:
            message = await self._ws.receive()
            if message["type"] == "websocket.disconnect":
                return
            data = message.get("text")
            if data is None:
                data = message.get("bytes") or b""
            refusal = self._gate.check(data)
            if refusal is None:
                yield data
            else:
                await self._refuse(refusal)

    async def _refuse(self, error: RealtimeError) -> None:
        event = self._events.error(to_error_payload(error))
        assert event is not None, "every dialect has error events"
        await self.send(event)

    async def send(self, event: dict) -> None:
        text = json.dumps(event, separators=(",", ":"), ensure_ascii=False)
        async with self._lock:
            if self._ws.application_state is not WebSocketState.CONNECTED:
                raise TransportClosed("the WebSocket is closed")
            try:
                await self._ws.send_text(text)
            except (WebSocketDisconnect, RuntimeError, OSError) as exc:
                raise TransportClosed(f"the WebSocket closed while sending: {exc!r}") from exc
        if self._on_send is not None:
            self._on_send(event)

    async def close(self) -> None:
        async with self._lock:
            if self._ws.application_state is not WebSocketState.CONNECTED:
                return
            try:
                await self._ws.close(int(self.close_code), self.close_reason or None)
            except (WebSocketDisconnect, RuntimeError, OSError) as exc:
                # The peer went away first: the socket is closed either way.
                logger.debug("closing an already broken WebSocket: %r", exc)
