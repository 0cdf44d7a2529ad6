"""WebRTC calls (OpenAI's GA convention) on aiortc: ``POST /v1/realtime/calls`` → one session.

A call is one ``RTCPeerConnection`` serving one :class:`realtime.runner.SessionRunner`:

- the browser's offer carries an audio track (its microphone) and the ``oai-events`` data
  channel; :meth:`WebRTCCalls.create_call` answers it once every ICE candidate is gathered (aiortc
  has no trickle ICE), announcing only the configured host addresses and using no STUN server;
- microphone frames (Opus → s16 stereo 48 kHz) become ``input_audio_buffer.append`` events in
  the session's input format (handed over already parsed: no JSON or base64), interleaved with
  the data channel's messages in arrival order, so the session, server VAD and barge-in work
  exactly as over a WebSocket;
- the data channel carries the same JSON server events as the WebSocket, except that reply audio
  plays on the outgoing :class:`PacedAudioTrack` (``AudioTransport.MEDIA``) and the session
  reports ``output_audio_buffer.started|stopped|cleared``; a cleared reply (barge-in,
  ``output_audio_buffer.clear``) is truncated in the conversation to what went out on the track;
- the data channel's messages pass the same :class:`~realtime.server.limits.MessageGate` as WebSocket
  messages (size, kind and event rate; a refused one is answered with an ``error`` event);
- a call holds one of the server's :class:`~realtime.server.limits.SessionSlots` (shared with the
  WebSocket endpoint) from its offer to its teardown;
- the call ends when the data channel closes, the connection fails or closes (a peer that vanishes
  without closing fails ICE consent freshness, RFC 7675: ~30 s), the connection is not up within
  ``connect_timeout_s``, the session ends, or the server shuts down (:meth:`WebRTCCalls.close`);
  every task, track, the slot and the peer connection are released then. Every call task is named
  as a session task (``realtime.runner.session_task_name``) and :attr:`WebRTCCalls.open_peers`
  counts the peer connections not closed, for the hygiene counters.

Only ``webrtc`` extras (aiortc, av) are needed; the ASGI route lives in ``realtime.server.app``.
"""

from __future__ import annotations

import asyncio
import enum
import functools
import inspect
import itertools
import json
import logging
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, replace
from typing import Protocol

import numpy as np
from aiortc import RTCConfiguration, RTCDataChannel, RTCPeerConnection
from aiortc.mediastreams import MediaStreamError, MediaStreamTrack

from pipeline.api import EngineHandle
from realtime.engines.placement import EngineSlot
from realtime.engines.pool import end_on_engine_failure
from realtime.errors import ErrorType, RealtimeError, to_error_payload
from realtime.ids import RandomIds
from realtime.media.video import CameraFeed
from realtime.media.video_settings import DEFAULT_CAMERA, CameraSettings
from realtime.observe.error_log import log_error_event
from realtime.observe.first_audio import FirstAudioTrace
from realtime.protocol.client import InputAudioAppend, SessionUpdate, parse_client_event
from realtime.protocol.codes import ErrorCode
from realtime.protocol.names import ClientEventType, Dialect, ServerEvent, server_event_name
from realtime.protocol.server import ServerEvents
from realtime.runner import (
    MediaSink,
    SessionRunner,
    SpeechDetectorFactory,
    Transport,
    TransportClosed,
    session_task_name,
)
from realtime.server.limits import MessageGate, SessionSlot, SessionSlots
from realtime.session import AudioTransport, ResponsePhase, SessionSettings
from realtime.transports import sctp_teardown
from realtime.transports.call_lifecycle import CallLifecycle
from realtime.transports.input_delay import InputDelayMeter
from realtime.transports.media import MicrophoneEncoder, OutputAudioQueue, PacedAudioTrack, frame_to_mono
from realtime.transports.peer import (  # noqa: F401  (IceHostAddress, announce_host_addresses: re-exported)
    OAI_EVENTS_LABEL,
    IceHostAddress,
    accept_offer,
    announce_host_addresses,
    sends_opus,
)
from realtime.transports.video_codecs import SetAside, reject_in_answer, set_aside_undecodable_video

logger = logging.getLogger(__name__)

CHANNEL_HIGH_WATER = 1 << 20
"""Bytes queued on the data channel above which ``send`` waits for the peer to catch up."""
CHANNEL_LOW_WATER = 1 << 18


class WebRTCUnavailable(RealtimeError):
    """The server cannot take calls now (shutting down)."""

    type = ErrorType.SERVER
    code = ErrorCode.SERVER_ERROR


# --- the data-channel transport ------------------------------------------------------------------


@dataclass(frozen=True)
class _Refused:
    """A channel message the gate refused: iteration answers it with this error."""

    error: RealtimeError


class DataChannelTransport:
    """A :class:`realtime.runner.Transport` over the ``oai-events`` data channel.

    Iteration yields the client's messages and the microphone's synthesized appends
    (:meth:`push`), in the order they arrived, and ends after :meth:`disconnect`. A channel
    message ``gate`` refuses is answered with an ``error`` event (in ``dialect``) instead; the
    server's own messages (:meth:`push`) are not gated. ``send`` waits until the channel is open
    (events of a session that starts before the browser's channel opens are queued, in order),
    then JSON-encodes the event, waits while more than :data:`CHANNEL_HIGH_WATER` bytes are
    unsent, and raises :class:`TransportClosed` once the client is gone. ``on_sent(event)`` runs
    for each event handed to the channel."""

    _END = object()

    def __init__(
        self,
        on_sent: Callable[[dict], None] | None = None,
        *,
        gate: MessageGate | None = None,
        dialect: Dialect = Dialect.GA,
    ) -> None:
        self.channel: RTCDataChannel | None = None
        self._on_sent = on_sent
        self._gate = gate
        self._events = ServerEvents(dialect, RandomIds())
        self._incoming: asyncio.Queue = asyncio.Queue()
        self._open = asyncio.Event()
        self._gone = asyncio.Event()
        self._drained = asyncio.Event()
        self.session_id: str | None = None
        """The session's id, for the log line of a refused message (its call sets it)."""

    @property
    def connected(self) -> bool:
        return self._open.is_set() and not self._gone.is_set()

    def attach(self, channel: RTCDataChannel) -> None:
        """Use ``channel`` (the peer's ``oai-events`` channel) from now on."""
        self.channel = channel
        channel.bufferedAmountLowThreshold = CHANNEL_LOW_WATER
        channel.on("message", self._from_client)
        channel.on("close", self.disconnect)
        channel.on("bufferedamountlow", self._drained.set)
        if channel.readyState == "open":
            self._open.set()
        else:
            channel.on("open", self._open.set)

    def push(self, message: str | bytes | InputAudioAppend) -> None:
        """A client message synthesized by the server: microphone audio (an already parsed append) or a
        truncation."""
        if not self._gone.is_set():
            self._incoming.put_nowait(message)

    def _from_client(self, message: str | bytes) -> None:
        """A message from the data channel, through the gate."""
        refusal = self._gate.check(message) if self._gate is not None else None
        if not self._gone.is_set():
            self._incoming.put_nowait(message if refusal is None else _Refused(refusal))

    def disconnect(self) -> None:
        """The client left: iteration ends after the messages already pushed."""
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
                log_error_event(payload, session_id=self.session_id, answers=None)
                await self.send(self._events.error(payload))
                continue
            yield message

    async def send(self, event: dict) -> None:
        await self._wait_until(self._open)
        channel = self.channel
        if self._gone.is_set() or channel is None or channel.readyState != "open":
            raise TransportClosed("the data channel is closed")
        while channel.bufferedAmount > CHANNEL_HIGH_WATER:
            self._drained.clear()
            await self._wait_until(self._drained)
            if self._gone.is_set():
                raise TransportClosed("the data channel is closed")
        if self._on_sent is not None:
            self._on_sent(event)
        channel.send(json.dumps(event))

    async def close(self) -> None:
        self.disconnect()
        channel = self.channel
        if channel is None or channel.readyState in ("closing", "closed"):
            return
        # Closing a channel sends an SCTP reset; over a dead DTLS transport (the peer vanished)
        # aiortc's task for it fails unobserved. The peer connection's close ends it then.
        if channel.transport.transport.state == "connected":
            channel.close()

    async def _wait_until(self, event: asyncio.Event) -> None:
        """Wait for ``event`` or for the client to leave, whichever comes first."""
        if event.is_set() or self._gone.is_set():
            return
        waiters = {asyncio.ensure_future(event.wait()), asyncio.ensure_future(self._gone.wait())}
        try:
            await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for waiter in waiters:
                waiter.cancel()


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


# --- calls ---------------------------------------------------------------------------------------


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


class Call:
    """One call: its peer connection, session runner, data-channel transport and audio queue;
    it is its session's :class:`realtime.runner.MediaSink`.

    ``tasks`` are the call's own tasks (microphone pump, watchdog); the runner tracks its own.
    ``slot`` is the call's session slot, released at teardown."""

    def __init__(
        self,
        call_id: str,
        pc: RTCPeerConnection,
        dialect: Dialect,
        make_runner: Callable[[DataChannelTransport, MediaSink], SessionRunner],
        *,
        gate: MessageGate | None = None,
        slot: SessionSlot | None = None,
    ) -> None:
        self.id = call_id
        self.pc = pc
        self.status = CallStatus.CONNECTING
        self.connected = asyncio.Event()
        self.tasks: set[asyncio.Task] = set()
        self.microphone_frames = 0
        self.refused_video: tuple[SetAside, ...] = ()
        """The offer's video sections refused for their codecs (rejected in the answer)."""
        self.observer: EventObserver | None = None
        self._done_type = server_event_name(ServerEvent.RESPONSE_DONE, dialect)
        self._item_added_type = server_event_name(ServerEvent.OUTPUT_ITEM_ADDED, dialect)
        self._items: dict[str, str] = {}  # response id → its assistant item id
        self.slot = slot
        self.output = OutputAudioQueue()
        self.transport = DataChannelTransport(on_sent=self._on_sent, gate=gate, dialect=dialect)
        self.runner = make_runner(self.transport, self)
        self.transport.session_id = self.runner.session.session_id
        self.track = PacedAudioTrack(self.output, self._playback_finished)

    @property
    def live(self) -> bool:
        return self.status in (CallStatus.CONNECTING, CallStatus.CONNECTED)

    def task_name(self, role: str) -> str:
        return session_task_name(self.runner.session.session_id, f"webrtc {self.id} {role}")

    def spawn(self, coro, role: str) -> None:
        task = asyncio.create_task(coro, name=self.task_name(role))
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    # --- teardown (realtime.transports.call_lifecycle) ---

    def closing(self) -> None:
        self.status = CallStatus.CLOSING

    async def close_media(self) -> None:
        """Stop the reply track, drop its audio and close the peer connection."""
        self.track.stop()
        self.output.clear_all()
        try:
            await self.pc.close()
        except Exception:  # the peer is gone either way; the call must still be forgotten
            logger.exception("webrtc %s: closing the peer connection failed", self.id)
        self.status = CallStatus.CLOSED

    # --- the session's MediaSink ---

    def play(self, response_id: str, pcm: np.ndarray) -> None:
        self.output.play(response_id, pcm)

    def clear(self, response_id: str) -> None:
        """Stop ``response_id``'s audio now, and cut the conversation to what was played.

        Over WebRTC the client cannot know how much it heard, so the call sends the session the
        ``conversation.item.truncate`` a WebSocket client would send (the session then reports
        ``conversation.item.truncated``). Not while the response is still being generated (a
        client's ``output_audio_buffer.clear`` without a cancel): the session refuses that."""
        played_ms = self.output.played_ms(response_id)
        self.output.clear(response_id)
        item_id = self._items.pop(response_id, None)
        session = self.runner.session
        generating = session.active_response_id == response_id and session.response_phase is ResponsePhase.IN_PROGRESS
        if played_ms is not None and item_id is not None and not generating:
            self.transport.push(truncate_message(item_id, int(played_ms)))

    # --- events ---

    def _on_sent(self, event: dict) -> None:
        if self.observer is not None:
            self.observer(event)
        kind = event.get("type")
        if kind == self._item_added_type:
            self._items[event["response_id"]] = event["item"]["id"]
        elif kind == self._done_type:
            # All the response's audio is queued (the session emits PlayAudio before
            # response.done), so the track may report its end once it has played it.
            response_id = event["response"]["id"]
            self.output.end(response_id)
            if self.output.played_ms(response_id) is None:  # no audio left to cut: forget it
                self._items.pop(response_id, None)

    def _playback_finished(self, response_id: str) -> None:
        self._items.pop(response_id, None)
        if self.live:
            self.runner.playback_finished(response_id)


def default_turn_detection() -> SpeechDetectorFactory:
    """Server VAD for one call: silero-vad with its own state (loading takes ~0.1 s)."""
    from realtime.turns.server_vad import TurnDetector
    from realtime.turns.vad import SileroVad

    vad = SileroVad()
    return lambda params: TurnDetector(params, vad)


class WebRTCCalls:
    """The server's WebRTC calls (``app.state.webrtc``).

    ``turn_detector_factory()`` is called once per call and returns (or, when it is a coroutine
    function, resolves to) that call's turn-detector factory, with its own VAD state (default:
    :func:`default_turn_detection`). ``settings_factory(dialect)`` gives a call's session
    settings (default: the engine's, for ``dialect``); the audio transport is always ``MEDIA``.
    ``ice_host_addresses``: the ICE host candidates to offer, each ``"ADDRESS"`` (a local address)
    or ``"ANNOUNCED@BIND"`` (see :class:`IceHostAddress`; tests use ``127.0.0.1``); empty: every
    non-loopback interface, aioice's choice. No STUN/TURN server is ever used, so a server behind
    NAT must announce the address clients reach it on. ``max_calls``: live calls at most; more are
    refused with ``LimitExceeded``; ``slots``: take each call's slot from these instead (the
    server's, shared with its WebSocket sessions; ``max_calls`` is then their limit).
    ``message_gate()``: a fresh gate for each call's data channel messages (default: none).
    ``connect_timeout_s``: a call whose connection is not up by then is dropped.
    ``session_observer()`` (metrics) is called once per answered call; its observer sees every
    event sent on the data channel and is closed when the call ends. ``on_input_delay(seconds)`` (metrics) gets
    each microphone frame's delay behind the call's stream clock as it reaches the session
    (:class:`~realtime.transports.input_delay.InputDelayMeter`). ``camera``: how a call's video track is sampled
    (:mod:`realtime.media.video`); ``on_camera_frame(outcome)`` counts each received camera frame;
    ``on_camera_refused(reason)`` each video track refused in the answer (``unsupported_codec``:
    :mod:`realtime.transports.video_codecs`)."""

    def __init__(
        self,
        engine: EngineHandle,
        *,
        turn_detector_factory: Callable[[], SpeechDetectorFactory | Awaitable[SpeechDetectorFactory]] = (
            default_turn_detection
        ),
        settings_factory: Callable[[Dialect], SessionSettings] | None = None,
        ice_host_addresses: tuple[str, ...] = (),
        max_calls: int = 16,
        slots: SessionSlots | None = None,
        message_gate: Callable[[], MessageGate] | None = None,
        connect_timeout_s: float = 20.0,
        session_observer: Callable[[], EventObserver] | None = None,
        on_first_audio: Callable[[FirstAudioTrace], None] | None = None,
        on_input_delay: Callable[[float], None] | None = None,
        camera: CameraSettings = DEFAULT_CAMERA,
        on_camera_frame: Callable[[str], None] = lambda outcome: None,
        on_camera_refused: Callable[[str], None] = lambda reason: None,
    ) -> None:
        if max_calls < 1:
            raise ValueError(f"max_calls must be at least 1, got {max_calls}")
        self._slots = slots if slots is not None else SessionSlots(max_calls)
        self._message_gate = message_gate
        self._peers: weakref.WeakSet[RTCPeerConnection] = weakref.WeakSet()
        self._engine = engine
        self._turn_detector_factory = turn_detector_factory
        self._settings_factory = settings_factory or (lambda d: SessionSettings.for_engine(engine, dialect=d))
        self.ice_host_addresses = tuple(IceHostAddress.parse(a) for a in ice_host_addresses)
        self.max_calls = self._slots.limit
        self._session_observer = session_observer
        self._on_first_audio = on_first_audio
        self._on_input_delay = on_input_delay
        self._camera_settings = camera
        self._on_camera_frame = on_camera_frame
        self._on_camera_refused = on_camera_refused
        self._lifecycle: CallLifecycle[Call] = CallLifecycle(connect_timeout_s)
        self._ids = itertools.count(1)

    @property
    def connect_timeout_s(self) -> float:
        return self._lifecycle.connect_timeout_s

    @property
    def calls_started(self) -> int:
        return self._lifecycle.calls_started

    @property
    def calls_ended(self) -> int:
        return self._lifecycle.calls_ended

    @property
    def live_calls(self) -> int:
        """Calls not yet torn down (their peer connection is open)."""
        return len(self._lifecycle.calls)

    @property
    def open_peers(self) -> int:
        """Peer connections this endpoint created that are not closed (a call being answered
        included); zero when no call is live, else one leaked."""
        return sum(1 for pc in self._peers if pc.connectionState != "closed")

    @property
    def outbound_events(self) -> int:
        """Server events waiting to be sent, over all calls (bounded per call by the runner's
        outbound queue)."""
        return sum(len(call.runner.outbound) for call in self._lifecycle.calls.values())

    def calls(self) -> tuple[Call, ...]:
        return tuple(self._lifecycle.calls.values())

    async def start(self) -> None:
        """Nothing to start: calls are answered in this process."""

    async def create_call(
        self, offer_sdp: str, *, dialect: Dialect = Dialect.GA, session_overrides: dict | None = None
    ) -> str:
        """Answer the browser's SDP offer and start its session; returns the SDP answer.

        ``session_overrides`` (the ``session`` object of the request) is applied as the session's
        first ``session.update``. Raises :class:`RealtimeError` for an invalid offer or overrides
        (``param`` ``sdp`` / ``session``), ``LimitExceeded`` (``session_limit_reached``) when no
        session slot is free, :class:`WebRTCUnavailable` after :meth:`close`."""
        if self._lifecycle.closed:
            raise WebRTCUnavailable("the server is shutting down")
        first_message = _overrides_message(session_overrides)
        slot = self._slots.try_acquire()  # held while the answer is prepared, then by the call
        if slot is None:
            raise self._slots.refusal()
        try:
            call = await self._set_up(first_message, offer_sdp, dialect, slot)
        except BaseException:
            slot.release()
            raise
        call.observer = self.new_observer()
        self._lifecycle.serve(call)
        logger.info("webrtc %s: answered", call.id)
        return reject_in_answer(call.pc.localDescription.sdp, call.refused_video)

    async def _set_up(self, first_message: str | None, offer_sdp: str, dialect: Dialect, slot: SessionSlot) -> Call:
        """A call with its answer set; on any failure everything it holds is released (but the
        slot: the caller's)."""
        # The call (and its handlers) must exist before the offer is set: aiortc announces the
        # browser's tracks while it applies the offer.
        sctp_teardown.install()
        pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
        self._peers.add(pc)
        try:
            call = await self._new_call(pc, dialect, slot)
        except BaseException:
            await pc.close()
            raise
        offer_sdp, call.refused_video = set_aside_undecodable_video(offer_sdp)
        for section in call.refused_video:
            logger.warning(
                "webrtc %s: refusing the offer's video track (mid %s): it offers %s, this server decodes VP8 and "
                "H.264; the call goes on without video",
                call.id,
                section.mid,
                ", ".join(section.codecs) or "no codec",
            )
            self._on_camera_refused("unsupported_codec")
        try:
            await accept_offer(pc, offer_sdp)
            if first_message is not None:
                call.transport.push(first_message)
            pc.addTrack(call.track)
            if self.ice_host_addresses:
                await announce_host_addresses(pc, self.ice_host_addresses)
            await pc.setLocalDescription(await pc.createAnswer())
            if sends_opus(pc.localDescription.sdp):
                call.track.send_opus()  # encoded by the track: aiortc then only packetizes
            if self._lifecycle.closed:  # close() ran meanwhile and will not see this call
                raise WebRTCUnavailable("the server is shutting down")
        except BaseException:
            await self._lifecycle.teardown(call)
            raise
        return call

    async def close(self) -> None:
        """Refuse new calls, end every call and wait until all are torn down."""
        await self._lifecycle.close()

    # --- one call ---

    async def session_factory(
        self, dialect: Dialect, slot: SessionSlot
    ) -> Callable[[Transport, MediaSink], SessionRunner]:
        """What makes the session runner of a call in ``dialect`` holding ``slot``: its settings (audio transport
        ``MEDIA``), its own turn detection and its engine (the slot's, when the server places sessions on engines).
        The media workers' endpoint (:mod:`realtime.transports.media_workers`) uses it too."""
        settings = replace(self._settings_factory(dialect), audio_transport=AudioTransport.MEDIA, dialect=dialect)
        made = self._turn_detector_factory()
        turn_detector_factory = await made if inspect.isawaitable(made) else made
        # a slot of the server's engine placement names the call's engine, for the call's life
        engine = slot.engine if isinstance(slot, EngineSlot) else self._engine

        def make_runner(transport: Transport, media: MediaSink) -> SessionRunner:
            return SessionRunner(
                transport,
                engine,
                turn_detector_factory=turn_detector_factory,
                settings=settings,
                media=media,
                on_first_audio=self._on_first_audio,
            )

        return make_runner

    def new_gate(self) -> MessageGate | None:
        """A fresh gate for one call's data-channel messages (None: not gated)."""
        return self._message_gate() if self._message_gate is not None else None

    def new_observer(self) -> EventObserver | None:
        """A fresh observer of one call's outgoing events (None: not observed)."""
        return self._session_observer() if self._session_observer is not None else None

    @property
    def slots(self) -> SessionSlots:
        return self._slots

    @property
    def on_input_delay(self) -> Callable[[float], None] | None:
        return self._on_input_delay

    async def _new_call(self, pc: RTCPeerConnection, dialect: Dialect, slot: SessionSlot) -> Call:
        make_runner = await self.session_factory(dialect, slot)
        call = Call(f"rtc_{next(self._ids)}", pc, dialect, make_runner, gate=self.new_gate(), slot=slot)
        self._watch(call)
        if isinstance(slot, EngineSlot):
            slot.on_engine_failure(functools.partial(end_on_engine_failure, call.runner, slot.index))
        return call

    def _watch(self, call: Call) -> None:
        pc = call.pc

        @pc.on("datachannel")
        def on_datachannel(channel: RTCDataChannel) -> None:
            if channel.label != OAI_EVENTS_LABEL or call.transport.channel is not None:
                logger.info("webrtc %s: ignoring data channel %r", call.id, channel.label)
                return
            call.transport.attach(channel)

        @pc.on("track")
        def on_track(track: MediaStreamTrack) -> None:
            if track.kind == "audio":
                pump = self._microphone(call, track)
            elif track.kind == "video":
                pump = self._camera(call, track)
            else:
                pump = _discard(track)
            call.spawn(pump, f"{track.kind} track")

        @pc.on("connectionstatechange")
        def on_state() -> None:
            state = pc.connectionState
            logger.info("webrtc %s: connection %s", call.id, state)
            if state == "connected" and call.status is CallStatus.CONNECTING:
                call.status = CallStatus.CONNECTED
                call.connected.set()
            elif state in ("failed", "closed"):
                call.transport.disconnect()

    async def _microphone(self, call: Call, track: MediaStreamTrack) -> None:
        """Feed the browser's microphone to the session until the track ends. Audio it cannot
        convert ends the call: a session that silently stopped hearing its user is worse."""
        encoder = MicrophoneEncoder()
        delay = InputDelayMeter(self._on_input_delay, asyncio.get_running_loop().time) if self._on_input_delay else None
        while True:
            try:
                frame = await track.recv()
            except MediaStreamError:
                return
            call.microphone_frames += 1
            if delay is not None:
                delay.frame(frame.pts, frame.sample_rate)
            fmt = call.runner.session.config.input_format
            try:
                data = encoder.encode(frame_to_mono(frame), frame.sample_rate, fmt)
            except ValueError:
                logger.exception("webrtc %s: unusable microphone audio: ending the call", call.id)
                call.transport.disconnect()
                return
            if data:
                call.transport.push(InputAudioAppend(None, data))

    async def _camera(self, call: Call, track: MediaStreamTrack) -> None:
        """Feed the browser's camera to the user's spoken messages (:mod:`realtime.media.video`) until the track
        ends."""
        feed = CameraFeed(
            call.runner, self._engine.vision, self._camera_settings, count=self._on_camera_frame, label=call.id
        )
        await feed.run(track)


async def _discard(track: MediaStreamTrack) -> None:
    """Consume a track the session has no use for (video), so aiortc does not queue its frames."""
    while True:
        try:
            await track.recv()
        except MediaStreamError:
            return


def _overrides_message(overrides: dict | None) -> str | None:
    """The ``session.update`` message applying ``overrides``, parsed now so that a malformed one (any field the
    parser refuses) fails the HTTP request; values the session refuses, such as an unknown voice, come back as an
    ``error`` event on the data channel, as for any ``session.update``."""
    if not overrides:
        return None
    message = json.dumps({"type": ClientEventType.SESSION_UPDATE.value, "session": overrides})
    event = parse_client_event(message)
    if isinstance(event, SessionUpdate) and event.refused:
        raise event.refused[0]
    return message
