"""The :class:`Session`: a thin composition of the session's parts (see :mod:`realtime.session`). It owns them,
routes each input to them and returns the actions they emitted; no state of its own but its ids."""

from __future__ import annotations

from collections.abc import Callable

from pipeline.response_events import ResponseDone, ResponseEvent, ResponseStatus, Usage
from realtime.errors import RealtimeError
from realtime.ids import IdGenerator, IdKind, RandomIds
from realtime.media.audio import OutputEncoder
from realtime.protocol.client import (
    ClientEvent,
    InputAudioAppend,
    InputAudioClear,
    InputAudioCommit,
    ItemCreate,
    ItemDelete,
    ItemRetrieve,
    ItemTruncate,
    OutputAudioClear,
    ResponseCancel,
    ResponseCreate,
    SessionUpdate,
    client_event_type,
    parse_client_event,
)
from realtime.protocol.model import Item, SessionConfig
from realtime.protocol.names import Dialect
from realtime.protocol.server import ServerEvents
from realtime.protocol.turn_detection import ServerVadParams
from realtime.session.commands import Action, ConfigureTurnDetection, DeleteItem, EngineCommand, StartResponse
from realtime.session.emitter import Emitter
from realtime.session.input_audio import InputAudio, InputChunk
from realtime.session.items import ConversationItems
from realtime.session.mirror import ItemMirror
from realtime.session.output_audio import OutputAudio
from realtime.session.preemptive import PreemptiveReplies
from realtime.session.response_state import ResponsePhase
from realtime.session.responses import Responses
from realtime.session.settings import EncoderFactory, SessionSettings
from realtime.session.tool_calls import FunctionCalls
from realtime.session.transcripts import InputTranscription
from realtime.session.turns import SpeechAndIdle, TurnTracker
from realtime.session.updates import SessionUpdates
from realtime.turns.server_vad import TurnEvent


class Session:
    """One client's session. Not thread-safe; every method is synchronous and returns the actions its input caused
    (an empty list when nothing follows)."""

    def __init__(
        self,
        settings: SessionSettings,
        *,
        ids: IdGenerator | None = None,
        encoder_factory: EncoderFactory = OutputEncoder,
    ) -> None:
        self.settings = settings
        self._ids = ids = ids or RandomIds()
        self.session_id = ids.new(IdKind.SESSION)
        self.conversation_id = ids.new(IdKind.CONVERSATION)
        self._events = events = ServerEvents(settings.dialect, ids)
        self._out = out = Emitter(events, self.session_id)
        self._updates = updates = SessionUpdates(settings, events, out, self.session_id, self._turn_detection_changed)
        self._mirror = mirror = ItemMirror()
        self._input = InputAudio(settings, updates, ids, events, out, mirror)
        self._transcription = InputTranscription(updates, events, out, mirror, self.session_id)
        self._audio = OutputAudio(settings, events, out, self._input)
        self._calls = FunctionCalls(updates, ids, events, out, mirror)
        self._turn_state = SpeechAndIdle()
        self._compose_replies(encoder_factory)

    def _compose_replies(self, encoder_factory: EncoderFactory) -> None:
        """The parts that make and track replies, on top of those :meth:`__init__` made; then the client events'
        routes."""
        ids, events, out, updates, mirror = self._ids, self._events, self._out, self._updates, self._mirror
        self._responses = Responses(
            self.settings,
            updates,
            ids,
            events,
            out,
            conversation_id=self.conversation_id,
            encoder_factory=encoder_factory,
            mirror=mirror,
            calls=self._calls,
            audio=self._audio,
            clock=self._input,
            activity=self._turn_state,
        )
        self._conversation = ConversationItems(
            updates, ids, events, out, mirror=mirror, responses=self._responses, calls=self._calls
        )
        self._preemptive = PreemptiveReplies(
            self.settings,
            out,
            input_audio=self._input,
            mirror=mirror,
            responses=self._responses,
            audio=self._audio,
            transcription=self._transcription,
        )
        self._turns = TurnTracker(
            updates,
            events,
            out,
            state=self._turn_state,
            input_audio=self._input,
            responses=self._responses,
            audio=self._audio,
            transcription=self._transcription,
            preemptive=self._preemptive,
        )
        self._handlers: dict[type, Callable] = {
            SessionUpdate: updates.update,
            InputAudioAppend: self._append,
            InputAudioCommit: self._commit,
            InputAudioClear: self._clear,
            ItemCreate: self._conversation.create,
            ItemRetrieve: self._conversation.retrieve,
            ItemDelete: self._conversation.delete,
            ItemTruncate: self._conversation.truncate,
            ResponseCreate: self._responses.create_request,
            ResponseCancel: self._responses.cancel_request,
            OutputAudioClear: lambda event: self._audio.clear_request(),
        }

    # --- read-only views ---

    @property
    def config(self) -> SessionConfig:
        return self._updates.config

    @property
    def dialect(self) -> Dialect:
        return self.settings.dialect

    @property
    def items(self) -> tuple[Item, ...]:
        return self._mirror.items

    @property
    def active_response_id(self) -> str | None:
        response = self._responses.active
        return response.id if response else None

    @property
    def response_phase(self) -> ResponsePhase | None:
        response = self._responses.active
        return response.phase if response else None

    @property
    def reply_pending(self) -> bool:
        """A reply is due to start once the cancelled one ends (speech stopped while it wound down)."""
        return self._responses.reply_pending

    @property
    def input_buffer_ms(self) -> float:
        return self._input.duration_ms

    @property
    def input_streamed_ms(self) -> float:
        """The part of the input buffer that went to the engine (the rest is held back before speech)."""
        return self._input.streamed_ms

    @property
    def input_kept(self) -> tuple[InputChunk, ...]:
        """The input buffer's chunks kept for a withdrawn preemptive reply to stream again (none without
        ``SessionSettings.preemptive_replies``)."""
        return self._input.kept

    @property
    def audio_clock_ms(self) -> float:
        return self._input.clock_ms

    # --- inputs ---

    def start(self) -> list[Action]:
        """The first events of the session (call once, before anything else)."""
        config = self.config
        self._out.send(self._events.session_created(config, session_id=self.session_id, model=self.settings.model))
        self._out.send(self._events.conversation_created(self.conversation_id))
        if config.turn_detection is not None:
            self._out.emit(ConfigureTurnDetection(config.turn_detection, 0))
        return self._out.drain()

    def receive(self, message: str | bytes) -> list[Action]:
        """A raw client message: parsed, then handled like :meth:`handle`."""
        try:
            event = parse_client_event(message)
        except RealtimeError as exc:
            return self.refuse(exc)
        return self.handle(event)

    def refuse(self, exc: Exception, event: ClientEvent | None = None) -> list[Action]:
        """A client message refused before it reached :meth:`handle`: unparsable (``event`` None; ``exc`` a
        :class:`RealtimeError` from the parser) or with input its driver could not take (a picture it could not
        decode). Only an ``error`` event; the state stays as it was, but a tentative reply is withdrawn as
        :meth:`handle` would."""
        if event is None:
            assert isinstance(exc, RealtimeError), "a parse failure is a RealtimeError"
            self._out.error(exc, exc.event_id, exc.event_type)
            return self._out.drain()
        if not isinstance(event, InputAudioAppend):
            self._preemptive.withdraw()
        self._out.error(exc, event.event_id, client_event_type(event).value)
        return self._out.drain()

    def handle(self, event: ClientEvent) -> list[Action]:
        """A parsed client event. A request the state does not allow yields only an error event. Anything but an
        audio append first withdraws a preemptive reply the client has not seen (it was made for a turn the client
        now acts on)."""
        if not isinstance(event, InputAudioAppend):
            self._preemptive.withdraw()
        with self._out.client_event(event.event_id):
            try:
                self._handlers[type(event)](event)
            except RealtimeError as exc:
                self._out.error(exc, event.event_id, client_event_type(event).value)
        return self._out.drain()

    def turn_event(self, event: TurnEvent) -> list[Action]:
        """Speech started/stopped/paused/resumed (``SpeechStarted`` … of :mod:`realtime.turns.server_vad`, in ms on
        the session's audio clock), from the detector configured by the last :class:`ConfigureTurnDetection`.
        Events arriving after detection was turned off are stale and ignored."""
        self._turns.turn_event(event)
        return self._out.drain()

    def response_event(self, response_id: str, event: ResponseEvent) -> list[Action]:
        """Engine output of the active response ``response_id`` (``ResponseDone`` last). A withdrawn preemptive
        reply's output is dropped; a tentative one's client events are held."""
        if self._preemptive.drops_output(response_id, last=isinstance(event, ResponseDone)):
            return self._out.drain()
        response = self._responses.active
        if response is None or response.id != response_id:
            raise ValueError(f"engine output for {response_id}, which is not the active response")
        with self._preemptive.holding(response_id):
            self._responses.output(response, event)
            if isinstance(event, ResponseDone):
                self._preemptive.reply_ended(response_id)
        return self._out.drain()

    def command_failed(self, command: EngineCommand, exc: Exception) -> list[Action]:
        """An engine command raised. A response that could not start ends as failed (an ``error`` event, then
        ``response.done`` failed, as for a response that fails while generating); any other failure is reported as
        an error event. Failures about a withdrawn preemptive reply are not news."""
        if (isinstance(command, StartResponse) and self._preemptive.withdrew_reply(command.response_id)) or (
            isinstance(command, DeleteItem) and self._preemptive.withdrew_item(command.item_id)
        ):
            return self._out.drain()  # the client never saw the withdrawn reply or the commit its items came from
        ids = [getattr(command, name, None) for name in ("response_id", "item_id")]
        with self._preemptive.holding(*(value for value in ids if isinstance(value, str))):
            response = self._responses.active
            if isinstance(command, StartResponse) and response is not None and response.id == command.response_id:
                self._responses.finish(
                    response, ResponseDone(ResponseStatus.FAILED, Usage(), reason="error", error=exc)
                )
                self._preemptive.reply_ended(response.id)
            else:
                self._out.error(exc, command.event_id)
        return self._out.drain()

    def transcription_delta(self, item_id: str, content_index: int, delta: str) -> list[Action]:
        """More of the transcript of a :class:`~realtime.session.commands.Transcribe` job."""
        self._transcription.delta(item_id, content_index, delta)
        return self._out.drain()

    def transcription_completed(self, item_id: str, content_index: int, transcript: str, usage: Usage) -> list[Action]:
        """A :class:`~realtime.session.commands.Transcribe` job's whole transcript: it becomes the content part's
        ``transcript``."""
        self._transcription.completed(item_id, content_index, transcript, usage)
        return self._out.drain()

    def transcription_failed(self, item_id: str, content_index: int, exc: Exception) -> list[Action]:
        """A :class:`~realtime.session.commands.Transcribe` job failed: ``...input_audio_transcription.failed`` with
        the error (logged like an ``error`` event)."""
        self._transcription.failed(item_id, content_index, exc)
        return self._out.drain()

    def playback_stopped(self, response_id: str) -> list[Action]:
        """WebRTC: the output track played the last audio of ``response_id``."""
        if self._audio.playback_stopped(response_id) and self._responses.active is None:
            self._turn_state.reply_ended(self._input.clock_ms)
        return self._out.drain()

    # --- routing of the input buffer's client events ---

    def _append(self, event: InputAudioAppend) -> None:
        chunk = self._input.accept(event.audio)
        if chunk is None:
            return
        if not self._preemptive.keep_aside(chunk):
            self._input.add(chunk, speaking=self._turn_state.speaking)
        self._turns.audio_appended(event.audio, chunk.format)

    def _commit(self, event: InputAudioCommit) -> None:
        self._input.check_commit()
        self._turns.restart_if_speaking()
        self._transcription.request(self._input.commit().item_id)

    def _clear(self, event: InputAudioClear) -> None:
        self._input.discard()
        self._turns.restart_if_speaking()
        self._out.send(self._events.input_audio_buffer_cleared())

    def _turn_detection_changed(self, params: ServerVadParams | None) -> None:
        self._turns.detection_changed(params)
