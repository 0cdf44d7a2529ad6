"""A call's :class:`realtime.runner.Transport`: the ``oai-events`` data channel and the microphone, wherever the
call's media run.

Iteration yields the client's data-channel messages (through the call's gate; a refused one is answered with an
``error`` event) and the microphone's appends (already parsed: no JSON or base64), in arrival order, and ends after
:meth:`CallTransport.disconnect`. A cleared reply's ``conversation.item.truncate`` takes its place in that order when
the reply is cleared; iteration waits there until the media say how much of the reply was played, so nothing
received after the clear (the end of the interrupting turn, a ``response.create``) reaches the session before the
truncation: the next reply is generated from what the user heard.

Bounds: incoming messages wait in a queue of :data:`INCOMING_LIMIT`; when the session falls that far behind, the
session ends ``FAILED`` with :class:`~.errors.MediaBacklog` (its ``error`` event is still sent) rather than silently
losing audio. ``send`` waits until the channel is open (events of a session that starts before the browser's channel
opens are queued, in order) and while the media report the channel busy; the runner's bounded outbound queue then
fills and slows the response, as with a WebSocket.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator
from typing import Protocol

from realtime.errors import RealtimeError, to_error_payload
from realtime.ids import RandomIds
from realtime.observe.error_log import log_error_event
from realtime.protocol.client import InputAudioAppend
from realtime.protocol.names import ClientEventType, Dialect
from realtime.protocol.server import ServerEvents
from realtime.runner import TransportClosed
from realtime.server.limits import MessageGate
from realtime.transports.webrtc.errors import MediaBacklog

logger = logging.getLogger(__name__)

INCOMING_LIMIT = 1000
"""Messages (microphone chunks of 20 ms and data-channel messages) a call's session may fall behind by: 20 s of
audio. Beyond it the call ends with an error."""


class DataChannel(Protocol):
    """The call's data channel, as its media carry it."""

    def channel_ready(self) -> bool:
        """Whether a text sent now can reach the client (False: the channel closed, the call is ending)."""
        ...

    async def send_text(self, text: str) -> None:
        """Send ``text`` on the channel; raises :class:`~realtime.runner.TransportClosed` when the media are gone."""
        ...

    def close_channel(self) -> None:
        """The session is over: close the channel if the media still can."""
        ...


class TransportOwner(Protocol):
    """What the transport needs of its call."""

    id: str

    @property
    def session_id(self) -> str: ...

    def sent(self, event: dict) -> None:
        """``event`` is going to the client now."""
        ...

    def fail(self, error: RealtimeError) -> None:
        """End the session ``FAILED`` with ``error``."""
        ...


class _Refused:
    """A channel message the gate refused: iteration answers it with this error."""

    def __init__(self, error: RealtimeError) -> None:
        self.error = error


class ClearedReplyTruncation:
    """The truncation of a cleared reply's item, queued among the incoming messages where the clear happened; how much
    of the reply was played comes with :meth:`resolve` (None: nothing of it was queued)."""

    def __init__(self, item_id: str) -> None:
        self.item_id = item_id
        self.played_ms: asyncio.Future[float | None] = asyncio.get_running_loop().create_future()

    def resolve(self, played_ms: float | None) -> None:
        if not self.played_ms.done():
            self.played_ms.set_result(played_ms)


def truncate_message(item_id: str, audio_end_ms: int) -> str:
    """The ``conversation.item.truncate`` client message for an assistant item's audio."""
    return json.dumps(
        {
            "type": ClientEventType.CONVERSATION_ITEM_TRUNCATE.value,
            "item_id": item_id,
            "content_index": 0,
            "audio_end_ms": audio_end_ms,
        }
    )


Incoming = str | bytes | InputAudioAppend | ClearedReplyTruncation


class CallTransport:
    """A call's transport (module docstring). ``channel``: the data channel of the call's media; ``gate`` checks the
    client's channel messages (None: not gated); ``dialect``: of the ``error`` events answering refused ones."""

    _END = object()

    def __init__(self, owner: TransportOwner, channel: DataChannel, gate: MessageGate | None, dialect: Dialect) -> None:
        self._owner = owner
        self._channel = channel
        self._gate = gate
        self._events = ServerEvents(dialect, RandomIds())
        self._incoming: asyncio.Queue = asyncio.Queue(INCOMING_LIMIT + 1)  # + the end marker
        self._open = asyncio.Event()
        self._idle = asyncio.Event()  # the data channel is not busy
        self._idle.set()
        self._gone = asyncio.Event()
        self._overflowed = False

    def opened(self) -> None:
        """The data channel is open: sends go out from now on."""
        self._open.set()

    def busy(self, busy: bool) -> None:
        """The channel has more than its high-water mark unsent (True) or drained below its low-water mark (False)."""
        if busy:
            self._idle.clear()
        else:
            self._idle.set()

    def push(self, message: Incoming) -> None:
        """A client message synthesized by the server (a microphone append, a truncation, the offer's
        ``session.update``); a full queue ends the session with :class:`~.errors.MediaBacklog` and nothing more is
        taken."""
        self._put(message)

    def from_client(self, data: str | bytes) -> None:
        """A message the client sent on the data channel, through the gate."""
        refusal = self._gate.check(data) if self._gate is not None else None
        self._put(data if refusal is None else _Refused(refusal))

    def _put(self, message: Incoming | _Refused) -> None:
        if self._gone.is_set() or self._overflowed:
            return
        if self._incoming.qsize() >= INCOMING_LIMIT:
            self._overflowed = True
            logger.error(
                "webrtc %s: the session is %d messages behind: ending the call", self._owner.id, INCOMING_LIMIT
            )
            self._owner.fail(MediaBacklog("the server fell behind on this call's audio; the call ends"))
            return
        self._incoming.put_nowait(message)

    def disconnect(self) -> None:
        """The client left (or the call is ending): iteration ends after the messages already pushed."""
        if not self._gone.is_set():
            self._gone.set()
            self._incoming.put_nowait(self._END)

    async def __aiter__(self) -> AsyncIterator[str | bytes | InputAudioAppend]:
        while True:
            message = await self._incoming.get()
            if message is self._END:
                return
            if isinstance(message, _Refused):
                payload = to_error_payload(message.error)
                log_error_event(payload, session_id=self._owner.session_id, answers=None)
                event = self._events.error(payload)
                if event is not None:  # None: the dialect has no such event
                    await self.send(event)
                continue
            if isinstance(message, ClearedReplyTruncation):
                await self._wait_until(message.played_ms)
                played_ms = message.played_ms.result() if message.played_ms.done() else None
                if played_ms is not None:  # None: nothing of it was queued, or the call is ending
                    yield truncate_message(message.item_id, int(played_ms))
                continue
            yield message

    async def send(self, event: dict) -> None:
        await self._wait_until(self._open)
        while not self._idle.is_set() and not self._gone.is_set():
            await self._wait_until(self._idle)
        if self._gone.is_set() or not self._channel.channel_ready():
            raise TransportClosed("the data channel is closed")
        self._owner.sent(event)
        await self._channel.send_text(json.dumps(event))

    async def close(self) -> None:
        self.disconnect()
        self._channel.close_channel()

    async def _wait_until(self, event: asyncio.Event | asyncio.Future) -> None:
        """Wait for ``event`` (set, or done: it is never cancelled here) or for the client to leave, whichever comes
        first."""
        if (event.done() if isinstance(event, asyncio.Future) else event.is_set()) or self._gone.is_set():
            return
        waiter = event if isinstance(event, asyncio.Future) else asyncio.ensure_future(event.wait())
        gone = asyncio.ensure_future(self._gone.wait())
        try:
            await asyncio.wait({waiter, gone}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            gone.cancel()
            if waiter is not event:
                waiter.cancel()
