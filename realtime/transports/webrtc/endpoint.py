"""WebRTC calls (OpenAI's GA convention): ``POST /v1/realtime/calls`` → one session, served by :class:`WebRTCCalls`.

A call (:class:`~.call.Call`) is one peer connection serving one :class:`realtime.runner.SessionRunner`, with its
media in this process (:mod:`.in_process`), or on a media worker (:mod:`.worker_media`) once the endpoint has workers
(every call then, with or without a camera); the endpoint, the call, its transport, its camera's sampling and its
lifecycle are the same either way:

- the browser's offer carries an audio track (its microphone) and the ``oai-events`` data channel, and may carry a
  video track (its camera, sampled into the user's spoken messages: :mod:`realtime.media.video`);
  :meth:`WebRTCCalls.create_call` answers it (host candidates only, no STUN server);
- microphone frames become ``input_audio_buffer.append`` events in the session's input format (handed over already
  parsed: no JSON or base64), interleaved with the data channel's messages in arrival order, so the session, server
  VAD and barge-in work exactly as over a WebSocket (:mod:`.transport`);
- the data channel carries the same JSON server events as the WebSocket, except that reply audio plays on the
  outgoing track (``AudioTransport.MEDIA``) and the session reports ``output_audio_buffer.started|stopped|cleared``;
  a cleared reply (barge-in, ``output_audio_buffer.clear``) is truncated in the conversation to what went out on the
  track;
- the data channel's messages pass the same :class:`~realtime.server.limits.MessageGate` as WebSocket messages (size,
  kind and event rate; a refused one is answered with an ``error`` event);
- a call holds one of the server's :class:`~realtime.server.limits.SessionSlots` (shared with the WebSocket endpoint)
  from its offer to its teardown;
- the call ends when the data channel closes, the connection fails or closes (a peer that vanishes without closing
  fails ICE consent freshness, RFC 7675: ~30 s), the connection is not up within ``connect_timeout_s``, the session
  ends, its media worker dies, or the server shuts down (:meth:`WebRTCCalls.close`); every task, track, the slot and
  the peer connection are released then (:mod:`.lifecycle`). Every call task is named as a session task
  (``realtime.runner.session_task_name``) and :attr:`WebRTCCalls.open_peers` counts the peer connections not closed,
  for the hygiene counters.

Only ``webrtc`` extras (aiortc, av) are needed; the ASGI route lives in ``realtime.server.app``.
"""

from __future__ import annotations

import functools
import inspect
import json
import logging
from collections.abc import Awaitable, Callable
from dataclasses import replace
from typing import Protocol

from pipeline.api import EngineHandle
from realtime.engines.placement import EngineSlot
from realtime.engines.pool import end_on_engine_failure
from realtime.media.video_settings import DEFAULT_CAMERA, CameraSettings
from realtime.observe.first_audio import FirstAudioTrace
from realtime.protocol.client import SessionUpdate, parse_client_event
from realtime.protocol.names import ClientEventType, Dialect
from realtime.runner import MediaSink, SessionRunner, SpeechDetectorFactory, Transport
from realtime.server.limits import MessageGate, SessionSlot, SessionSlots, SlotSource
from realtime.session import AudioTransport, SessionSettings
from realtime.transports.peer import IceHostAddress
from realtime.transports.webrtc.call import Call, EventObserver
from realtime.transports.webrtc.camera import CallCameras
from realtime.transports.webrtc.errors import WebRTCUnavailable
from realtime.transports.webrtc.in_process import InProcessMediaHost
from realtime.transports.webrtc.lifecycle import CallLifecycle

logger = logging.getLogger(__name__)

RunnerFactory = Callable[[Transport, MediaSink], SessionRunner]


class MediaHost(Protocol):
    """Where calls' media run: makes a call (not answered yet) whose media it carries."""

    @property
    def open_peers(self) -> int:
        """Its peer connections not known closed."""
        ...

    async def new_call(
        self,
        dialect: Dialect,
        make_runner: RunnerFactory,
        *,
        gate: MessageGate | None,
        slot: SessionSlot,
        on_input_delay: Callable[[float], None] | None,
    ) -> Call:
        """A new call; raises :class:`~.errors.WebRTCUnavailable` when it cannot carry one now, and releases what it
        took (but the slot: the caller's) when it fails."""
        ...

    async def start(self) -> None: ...

    async def close(self) -> None:
        """Stop (after every call's teardown)."""
        ...


def default_turn_detection() -> SpeechDetectorFactory:
    """Server VAD for one call: silero-vad with its own state (loading takes ~0.1 s)."""
    from realtime.turns.server_vad import TurnDetector
    from realtime.turns.vad import SileroVad

    vad = SileroVad()
    return lambda params: TurnDetector(params, vad)


class WebRTCCalls:
    """The server's WebRTC calls (``app.state.webrtc``, or wrapped by
    :class:`~.worker_media.WorkerCalls` when their media run on workers).

    ``turn_detector_factory()`` is called once per call and returns (or, when it is a coroutine function, resolves
    to) that call's turn-detector factory, with its own VAD state (default: :func:`default_turn_detection`).
    ``settings_factory(dialect)`` gives a call's session settings (default: the engine's, for ``dialect``); the audio
    transport is always ``MEDIA``. ``ice_host_addresses``: the ICE host candidates to offer, each ``"ADDRESS"`` (a
    local address) or ``"ANNOUNCED@BIND"`` (see :class:`~realtime.transports.peer.IceHostAddress`; tests use
    ``127.0.0.1``); empty: every non-loopback interface, aioice's choice. No STUN/TURN server is ever used, so a server
    behind NAT must announce the address clients reach it on. ``max_calls``: live calls at most; more are refused with
    ``LimitExceeded``; ``slots``: take each call's slot from these instead (the server's, shared with its WebSocket
    sessions; ``max_calls`` is then their limit). ``message_gate()``: a fresh gate for each call's data channel
    messages (default: none). ``connect_timeout_s``: a call whose connection is not up by then is dropped.
    ``session_observer()`` (metrics) is called once per answered call; its observer sees every event sent on the data
    channel and is closed when the call ends. ``on_input_delay(seconds)`` (metrics) gets each microphone frame's delay
    behind the call's stream clock as it reaches the session
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
        slots: SlotSource | None = None,
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
        self._slots: SlotSource = slots if slots is not None else SessionSlots(max_calls)
        self._message_gate = message_gate
        self._engine = engine
        self._turn_detector_factory = turn_detector_factory
        self._settings_factory = settings_factory or (lambda d: SessionSettings.for_engine(engine, dialect=d))
        self.ice_host_addresses = tuple(IceHostAddress.parse(a) for a in ice_host_addresses)
        self.max_calls = self._slots.limit
        self._session_observer = session_observer
        self._on_first_audio = on_first_audio
        self._on_input_delay = on_input_delay
        self.cameras = CallCameras(camera, engine.vision, on_camera_frame, on_camera_refused)
        """How every call's camera is taken, wherever its media run."""
        self._in_process = InProcessMediaHost(hosts=self.ice_host_addresses, cameras=self.cameras)
        self._workers: MediaHost | None = None
        self._lifecycle: CallLifecycle[Call] = CallLifecycle(connect_timeout_s)

    def place_media_on(self, workers: MediaHost) -> None:
        """Run the media of every call on ``workers`` from now on (their cameras too); before :meth:`start`."""
        self._workers = workers

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
        """Calls not yet torn down (their peer connection is open), those being answered included."""
        return len(self._lifecycle.calls)

    @property
    def open_peers(self) -> int:
        """Peer connections of this endpoint's calls that are not closed (a call being answered included); zero when
        no call is live, else one leaked."""
        return sum(host.open_peers for host in self._hosts())

    @property
    def outbound_events(self) -> int:
        """Server events waiting to be sent, over all calls (bounded per call by the runner's outbound queue)."""
        return sum(len(call.runner.outbound) for call in self._lifecycle.calls.values())

    def calls(self) -> tuple[Call, ...]:
        return tuple(self._lifecycle.calls.values())

    async def start(self) -> None:
        """Start the media workers, if the calls' media run on workers."""
        for host in self._hosts():
            await host.start()

    async def create_call(
        self, offer_sdp: str, *, dialect: Dialect = Dialect.GA, session_overrides: dict | None = None
    ) -> str:
        """Answer the browser's SDP offer and start its session; returns the SDP answer.

        ``session_overrides`` (the ``session`` object of the request) is applied as the session's first
        ``session.update``. Raises :class:`~realtime.errors.RealtimeError` for an invalid offer or overrides
        (``param`` ``sdp`` / ``session``), ``LimitExceeded`` (``session_limit_reached``) when no session slot is
        free, :class:`~.errors.WebRTCUnavailable` after :meth:`close` or when the call's media cannot be placed."""
        if self._lifecycle.closed:
            raise WebRTCUnavailable("the server is shutting down")
        first_message = _overrides_message(session_overrides)
        slot = self._slots.try_acquire()  # held while the answer is prepared, then by the call
        if slot is None:
            raise self._slots.refusal()
        call: Call | None = None
        try:
            call = await self._new_call(self._media_host(), dialect, slot)
            if first_message is not None:
                call.transport.push(first_message)
            answer = await call.media.answer(offer_sdp)
            if self._lifecycle.closed:  # close() ran meanwhile and will not see this call
                raise WebRTCUnavailable("the server is shutting down")
        except BaseException:
            if call is not None:
                await self._lifecycle.teardown(call)
            else:
                slot.release()
            raise
        call.observer = self._session_observer() if self._session_observer is not None else None
        self._lifecycle.serve(call)
        logger.info("webrtc %s: answered", call.id)
        return answer

    async def close(self) -> None:
        """Refuse new calls, end every call and wait until all are torn down; then stop the media workers."""
        await self._lifecycle.close()
        for host in self._hosts():
            await host.close()

    def _hosts(self) -> tuple[MediaHost, ...]:
        return (self._in_process,) if self._workers is None else (self._in_process, self._workers)

    def _media_host(self) -> MediaHost:
        """Where a new call's media run: the workers, once placed there (:meth:`place_media_on`)."""
        return self._workers if self._workers is not None else self._in_process

    async def _new_call(self, host: MediaHost, dialect: Dialect, slot: SessionSlot) -> Call:
        """A call on ``host``, registered (teardown forgets it); on failure nothing is held but the slot."""
        make_runner = await self.session_factory(dialect, slot)
        gate = self._message_gate() if self._message_gate is not None else None
        call = await host.new_call(dialect, make_runner, gate=gate, slot=slot, on_input_delay=self._on_input_delay)
        self._lifecycle.add(call)
        if isinstance(slot, EngineSlot):
            slot.on_engine_failure(functools.partial(end_on_engine_failure, call.runner, slot.index))
        return call

    async def session_factory(self, dialect: Dialect, slot: SessionSlot) -> RunnerFactory:
        """What makes the session runner of a call in ``dialect`` holding ``slot``: its settings (audio transport
        ``MEDIA``), its own turn detection and its engine (the slot's, when the server places sessions on engines)."""
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
