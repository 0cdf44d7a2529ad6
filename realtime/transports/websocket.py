"""The WebSocket transport: runner's :class:`~realtime.runner.Transport` over a Starlette WebSocket.

Handshake (:func:`negotiate`, before ``accept``): beta clients announce themselves with the
``OpenAI-Beta: realtime=v1`` header or the ``openai-beta.realtime-v1`` subprotocol; everyone else
speaks GA. Of the offered subprotocols the server echoes ``realtime`` (else the beta one), never
the ``openai-insecure-api-key.<key>`` one. Browsers fail a handshake whose reply names none of the
subprotocols they offered, so browser clients must offer ``realtime`` along with their key.

Messages (:class:`WebSocketTransport`): each client message passes a
:class:`~realtime.server.limits.MessageGate` first; a rejected one (binary frame, over the size limit,
over the event rate) never reaches the session: the transport answers it with an ``error`` event
and keeps the connection. Sends are serialized by a lock, so these answers never interleave with
the runner's own sends.

Close codes (:data:`CLOSE_FOR`, from the runner's :class:`~realtime.runner.SessionEnd`): 1000 when
the client left, 1008 when it stopped reading (its outbound queue reached the hard limit, or one
send made no progress for ``send_timeout_s``), 1011 when the session failed or its engine did (after an
``engine_failed`` error event: a new session goes to a surviving engine), 1001 when the server shuts down.
"""

from __future__ import annotations

import asyncio
import enum
import json
import logging
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass

from starlette.websockets import WebSocket, WebSocketDisconnect, WebSocketState

from realtime.errors import RealtimeError, to_error_payload
from realtime.ids import IdGenerator, RandomIds
from realtime.observe.error_log import log_error_event
from realtime.protocol.names import Dialect
from realtime.protocol.server import ServerEvents
from realtime.runner import ClientNotReading, SessionEnd, TransportClosed
from realtime.server.auth import is_key_subprotocol
from realtime.server.limits import MessageGate

logger = logging.getLogger(__name__)

REALTIME_SUBPROTOCOL = "realtime"
BETA_SUBPROTOCOL = "openai-beta.realtime-v1"
BETA_HEADER = "openai-beta"
BETA_HEADER_VALUE = "realtime=v1"


class CloseCode(enum.IntEnum):
    """WebSocket close codes this server uses (RFC 6455, section 7.4)."""

    NORMAL = 1000
    GOING_AWAY = 1001
    """The server is shutting down."""
    POLICY_VIOLATION = 1008
    """Refused before the handshake when the server cannot send an HTTP denial (see ``server``)."""
    INTERNAL_ERROR = 1011
    TRY_AGAIN_LATER = 1013
    """Too many sessions: the client may retry later."""


CLOSE_FOR: dict[SessionEnd, tuple[CloseCode, str]] = {
    SessionEnd.CLIENT_LEFT: (CloseCode.NORMAL, ""),
    SessionEnd.CLIENT_NOT_READING: (CloseCode.POLICY_VIOLATION, "the client is not reading its events"),
    SessionEnd.FAILED: (CloseCode.INTERNAL_ERROR, "internal server error"),
    SessionEnd.CANCELLED: (CloseCode.GOING_AWAY, "server shutting down"),
    SessionEnd.ENGINE_FAILED: (CloseCode.INTERNAL_ERROR, "the engine serving this session failed; reconnect"),
}
"""The close code and reason of each way a session ends."""


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
    :class:`TransportClosed` once the socket is closed, or :class:`ClientNotReading` when the
    socket took none of it for ``send_timeout_s`` seconds (``None``: wait forever). ``close`` is
    idempotent and uses :attr:`close_code` / :attr:`close_reason`, which :meth:`session_ended`
    sets (the runner's ``on_end``)."""

    def __init__(
        self,
        websocket: WebSocket,
        *,
        gate: MessageGate,
        dialect: Dialect,
        on_send: Callable[[dict], None] | None = None,
        ids: IdGenerator | None = None,
        send_timeout_s: float | None = None,
    ) -> None:
        self._ws = websocket
        self._send_timeout_s = send_timeout_s
        self._gate = gate
        self._events = ServerEvents(dialect, ids or RandomIds())
        self._on_send = on_send
        self._lock = asyncio.Lock()
        self.close_code = CloseCode.NORMAL
        self.close_reason = ""
        self.session_id: str | None = None
        """The session's id, for the log line of a refused message (the server sets it)."""

    async def __aiter__(self) -> AsyncIterator[str | bytes]:
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
        payload = to_error_payload(error)
        log_error_event(payload, session_id=self.session_id, answers=None)
        event = self._events.error(payload)
        assert event is not None, "every dialect has error events"
        await self.send(event)

    async def send(self, event: dict) -> None:
        text = json.dumps(event, separators=(",", ":"), ensure_ascii=False)
        async with self._lock:
            if self._ws.application_state is not WebSocketState.CONNECTED:
                raise TransportClosed("the WebSocket is closed")
            try:
                async with asyncio.timeout(self._send_timeout_s):
                    await self._ws.send_text(text)
            except TimeoutError:
                raise ClientNotReading(f"a send made no progress for {self._send_timeout_s:g} s") from None
            except (WebSocketDisconnect, RuntimeError, OSError) as exc:
                raise TransportClosed(f"the WebSocket closed while sending: {exc!r}") from exc
        if self._on_send is not None:
            self._on_send(event)

    def session_ended(self, end: SessionEnd) -> None:
        """Close with the code of ``end`` (:data:`CLOSE_FOR`)."""
        self.close_code, self.close_reason = CLOSE_FOR[end]

    async def close(self) -> None:
        async with self._lock:
            if self._ws.application_state is not WebSocketState.CONNECTED:
                return
            # The closing handshake ends when the server's WebSocket library reads the client's
            # close frame, behind whatever the client sent before it: keep reading meanwhile, or a
            # client that flooded us (and stopped reading) holds the connection for twice the
            # library's close timeout.
            discard = asyncio.create_task(self._discard_incoming())
            try:
                await self._ws.close(int(self.close_code), self.close_reason or None)
            except (WebSocketDisconnect, RuntimeError, OSError) as exc:
                # The peer went away first: the socket is closed either way.
                logger.debug("closing an already broken WebSocket: %r", exc)
            finally:
                discard.cancel()
                await asyncio.wait({discard})

    async def _discard_incoming(self) -> None:
        """Read and drop client messages until the client's side is closed."""
        try:
            while self._ws.client_state is WebSocketState.CONNECTED:
                if (await self._ws.receive())["type"] == "websocket.disconnect":
                    return
        except (WebSocketDisconnect, RuntimeError, OSError) as exc:  # gone: nothing left to read
            logger.debug("stopped reading a closing WebSocket: %r", exc)
