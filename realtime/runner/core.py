"""The :class:`SessionRunner`: the composition of one session's parts, its tasks and their lifecycle, the loops that
read and write, and the dispatch of the session's actions to the parts (see :mod:`realtime.runner`)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Callable, Coroutine
from typing import Any

from pipeline.api import ConversationHandle, EngineHandle
from realtime.errors import to_error_payload
from realtime.ids import IdGenerator, RandomIds
from realtime.media.audio import DecoderFactory, InputDecoder, OutputEncoder
from realtime.observe.error_log import log_error_event
from realtime.observe.first_audio import FirstAudioTrace, FirstAudioTracer
from realtime.protocol.names import ServerEvent, server_event_name
from realtime.protocol.server import ServerEvents
from realtime.runner.contracts import (
    DISCONNECT_REASON,
    MediaSink,
    OpenMessage,
    SessionEnd,
    Transport,
    TransportClosed,
    session_task_name,
)
from realtime.runner.executor import CommandExecutor
from realtime.runner.inbound import ArrivalClock, receive
from realtime.runner.outbound import ClientNotReading, OutboundQueue
from realtime.runner.responses import ResponseDriver
from realtime.runner.transcripts import TranscriptionDriver
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
    PlayAudio,
    Preemption,
    PreemptiveReply,
    Send,
    Session,
    SessionSettings,
)
from realtime.turns.detection import SpeechDetection, SpeechDetectorFactory
from realtime.turns.server_vad import TurnEvent

logger = logging.getLogger("realtime.runner")
"""The runner's one logger (its name is what log readers match), shared by its modules."""


class SessionRunner:
    """Runs one session between ``transport`` and ``engine`` until the client leaves.

    ``turn_detector_factory`` makes a speech detector for ``server_vad`` settings (the server passes
    ``lambda p: TurnDetector(p, vad)`` with one ``SileroVad`` per session); ``media`` is required
    when ``settings.audio_transport`` is ``MEDIA`` (WebRTC). ``on_end(end)`` is called once, when
    the session stops, just before the transport is closed; :attr:`end` holds the same value.
    ``on_first_audio`` gets each response's :class:`~realtime.observe.first_audio.FirstAudioTrace`.

    Its parts, each owning its state: :attr:`responses` (the engine's responses and their pumps), :attr:`commands`
    (the engine commands, in order, and the input audio streams), :attr:`speech` (turn detection) and
    :attr:`transcription` (input transcription). The runner owns every task they start (through :meth:`_spawn`)."""

    def __init__(
        self,
        transport: Transport,
        engine: EngineHandle,
        *,
        turn_detector_factory: SpeechDetectorFactory,
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
        self._media = media
        self._audio_delta_type = server_event_name(ServerEvent.AUDIO_DELTA, settings.dialect)
        self._conversation: ConversationHandle | None = None  # made by run()
        self._tasks: set[asyncio.Task] = set()  # every task this runner or its parts started, not yet seen to end
        self._loops: set[asyncio.Task] = set()  # reader, writer, worker: the session ends with any
        self._stopped = asyncio.Event()
        self._failure: BaseException | None = None
        self._final_error: Exception | None = None  # sent as the last event before the close (end_for)
        self._on_end = on_end
        self.end: SessionEnd | None = None
        """Why the session stopped (the first reason wins); ``None`` while it runs."""
        self._on_first_audio = on_first_audio
        self._traces = FirstAudioTracer(time.monotonic, self._first_audio)
        self._arrivals = ArrivalClock()
        self._preemptive = {
            Preemption.STARTED: self._traces.preempted,
            Preemption.SHOWN: self._traces.shown,
            Preemption.WITHDRAWN: self._traces.withdrawn,
        }
        spawn, dispatch = self._spawn, self._dispatch
        self.responses = ResponseDriver(self.session, self.outbound, self._traces, spawn=spawn, dispatch=dispatch)
        self.transcription = TranscriptionDriver(
            engine, self.session, may_start=self._transcription_may_start, spawn=spawn, dispatch=dispatch
        )
        self.commands = CommandExecutor(
            self.session,
            self.responses,
            self.transcription,
            self._traces,
            decoder_factory=decoder_factory,
            heard_at=self._arrivals.heard_at,
            spawn=spawn,
            dispatch=dispatch,
        )
        self.speech = SpeechDetection(turn_detector_factory, decoder_factory, on_late=self._late_turn_events)

    async def run(self) -> None:
        """Serve the session until the client leaves. Re-raises an unexpected failure of any of
        its tasks after cleaning up; cancelling ``run`` cleans up too. If the engine refuses the
        conversation, its error is raised after the transport is closed."""
        try:
            conversation = self._engine.conversation(instructions=self.session.config.instructions)
            self._conversation = conversation
            loops = {
                "reader": self._read_loop(),
                "writer": self._write_loop(),
                "worker": self.commands.run(conversation),
            }
            for role, loop in loops.items():
                self._loops.add(self._spawn(loop, role))
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

    def _spawn(self, coro: Coroutine[Any, Any, None], role: str) -> asyncio.Task[None]:
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
        await self.speech.aclose()  # the turn model's answer must not reach a session that is ending
        self.responses.cancel_all(DISCONNECT_REASON)
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
        if event is None:  # no dialect lacks ``error``; this keeps the type honest
            return
        try:
            await self._transport.send(event)
        except (TransportClosed, ClientNotReading) as exc:
            logger.info("session %s: the closing error was not delivered: %s", self.session.session_id, exc)

    async def _read_loop(self) -> None:
        async for message in self._transport:
            await self.commands.wait_for_room()
            await self._dispatch_received(await receive(self.session, self._engine, message))
            self._arrivals.advanced(self.session.audio_clock_ms)

    def open_message(self) -> OpenMessage | None:
        """The spoken message being recorded, for a camera (``realtime.media.message_frames.MessageFrames``); None
        when none is open."""
        return self.commands.open_message()

    async def _write_loop(self) -> None:
        while True:
            event = await self.outbound.get()
            await self._transport.send(event)
            if event.get("type") == self._audio_delta_type:
                self._traces.sent_audio(event["response_id"])

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
                self.speech.configure(action.params, action.start_ms)
            elif isinstance(action, CancelResponse):
                self.responses.cancel(action)  # jumps the command queue: a cancel must not wait for a commit
            elif isinstance(action, DropQueuedAudio):
                self.outbound.drop(self._not_audio_of(action.response_id))
                self._traces.dropped(action.response_id)
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
                self.commands.submit(action)
        self.transcription.wake()  # the session's state changed: a waiting job may start

    async def _dispatch_received(self, actions: list[Action]) -> None:
        """:meth:`_dispatch` for a client message's actions, speech detection included: the turn events of each chunk
        go to the session, and their actions are dispatched together. The reader awaits each chunk's turn events before
        the next message, so a session's actions keep their order while other sessions' readers run."""
        for action in actions:
            if isinstance(action, DetectSpeech):
                turn_actions: list[Action] = []
                for event in await self.speech.detect(action.audio, action.format):
                    turn_actions.extend(self.session.turn_event(event))
                self._dispatch(turn_actions)
            else:
                self._dispatch([action])

    def _late_turn_events(self, events: list[TurnEvent]) -> None:
        """Turn events decided between chunks (the turn model answered): to the session at once, so that a turn
        judged complete ends without waiting for the next chunk. They follow every event of the chunks before."""
        actions: list[Action] = []
        for event in events:
            actions.extend(self.session.turn_event(event))
        self._dispatch(actions)

    def _not_audio_of(self, response_id: str) -> Callable[[dict], bool]:
        kind = self._audio_delta_type
        return lambda event: not (event.get("type") == kind and event.get("response_id") == response_id)

    def _transcription_may_start(self) -> bool:
        """No reply waits for its first output, and none is due to start."""
        return not self.responses.awaiting_output and not self.session.reply_pending

    def _media_sink(self) -> MediaSink:
        assert self._media is not None, "checked in __init__ for MEDIA sessions"
        return self._media

    def _first_audio(self, trace: FirstAudioTrace) -> None:
        log_first_audio(self.session.session_id, trace)
        if self._on_first_audio is not None:
            self._on_first_audio(trace)


def log_first_audio(session_id: str, trace: FirstAudioTrace) -> None:
    """One log line with the hops of a response's path to its first audio."""
    segments = ", ".join(f"{name} {ms:.1f}" for name, ms in trace.segments().items())
    total = trace.total_ms()
    if total is not None:  # the server's own time to first audio: turn end (or request) to the first delta out
        segments += f", total {total:.1f}"
    kind = " (preemptive, withdrawn)" if trace.withdrawn else " (preemptive)" if trace.preemptive else ""
    line = "session %s response %s%s first audio path (ms): %s"
    logger.info(line, session_id, trace.response_id, kind, segments or "-")
