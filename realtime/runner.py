"""The asyncio driver of one :class:`realtime.session.Session` over any message transport.

A :class:`SessionRunner` owns four kinds of tasks, all tracked and all cancelled when it stops:

- the *reader* feeds client messages to the session and executes the resulting actions;
- the *writer* sends server events from the :class:`OutboundQueue` to the transport, in order;
- the *worker* executes engine commands one at a time, in the order the session emitted them
  (the engine seam requires it), except cancellation, which is executed at once; an audio commit is
  sent and not waited for, so the response that follows it reaches the engine with it;
- one *commit* task per audio commit awaits its outcome and reports a failure as an ``error`` event;
- one *pump* per response feeds the engine's output stream back into the session;
- with input transcription on, one *transcriber* runs the session's transcription jobs
  (:mod:`realtime.transcription`) over copies of the committed messages' 16 kHz audio, each once no reply
  is waiting for its first output (audio, or text for a text-only reply) and none is about to start.

The runner stops when the client goes away (the transport's message iterator ends, or ``send``
raises :class:`TransportClosed`), when the client stops reading (:class:`ClientNotReading`: its
outbound queue reached the hard limit, or the transport gave up on a stalled send), when one of its
tasks fails, or when it is cancelled. Stopping cancels the running response, cancels every task,
closes the engine conversation, reports why it stopped (:class:`SessionEnd`, to ``on_end``: the
WebSocket endpoint picks its close code from it) and closes the transport. Turn detection and input
decoding run inline in the reader (both are cheap per chunk). The WebSocket endpoint and the WebRTC
data channel both use this class.

Every task a session owns is named ``omni-session:<session id>:<role>``
(:func:`session_task_name`), so :func:`live_session_tasks` finds a task that outlived its session.
"""

from __future__ import annotations

import asyncio
import dataclasses
import enum
import logging
import time
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from pipeline.api import AudioInputHandle, ConversationHandle, EngineHandle, ResponseHandle
from pipeline.errors import EngineFailure, PipelineError
from pipeline.outputs import AudioChunk, ResponseDone, ResponseEvent, ResponseStatus, TextDelta, Usage
from realtime.audio import AudioFormat, InputDecoder, OutputEncoder
from realtime.error_log import log_error_event
from realtime.errors import RealtimeError, to_error_payload
from realtime.first_audio import FirstAudioTrace, FirstAudioTracer
from realtime.ids import IdGenerator, RandomIds
from realtime.images import decode_item
from realtime.protocol.client import InputAudioAppend, ItemCreate, parse_client_event
from realtime.protocol.names import ServerEvent, server_event_name
from realtime.protocol.server import ServerEvents
from realtime.session import (
    Action,
    AddAudio,
    AddContent,
    AddText,
    AppendAudio,
    AudioTransport,
    CancelResponse,
    ClearAudio,
    ClearOutputAudio,
    CommitAudio,
    ConfigureTurnDetection,
    DeleteItem,
    DetectSpeech,
    DropQueuedAudio,
    EncoderFactory,
    EngineCommand,
    PlayAudio,
    Preemption,
    PreemptiveReply,
    Send,
    Session,
    SessionSettings,
    SetContextPolicy,
    SetInstructions,
    StartResponse,
    Transcribe,
    TruncateItem,
    TurnEvent,
)
from realtime.tool_calls import AddFunctionCall, AddFunctionOutput, SetTools
from realtime.transcription import Transcriber, TranscriptionJob, TranscriptionReport, TranscriptionUnavailable
from realtime.turn import ServerVadParams, SpeechResumed, SpeechStarted

logger = logging.getLogger(__name__)

DISCONNECT_REASON = "client_disconnected"
"""Cancel reason given to the engine for a response whose client went away."""

SESSION_TASK_PREFIX = "omni-session:"
"""Name prefix of every asyncio task a session owns (runner loops, response pumps, the
transports' per-session tasks, the server's supervisor)."""


def session_task_name(session_id: str, role: str) -> str:
    """The name of a task of session ``session_id`` doing ``role`` (``reader``, ``pump``…)."""
    return f"{SESSION_TASK_PREFIX}{session_id}:{role}"


def live_session_tasks() -> int:
    """Session tasks (named by :func:`session_task_name`) not yet done in the running event loop.
    Zero once every session has ended: anything else is a leaked task."""
    return sum(1 for task in asyncio.all_tasks() if task.get_name().startswith(SESSION_TASK_PREFIX))


class SessionEnd(enum.Enum):
    """Why a session stopped (the WebSocket endpoint maps each to a close code)."""

    CLIENT_LEFT = "client_left"
    """The client closed the connection, or it broke."""
    CLIENT_NOT_READING = "client_not_reading"
    """The client stopped reading its events (:class:`ClientNotReading`)."""
    FAILED = "failed"
    """A task of the session failed unexpectedly (a bug), or the engine refused the conversation."""
    CANCELLED = "cancelled"
    """:meth:`SessionRunner.run` was cancelled: the server is shutting down."""
    ENGINE_FAILED = "engine_failed"
    """The engine serving the session failed (:meth:`SessionRunner.end_for`): its conversation is gone."""


# --- what the runner is plugged into ------------------------------------------------------------


class TransportClosed(Exception):
    """Raised by :meth:`Transport.send` when the client is gone."""


class Transport(Protocol):
    """One client's message channel (a WebSocket, a WebRTC data channel…).

    Iterating it yields the client's text messages and ends when the client disconnects; a transport
    that makes client events itself (a WebRTC call's microphone audio) may yield them already parsed,
    as :class:`~realtime.protocol.client.InputAudioAppend` events, which skip the JSON round trip.
    ``send`` delivers one server event (JSON-encoding it) or raises :class:`TransportClosed`;
    ``close`` ends the connection and may be called more than once."""

    def __aiter__(self) -> AsyncIterator[str | bytes | InputAudioAppend]: ...

    async def send(self, event: dict) -> None: ...

    async def close(self) -> None: ...


class AudioDecoder(Protocol):
    """Wire bytes → float32 16 kHz, streaming (``realtime.audio.InputDecoder`` is one)."""

    def decode(self, data: bytes) -> np.ndarray: ...

    def flush(self) -> np.ndarray: ...


DecoderFactory = Callable[[AudioFormat], AudioDecoder]


class TurnDetector(Protocol):
    """Speech start/stop over 16 kHz audio (``realtime.turn.TurnDetector`` is one). Times are ms
    since the first sample it was fed; the runner shifts them onto the session's audio clock."""

    def feed(self, pcm16k: np.ndarray) -> list[TurnEvent]: ...

    async def afeed(self, pcm16k: np.ndarray) -> list[TurnEvent]:
        """``feed``, possibly waiting for a VAD shared with other sessions (``realtime.vad_batch``)."""
        ...

    def reset(self) -> None: ...


TurnDetectorFactory = Callable[[ServerVadParams], TurnDetector]


class MediaSink(Protocol):
    """WebRTC output track: plays reply audio (float32, 24 kHz) paced in real time."""

    def play(self, response_id: str, pcm: np.ndarray) -> None: ...

    def clear(self, response_id: str) -> None:
        """Drop the unplayed audio of ``response_id``."""
        ...


# --- outbound queue -----------------------------------------------------------------------------


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


# --- the runner ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class OpenMessage:
    """The spoken message being recorded: its engine handle and when (``time.monotonic`` seconds) its first audio
    sample reached the server."""

    item_id: str
    handle: AudioInputHandle
    started_at: float


@dataclass
class _InputStream:
    """An input audio message being streamed to the engine, with its own resampler. ``pcm`` keeps what went to the
    engine (16 kHz), for a transcription of the message (at most the session's ``max_buffer_ms``); None: not kept
    (input transcription was off when the message began)."""

    handle: AudioInputHandle
    decoder: AudioDecoder
    format: AudioFormat
    pcm: list[np.ndarray] | None = None
    message: OpenMessage | None = None
    """What a camera sees of it (WebRTC): the handle and when its first sample reached the server."""

    def send(self, pcm: np.ndarray) -> None:
        if self.pcm is not None:
            self.pcm.append(pcm)
        self.handle.append(pcm)


@dataclass
class _Running:
    """A started response; ``cancelled`` wakes its pump when it waits for a lagging client."""

    handle: ResponseHandle
    cancelled: asyncio.Event = dataclasses.field(default_factory=asyncio.Event)

    def cancel(self, reason: str) -> None:
        self.handle.cancel(reason)
        self.cancelled.set()


@dataclass
class _Detection:
    """The running turn detector; its clock starts at ``offset_ms`` of the session's clock."""

    detector: TurnDetector
    offset_ms: int
    decoder: AudioDecoder | None = None
    decoder_format: AudioFormat | None = None


def _shift(event: TurnEvent, offset_ms: int) -> TurnEvent:
    if isinstance(event, SpeechStarted):
        return dataclasses.replace(
            event, audio_start_ms=event.audio_start_ms + offset_ms, speech_start_ms=event.speech_start_ms + offset_ms
        )
    if isinstance(event, SpeechResumed):
        return dataclasses.replace(event, speech_start_ms=event.speech_start_ms + offset_ms)
    return dataclasses.replace(
        event, audio_end_ms=event.audio_end_ms + offset_ms, speech_end_ms=event.speech_end_ms + offset_ms
    )


class SessionRunner:
    """Runs one session between ``transport`` and ``engine`` until the client leaves.

    ``turn_detector_factory`` makes a detector for ``server_vad`` settings (the server passes
    ``lambda p: TurnDetector(p, vad)`` with one ``SileroVad`` per session); ``media`` is required
    when ``settings.audio_transport`` is ``MEDIA`` (WebRTC). ``on_end(end)`` is called once, when
    the session stops, just before the transport is closed; :attr:`end` holds the same value.
    ``on_first_audio`` gets each response's :class:`~realtime.first_audio.FirstAudioTrace`."""

    def __init__(
        self,
        transport: Transport,
        engine: EngineHandle,
        *,
        turn_detector_factory: TurnDetectorFactory,
        settings: SessionSettings | None = None,
        decoder_factory: DecoderFactory = InputDecoder,
        encoder_factory: EncoderFactory = OutputEncoder,
        media: MediaSink | None = None,
        outbound: OutboundQueue | None = None,
        ids: IdGenerator | None = None,
        on_end: Callable[[SessionEnd], None] | None = None,
        on_first_audio: Callable[[FirstAudioTrace], None] | None = None,
    ) -> None:
        settings = settings or SessionSettings.for_engine(engine)
        if settings.audio_transport is AudioTransport.MEDIA and media is None:
            raise ValueError("a MEDIA (WebRTC) session needs a media sink for its audio")
        self.session = Session(settings, ids=ids, encoder_factory=encoder_factory)
        self.outbound = outbound if outbound is not None else OutboundQueue()  # an empty queue is falsy
        self._transport = transport
        self._engine = engine
        self._turn_detector_factory = turn_detector_factory
        self._decoder_factory = decoder_factory
        self._media = media
        self._audio_delta_type = server_event_name(ServerEvent.AUDIO_DELTA, settings.dialect)
        self._conversation: ConversationHandle | None = None
        self._commands: asyncio.Queue[EngineCommand] = asyncio.Queue()
        self._inputs: dict[str, _InputStream] = {}
        self._detection: _Detection | None = None
        self._responses: dict[str, _Running] = {}
        self._early_cancels: dict[str, CancelResponse] = {}  # cancelled before StartResponse ran
        self._pump_task: asyncio.Task | None = None  # the latest response's pump
        self._awaiting_output: dict[str, bool] = {}  # requested responses before their first output -> audio?
        self._committed_audio: tuple[str, list[np.ndarray] | None] | None = None  # the last commit's kept audio
        self._transcriber: Transcriber | None = None  # started by the first Transcribe
        self._loops: set[asyncio.Task] = set()  # reader, writer, worker: the session ends with any
        self._tasks: set[asyncio.Task] = set()  # every task this runner started and has not seen end
        self._stopped = asyncio.Event()
        self._failure: BaseException | None = None
        self._final_error: Exception | None = None  # sent as the last event before the close (end_for)
        self._on_end = on_end
        self.end: SessionEnd | None = None
        """Why the session stopped (the first reason wins); ``None`` while it runs."""
        self._on_first_audio = on_first_audio
        self._traces = FirstAudioTracer(time.monotonic, self._first_audio)
        self._heard = (time.monotonic(), 0.0)  # when the session's audio clock last advanced, and to where (ms)
        self._preemptive = {
            Preemption.STARTED: self._traces.preempted,
            Preemption.SHOWN: self._traces.shown,
            Preemption.WITHDRAWN: self._traces.withdrawn,
        }

    # --- lifecycle ---

    async def run(self) -> None:
        """Serve the session until the client leaves. Re-raises an unexpected failure of any of
        its tasks after cleaning up; cancelling ``run`` cleans up too. If the engine refuses the
        conversation, its error is raised after the transport is closed."""
        try:
            self._conversation = self._engine.conversation(instructions=self.session.config.instructions)
            loops = {"reader": self._read_loop, "writer": self._write_loop, "worker": self._command_loop}
            for role, loop in loops.items():
                self._loops.add(self._spawn(loop(), role))
            self._dispatch(self.session.start())
            await self._stopped.wait()
        except asyncio.CancelledError:
            self._ended(SessionEnd.CANCELLED)
            raise
        except BaseException:  # the engine refused the conversation: re-raised after the cleanup
            self._ended(SessionEnd.FAILED)
            raise
        finally:
            await self._shutdown()
        if self._failure is not None:
            raise self._failure

    def end_for(self, end: SessionEnd, error: Exception) -> None:
        """End the session from outside (its engine failed): the client gets ``error`` as the last ``error`` event,
        then the transport closes as for ``end``. No I/O here (call it from the event loop's thread); a session
        already ending keeps its first reason and sends nothing more."""
        if self.end is not None:
            return
        self._ended(end)
        self._final_error = error
        self._stopped.set()

    def playback_finished(self, response_id: str) -> None:
        """WebRTC: the media sink played the last audio of ``response_id``."""
        self._dispatch(self.session.playback_stopped(response_id))

    def _spawn(self, coro, role: str) -> asyncio.Task:
        task = asyncio.create_task(coro, name=session_task_name(self.session.session_id, role))
        self._tasks.add(task)
        task.add_done_callback(self._task_done)
        return task

    def _task_done(self, task: asyncio.Task) -> None:
        self._tasks.discard(task)
        if task.cancelled():
            return
        exc = task.exception()
        if exc is None:
            if task in self._loops:  # the reader ended: the client left
                self._ended(SessionEnd.CLIENT_LEFT)
                self._stopped.set()
            return
        if isinstance(exc, TransportClosed):
            logger.info("session %s: client gone", self.session.session_id)
            self._ended(SessionEnd.CLIENT_LEFT)
        elif isinstance(exc, ClientNotReading):
            logger.warning("session %s: %s", self.session.session_id, exc)
            self._ended(SessionEnd.CLIENT_NOT_READING)
        else:
            if self._failure is None:
                self._failure = exc
            self._ended(SessionEnd.FAILED)
        self._stopped.set()

    def _ended(self, end: SessionEnd) -> None:
        if self.end is None:
            self.end = end

    async def _shutdown(self) -> None:
        for running in self._responses.values():
            running.cancel(DISCONNECT_REASON)
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if self._conversation is not None:
            try:
                await self._conversation.close()
            except Exception:  # the client is gone either way; the engine logs its own state
                logger.exception("session %s: closing the conversation failed", self.session.session_id)
        if self._final_error is not None:
            await self._send_final_error(self._final_error)
        if self._on_end is not None:
            self._on_end(self.end or SessionEnd.CLIENT_LEFT)
        try:
            await self._transport.close()
        except Exception:
            logger.exception("session %s: closing the transport failed", self.session.session_id)

    async def _send_final_error(self, error: Exception) -> None:
        payload = to_error_payload(error)
        log_error_event(payload, session_id=self.session.session_id, answers=None)
        event = ServerEvents(self.session.dialect, RandomIds()).error(payload)
        try:
            await self._transport.send(event)
        except (TransportClosed, ClientNotReading) as exc:
            logger.info("session %s: the closing error was not delivered: %s", self.session.session_id, exc)

    # --- loops ---

    async def _read_loop(self) -> None:
        async for message in self._transport:
            await self._dispatch_received(await self._receive(message))
            clock_ms = self.session.audio_clock_ms
            if clock_ms != self._heard[1]:
                self._heard = (time.monotonic(), clock_ms)

    async def _receive(self, message: str | bytes | InputAudioAppend) -> list[Action]:
        """The session's actions for one client message. A message with pictures has them decoded first, in a
        worker thread (the reader waits, so the client's events keep their order); a picture that cannot be taken
        refuses the whole message with an ``error`` event and changes nothing."""
        if isinstance(message, InputAudioAppend):
            return self.session.handle(message)
        try:
            event = parse_client_event(message)
        except RealtimeError as exc:
            return self.session.refuse(exc)
        if isinstance(event, ItemCreate) and event.item.images:
            try:
                event = await decode_item(event, self._engine.vision, self.session.settings.image_limits)
            except (RealtimeError, PipelineError) as exc:
                return self.session.refuse(exc, event)
        return self.session.handle(event)

    def open_message(self) -> OpenMessage | None:
        """The spoken message being recorded, for a camera (``realtime.video.CameraFeed``); None when none
        is open."""
        stream = next(reversed(self._inputs.values()), None)
        return stream.message if stream is not None else None

    def _heard_at(self, clock_ms: float) -> float:
        """When (``time.monotonic``) audio at ``clock_ms`` of the session's audio clock reached the server,
        reckoned back from the latest append (audio arrives in real time)."""
        at, latest_ms = self._heard
        return at - (latest_ms - clock_ms) / 1000.0

    async def _write_loop(self) -> None:
        while True:
            event = await self.outbound.get()
            await self._transport.send(event)
            if event.get("type") == self._audio_delta_type:
                self._traces.sent_audio(event["response_id"])

    async def _command_loop(self) -> None:
        while True:
            command = await self._commands.get()
            try:
                await self._execute(command)
            except Exception as exc:  # reported to the client; the session carries on
                if not _expected(exc):
                    logger.exception("session %s: %s failed", self.session.session_id, type(command).__name__)
                if isinstance(command, StartResponse):
                    self._awaiting_output.pop(command.response_id, None)  # no output will come
                self._dispatch(self.session.command_failed(command, exc))

    async def _pump(self, response_id: str, running: _Running) -> None:
        """Feed one response's engine output to the session, pausing while the client lags
        (but not once cancelled: the session drops that output, so the engine is drained at once)."""
        stream = aiter(running.handle)
        while True:
            await self._room_unless_cancelled(running.cancelled)
            event = await _next_event(stream)
            if isinstance(event, AudioChunk):
                self._traces.received_audio(response_id)
            self._dispatch(self.session.response_event(response_id, event))
            if self._first_output(response_id, event):
                self._awaiting_output.pop(response_id, None)
                if self._transcriber is not None:
                    self._transcriber.wake()
            if isinstance(event, ResponseDone):
                self._traces.done(response_id, event.timings)
                self._responses.pop(response_id, None)
                return

    def _first_output(self, response_id: str, event: ResponseEvent) -> bool:
        """Whether ``event`` ends the wait for the response's first output: its first audio (its first text for a
        text-only response), or its end."""
        audio = self._awaiting_output.get(response_id)
        if audio is None:
            return False
        return isinstance(event, ResponseDone | (AudioChunk if audio else TextDelta))

    async def _room_unless_cancelled(self, cancelled: asyncio.Event) -> None:
        if cancelled.is_set():
            return
        waiters = {asyncio.ensure_future(self.outbound.wait_for_room()), asyncio.ensure_future(cancelled.wait())}
        try:
            await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for waiter in waiters:
                waiter.cancel()

    # --- actions ---

    def _dispatch(self, actions: list[Action]) -> None:
        """Execute actions in order; actions they cause (turn events) run after them."""
        pending = deque(actions)
        while pending:
            action = pending.popleft()
            if isinstance(action, Send):
                self.outbound.put(action.event)
            elif isinstance(action, DetectSpeech):
                raise TypeError("speech detection comes with client messages: see _dispatch_received")
            elif isinstance(action, ConfigureTurnDetection):
                self._configure_detection(action)
            elif isinstance(action, CancelResponse):
                self._cancel(action)  # jumps the command queue: a cancel must not wait for a commit
            elif isinstance(action, DropQueuedAudio):
                rid, kind = action.response_id, self._audio_delta_type
                self.outbound.drop(
                    lambda e, kind=kind, rid=rid: not (e.get("type") == kind and e.get("response_id") == rid)
                )
                self._traces.dropped(rid)
            elif isinstance(action, PlayAudio):
                self._media_sink().play(action.response_id, action.pcm)
                self._traces.sent_audio(action.response_id)
            elif isinstance(action, ClearOutputAudio):
                self._media_sink().clear(action.response_id)
            elif isinstance(action, PreemptiveReply):
                self._preemptive[action.outcome](action.response_id)
            else:
                if isinstance(action, CommitAudio):
                    self._traces.turn_ended()
                elif isinstance(action, StartResponse):
                    self._awaiting_output[action.response_id] = "audio" in action.modalities
                self._commands.put_nowait(action)
        if self._transcriber is not None:
            self._transcriber.wake()  # the session's state changed: a waiting job may start

    def _media_sink(self) -> MediaSink:
        assert self._media is not None, "checked in __init__ for MEDIA sessions"
        return self._media

    def _configure_detection(self, action: ConfigureTurnDetection) -> None:
        self._detection = None
        if action.params is not None:
            detector = self._turn_detector_factory(action.params)
            detector.reset()  # a fresh stream: forget what a shared VAD model saw before
            self._detection = _Detection(detector, action.start_ms)

    async def _detect(self, action: DetectSpeech) -> list[Action]:
        """The turn events of one chunk of client audio, as session actions. The VAD runs on the event loop, in
        calls shared with other sessions when the detector's VAD is batched (``realtime.vad_batch``)."""
        detection = self._detection
        if detection is None:
            return []  # detection was turned off after this audio was accepted
        if detection.decoder is None or detection.decoder_format is not action.format:
            detection.decoder = self._decoder_factory(action.format)
            detection.decoder_format = action.format
        events = await detection.detector.afeed(detection.decoder.decode(action.audio))
        return self._turn_actions(detection, events)

    def _turn_actions(self, detection: _Detection, events: list[TurnEvent]) -> list[Action]:
        actions: list[Action] = []
        for event in events:
            actions.extend(self.session.turn_event(_shift(event, detection.offset_ms)))
        return actions

    async def _dispatch_received(self, actions: list[Action]) -> None:
        """:meth:`_dispatch` for a client message's actions, speech detection included (:meth:`_detect`). The VAD
        is ~1 ms of CPU a frame per session, ~75 % of the loop's time at 64 sessions when run frame by frame, hence
        the batched VAD. The reader awaits each chunk's turn events before the next message, so
        a session's actions keep their order while other sessions' readers run."""
        for action in actions:
            if isinstance(action, DetectSpeech):
                self._dispatch(await self._detect(action))
            else:
                self._dispatch([action])

    def _cancel(self, action: CancelResponse) -> None:
        running = self._responses.get(action.response_id)
        if running is None:
            self._early_cancels[action.response_id] = action
        else:
            running.cancel(action.reason.value)

    # --- engine commands ---

    async def _execute(self, command: EngineCommand) -> None:
        conversation = self._conversation
        assert conversation is not None, "run() creates the conversation before any command"
        if isinstance(command, SetInstructions):
            await conversation.set_instructions(command.instructions)
        elif isinstance(command, SetContextPolicy):
            await conversation.set_context_policy(command.policy)
        elif isinstance(command, AddText):
            if command.previous_item_id is not None:  # an insertion: after the cancelled response ends
                await self._wait_idle()
            await conversation.add_text(
                command.item_id, command.text, command.role.value, previous_item_id=command.previous_item_id
            )
        elif isinstance(command, AddContent):
            if command.previous_item_id is not None:
                await self._wait_idle()
            await conversation.add_content(command.item_id, command.parts, previous_item_id=command.previous_item_id)
        elif isinstance(command, SetTools):
            await self._wait_idle()  # the tools are part of the prompt: they change between responses
            await conversation.set_tools(command.tools)
        elif isinstance(command, AddFunctionCall):
            await conversation.add_function_call(command.item_id, command.name, command.arguments)
        elif isinstance(command, AddFunctionOutput):
            await conversation.add_function_output(command.item_id, command.output)
        elif isinstance(command, AddAudio):
            decoder = self._decoder_factory(command.format)
            pcm = np.concatenate([decoder.decode(command.audio), decoder.flush()])
            if command.previous_item_id is not None:
                await self._wait_idle()
            await conversation.add_audio(command.item_id, pcm, previous_item_id=command.previous_item_id)
        elif isinstance(command, AppendAudio):
            self._append(conversation, command)
        elif isinstance(command, CommitAudio):
            stream = self._inputs.pop(command.item_id)
            stream.send(stream.decoder.flush())
            self._committed_audio = (command.item_id, stream.pcm)
            # Sent now; not awaited here, so the response the turn asks for (next in the queue) reaches the
            # engine with the commit instead of one engine step (or round trip to its process) later.
            committed = stream.handle.commit()
            self._spawn(self._await_commit(command, committed), f"commit {command.item_id}")
        elif isinstance(command, ClearAudio):
            await self._inputs.pop(command.item_id).handle.discard()
        elif isinstance(command, StartResponse):
            self._start_response(conversation, command)
        elif isinstance(command, DeleteItem):
            if self._transcriber is not None:
                self._transcriber.drop(command.item_id)
            await self._wait_idle()
            await conversation.delete_item(command.item_id)
        elif isinstance(command, TruncateItem):
            await self._wait_idle()
            await conversation.truncate_item(command.item_id, command.audio_end_ms)
        elif isinstance(command, Transcribe):
            self._transcribe(command)
        else:
            raise TypeError(f"not an engine command: {command!r}")

    async def _await_commit(self, command: CommitAudio, committed: Awaitable[None]) -> None:
        """The outcome of a commit already sent: a failure is reported as the command's (an ``error``
        event), as if the worker had waited for it."""
        try:
            await committed
        except Exception as exc:
            if not _expected(exc):
                logger.exception("session %s: CommitAudio failed", self.session.session_id)
            self._dispatch(self.session.command_failed(command, exc))
        else:
            self._traces.committed()

    def _append(self, conversation: ConversationHandle, command: AppendAudio) -> None:
        stream = self._inputs.get(command.item_id)
        if stream is None:
            handle = conversation.open_audio(command.item_id)
            keep = [] if self.session.config.transcription is not None else None
            stream = _InputStream(handle, self._decoder_factory(command.format), command.format, keep)
            stream.message = OpenMessage(command.item_id, handle, self._heard_at(command.start_ms))
            self._inputs[command.item_id] = stream
        elif stream.format is not command.format:  # the client switched formats mid-message
            stream.send(stream.decoder.flush())
            stream.decoder, stream.format = self._decoder_factory(command.format), command.format
        stream.send(stream.decoder.decode(command.audio))

    def _start_response(self, conversation: ConversationHandle, command: StartResponse) -> None:
        early = self._early_cancels.pop(command.response_id, None)
        handle = conversation.respond(
            item_id=command.item_id,
            modalities=command.modalities,
            voice=command.voice,
            max_output_tokens=command.max_output_tokens,
            tool_choice=command.tool_choice,
            call_item_ids=command.call_item_ids,
        )
        running = _Running(handle)
        self._responses[command.response_id] = running
        self._traces.requested(command.response_id)
        if early is not None:
            running.cancel(early.reason.value)
        self._pump_task = self._spawn(self._pump(command.response_id, running), f"pump {command.response_id}")

    def _transcribe(self, command: Transcribe) -> None:
        """Queue the transcription of the message just committed (its Transcribe follows its CommitAudio, before
        any other commit). Its audio was kept if transcription was on when the message began; else it fails."""
        committed, self._committed_audio = self._committed_audio, None
        if committed is None or committed[0] != command.item_id:
            raise RuntimeError(f"Transcribe {command.item_id} does not follow the commit of its audio")
        kept = committed[1]
        pcm = np.concatenate(kept) if kept else np.zeros(0, np.float32)
        job = TranscriptionJob(command.item_id, command.content_index, pcm, command.language, command.prompt)
        if kept is None:
            unavailable = "input transcription was turned on while this message was being spoken"
            self._failed(job, TranscriptionUnavailable(unavailable))
            return
        if self._transcriber is None:
            report = TranscriptionReport(self._transcription_delta, self._transcription_completed, self._failed)
            self._transcriber = Transcriber(self._engine, report, self._transcription_may_start)
            self._spawn(self._transcriber.run(), "transcriber")
        self._transcriber.submit(job)

    def _transcription_may_start(self) -> bool:
        """No reply waits for its first output, and none is due to start."""
        return not self._awaiting_output and not self.session.reply_pending

    def _transcription_delta(self, job: TranscriptionJob, text: str) -> None:
        self._dispatch(self.session.transcription_delta(job.item_id, job.content_index, text))

    def _transcription_completed(self, job: TranscriptionJob, transcript: str, usage: Usage) -> None:
        self._dispatch(self.session.transcription_completed(job.item_id, job.content_index, transcript, usage))

    def _failed(self, job: TranscriptionJob, exc: Exception) -> None:
        self._dispatch(self.session.transcription_failed(job.item_id, job.content_index, exc))

    def _first_audio(self, trace: FirstAudioTrace) -> None:
        segments = ", ".join(f"{name} {ms:.1f}" for name, ms in trace.segments().items())
        total = trace.total_ms()
        if total is not None:  # the server's own time to first audio: turn end (or request) to the first delta out
            segments += f", total {total:.1f}"
        kind = " (preemptive, withdrawn)" if trace.withdrawn else " (preemptive)" if trace.preemptive else ""
        logger.info(
            "session %s response %s%s first audio path (ms): %s",
            self.session.session_id,
            trace.response_id,
            kind,
            segments or "-",
        )
        if self._on_first_audio is not None:
            self._on_first_audio(trace)

    async def _wait_idle(self) -> None:
        """Wait for the running response to end (cancelled by the session, or, for a truncation or new tools, let
        run to its end)."""
        task = self._pump_task
        if task is not None and not task.done():
            await asyncio.wait({task})


async def _next_event(stream: AsyncIterator[ResponseEvent]) -> ResponseEvent:
    """The next engine event; a broken stream becomes the failed ``ResponseDone`` it should have sent."""
    try:
        return await anext(stream)
    except StopAsyncIteration:
        error: Exception = EngineFailure("the response stream ended without ResponseDone")
    except Exception as exc:
        logger.exception("response stream raised")
        error = exc
    return ResponseDone(ResponseStatus.FAILED, Usage(), reason="error", error=error)


def _expected(exc: Exception) -> bool:
    """Errors with a wire code are the client's or the engine's documented failures, not bugs."""
    return isinstance(exc, (PipelineError, RealtimeError))
