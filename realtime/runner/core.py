"""The :class:`SessionRunner`: its state, its tasks and their lifecycle, the loops that read, write and execute, and
the dispatch of the session's actions (see :mod:`realtime.runner`)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Callable

import numpy as np

from pipeline.api import ConversationHandle, EngineHandle
from pipeline.errors import PipelineError
from realtime.errors import RealtimeError, to_error_payload
from realtime.ids import IdGenerator, RandomIds
from realtime.media.audio import InputDecoder, OutputEncoder
from realtime.media.images import decode_item
from realtime.observe.error_log import log_error_event
from realtime.observe.first_audio import FirstAudioTrace, FirstAudioTracer
from realtime.protocol.client import InputAudioAppend, ItemCreate, parse_client_event
from realtime.protocol.names import ServerEvent, server_event_name
from realtime.protocol.server import ServerEvents
from realtime.runner.contracts import (
    DISCONNECT_REASON,
    DecoderFactory,
    MediaSink,
    OpenMessage,
    SessionEnd,
    Transport,
    TransportClosed,
    TurnDetectorFactory,
    session_task_name,
)
from realtime.runner.engine_commands import EngineCommands, _expected, _InputStream, _Running
from realtime.runner.outbound import ClientNotReading, OutboundQueue
from realtime.runner.transcripts import Transcriptions
from realtime.runner.turns import TurnDetection, _Detection
from realtime.session import (
    Action,
    AudioTransport,
    CancelResponse,
    ClearOutputAudio,
    CommitAudio,
    ConfigureTurnDetection,
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
    StartResponse,
)
from realtime.transcription import Transcriber

logger = logging.getLogger("realtime.runner")
"""The runner's one logger (its name is what log readers match), shared by its modules."""


class SessionRunner(EngineCommands, TurnDetection, Transcriptions):
    """Runs one session between ``transport`` and ``engine`` until the client leaves.

    ``turn_detector_factory`` makes a detector for ``server_vad`` settings (the server passes
    ``lambda p: TurnDetector(p, vad)`` with one ``SileroVad`` per session); ``media`` is required
    when ``settings.audio_transport`` is ``MEDIA`` (WebRTC). ``on_end(end)`` is called once, when
    the session stops, just before the transport is closed; :attr:`end` holds the same value.
    ``on_first_audio`` gets each response's :class:`~realtime.observe.first_audio.FirstAudioTrace`."""

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
        """The spoken message being recorded, for a camera (``realtime.media.video.CameraFeed``); None when none
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
