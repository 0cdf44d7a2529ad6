"""One WebRTC call: its session runner, its transport and the session's media sink, whatever carries its media.

A :class:`Call` owns everything about the call that is not media: the session runner (made by the endpoint), the
:class:`~.transport.CallTransport` the runner reads and writes, the tracking of the replies' items (so a cleared reply
is truncated to what was played), the microphone's delay meter and format conversion, the call's status and tasks.
Its media (:class:`CallMedia`) run either in this process (:mod:`.in_process`) or on a media worker
(:mod:`.worker_media`); they report to the call through its media-event methods (``media_*``, ``client_*``,
``audio_cleared``, ``playback_finished``), always on the event loop.

The call is its session's :class:`realtime.runner.MediaSink`: ``play`` queues reply audio on the media; ``clear``
stops a reply now and queues the reply's ``conversation.item.truncate`` among the incoming messages (not while the
response is still being generated: the session refuses that), resolved when the media say how much of it was played.
Over WebRTC the client cannot know how much it heard, so the call sends the truncation a WebSocket client would send.
"""

from __future__ import annotations

import asyncio
import enum
import logging
from collections.abc import Callable, Coroutine
from typing import Generic, Protocol, TypeVar

import numpy as np

from realtime.errors import RealtimeError
from realtime.media.audio import StreamResampler, decode_audio, encode_audio
from realtime.protocol.audio_format import AudioFormat
from realtime.protocol.client import InputAudioAppend
from realtime.protocol.names import Dialect, ServerEvent, server_event_name
from realtime.runner import MediaSink, SessionEnd, SessionRunner, Transport, session_task_name
from realtime.server.limits import MessageGate, SessionSlot
from realtime.session import ResponsePhase
from realtime.transports.input_delay import InputDelayMeter
from realtime.transports.webrtc.transport import CallTransport, ClearedReplyTruncation, DataChannel

logger = logging.getLogger(__name__)


class EventObserver(Protocol):
    """Watches a call's outgoing events (``realtime.observe.metrics.SessionObserver`` is one)."""

    def __call__(self, event: dict) -> None: ...

    def close(self) -> None:
        """The call ended."""
        ...


class CallStatus(enum.Enum):
    CONNECTING = "connecting"
    """Answered; ICE/DTLS not up yet."""
    CONNECTED = "connected"
    CLOSING = "closing"
    CLOSED = "closed"


class CallMedia(DataChannel, Protocol):
    """Where a call's media run: its peer connection, microphone, reply track and data channel. Every method is
    called on the event loop; none but :meth:`answer` and :meth:`close` waits."""

    def attach(self, call: Call) -> None:
        """Report to ``call`` from now on (called once, before :meth:`answer`)."""
        ...

    async def answer(self, offer_sdp: str) -> str:
        """Answer the offer; returns the SDP answer. Raises :class:`~realtime.errors.RealtimeError`: ``param``
        ``sdp`` for an offer the server cannot take, :class:`~.errors.WebRTCUnavailable` for the server's failure."""
        ...

    def play(self, response_id: str, pcm: np.ndarray) -> None:
        """Queue reply audio (float32 mono, 24 kHz) after what ``response_id`` already queued."""
        ...

    def end_audio(self, response_id: str) -> None:
        """``response_id`` gets no more audio: report :meth:`Call.playback_finished` once it has played, or
        :meth:`Call.audio_cleared` (None) when nothing of it is queued."""
        ...

    def clear_audio(self, response_id: str) -> None:
        """Drop ``response_id``'s unplayed audio (only that response's), then report :meth:`Call.audio_cleared`."""
        ...

    def use_input_format(self, input_format: AudioFormat) -> None:
        """Send the microphone in ``input_format`` from now on (the session changed it)."""
        ...

    async def close(self) -> None:
        """Close the media (stop the track, close the peer connection); must not raise."""
        ...


MediaT = TypeVar("MediaT", bound=CallMedia)


class Call(Generic[MediaT]):
    """One call (module docstring): ``media`` carry it; ``make_runner(transport, sink)`` makes its session runner;
    ``gate`` checks its data-channel messages; ``slot`` is its session slot, released at teardown (by
    :class:`~.lifecycle.CallLifecycle`); ``on_input_delay(seconds)`` gets each microphone frame's delay behind the
    call's stream clock. ``tasks`` are the call's own tasks (the runner tracks its own)."""

    def __init__(
        self,
        call_id: str,
        media: MediaT,
        dialect: Dialect,
        make_runner: Callable[[Transport, MediaSink], SessionRunner],
        *,
        gate: MessageGate | None,
        slot: SessionSlot | None,
        on_input_delay: Callable[[float], None] | None,
    ) -> None:
        self.id = call_id
        self.media = media
        self.slot = slot
        self.status = CallStatus.CONNECTING
        self.connected = asyncio.Event()
        self.tasks: set[asyncio.Task] = set()
        self.observer: EventObserver | None = None
        self.microphone_frames = 0
        self._done_type = server_event_name(ServerEvent.RESPONSE_DONE, dialect)
        self._item_added_type = server_event_name(ServerEvent.OUTPUT_ITEM_ADDED, dialect)
        self._items: dict[str, str] = {}  # response id → its assistant item id
        self._truncating: dict[
            str, ClearedReplyTruncation
        ] = {}  # cleared response id → its truncation, waiting for the media
        self.transport = CallTransport(self, media, gate, dialect)
        self.runner = make_runner(self.transport, self)
        self.input_format = self.runner.session.config.input_format
        """The microphone format the media were last told (:meth:`CallMedia.use_input_format`)."""
        loop = asyncio.get_running_loop()
        self._delay = InputDelayMeter(on_input_delay, loop.time) if on_input_delay is not None else None
        self._converter: tuple[AudioFormat, StreamResampler] | None = None
        media.attach(self)

    @property
    def live(self) -> bool:
        return self.status in (CallStatus.CONNECTING, CallStatus.CONNECTED)

    @property
    def session_id(self) -> str:
        return self.runner.session.session_id

    @property
    def session_input_format(self) -> AudioFormat:
        """The session's microphone format now."""
        return self.runner.session.config.input_format

    def task_name(self, role: str) -> str:
        return session_task_name(self.session_id, f"webrtc {self.id} {role}")

    def spawn(self, coro: Coroutine, role: str) -> None:
        task = asyncio.create_task(coro, name=self.task_name(role))
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    def fail(self, error: RealtimeError) -> None:
        """End the session ``FAILED`` with ``error`` (a session already ending keeps its end)."""
        self.runner.end_for(SessionEnd.FAILED, error)

    # --- teardown (realtime.transports.webrtc.lifecycle) ---

    def closing(self) -> None:
        self.status = CallStatus.CLOSING

    async def close_media(self) -> None:
        await self.media.close()
        self.status = CallStatus.CLOSED

    # --- the session's MediaSink ---

    def play(self, response_id: str, pcm: np.ndarray) -> None:
        self.media.play(response_id, pcm)

    def clear(self, response_id: str) -> None:
        """Stop ``response_id``'s audio now, and cut the conversation to what was played (module docstring)."""
        item_id = self._items.pop(response_id, None)
        session = self.runner.session
        generating = session.active_response_id == response_id and session.response_phase is ResponsePhase.IN_PROGRESS
        if item_id is not None and not generating:
            truncation = ClearedReplyTruncation(item_id)
            self._truncating[response_id] = truncation
            self.transport.push(truncation)
        self.media.clear_audio(response_id)

    # --- events ---

    def sent(self, event: dict) -> None:
        """``event`` is going to the client."""
        if self.observer is not None:
            self.observer(event)
        kind = event.get("type")
        if kind == self._item_added_type:
            self._items[event["response_id"]] = event["item"]["id"]
        elif kind == self._done_type:
            # All the response's audio is queued (the session plays it before its response.done), so the media may
            # report its end once they have played it.
            self.media.end_audio(event["response"]["id"])

    # --- what the media report ---

    def media_connected(self) -> None:
        """ICE and DTLS are up."""
        if self.status is CallStatus.CONNECTING:
            self.status = CallStatus.CONNECTED
        self.connected.set()

    def client_gone(self) -> None:
        """The data channel closed, the connection failed or closed, or the media ended the call."""
        self.transport.disconnect()

    def channel_open(self) -> None:
        self.transport.opened()

    def channel_busy(self, busy: bool) -> None:
        self.transport.busy(busy)

    def client_message(self, data: str | bytes) -> None:
        self.transport.from_client(data)

    def microphone(self, audio: bytes, input_format: AudioFormat, pts: int | None, rate: int) -> None:
        """One received microphone frame (RTP time ``pts`` at ``rate`` Hz), as ``audio`` in ``input_format`` (empty:
        nothing to send yet)."""
        self.microphone_frames += 1
        if self._delay is not None:
            self._delay.frame(pts, rate)
        wanted = self.session_input_format
        if audio and input_format != wanted:
            audio = self._convert(input_format, wanted, audio)
        if audio:
            self.transport.push(InputAudioAppend(None, audio))

    def playback_finished(self, response_id: str) -> None:
        """The last sample of ``response_id`` went out."""
        self._items.pop(response_id, None)
        if self.live:
            self.runner.playback_finished(response_id)

    def audio_cleared(self, response_id: str, played_ms: float | None) -> None:
        """``response_id``'s audio is dropped, ``played_ms`` of it played (None: nothing of it was queued)."""
        self._items.pop(response_id, None)
        truncation = self._truncating.pop(response_id, None)
        if truncation is not None:
            truncation.resolve(played_ms)

    def _convert(self, sent: AudioFormat, wanted: AudioFormat, audio: bytes) -> bytes:
        """A chunk the media encoded before they learnt of the session's new input format: re-encoded here, and the
        media told (the chunks already on their way are converted too)."""
        if self.input_format != wanted:
            self.input_format = wanted
            self.media.use_input_format(wanted)
        if self._converter is None or self._converter[0] != sent:
            self._converter = (sent, StreamResampler(sent.sample_rate, wanted.sample_rate))
        return encode_audio(self._converter[1].process(decode_audio(audio, sent)), wanted)
