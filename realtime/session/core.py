"""The :class:`Session` class: its state, its inputs (each returns the actions it caused) and the plumbing its
parts share. Each concern is a mixin of its own module (:mod:`realtime.session.input_audio`,
:mod:`~realtime.session.transcripts`, :mod:`~realtime.session.turns`, :mod:`~realtime.session.preemptive`,
:mod:`~realtime.session.items`, :mod:`~realtime.session.responses`, :mod:`~realtime.session.output_audio`,
:mod:`~realtime.session.updates`, and :mod:`realtime.tool_calls`); the state they own is set up here, in one place.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from contextlib import nullcontext

from pipeline.response_events import (
    AudioChunk,
    FunctionCallDelta,
    FunctionCallDone,
    FunctionCallStarted,
    ResponseDone,
    ResponseEvent,
    ResponseStatus,
    TextDelta,
    Usage,
)
from realtime.errors import RealtimeError, to_error_payload
from realtime.ids import IdGenerator, IdKind, RandomIds
from realtime.media.audio import OutputEncoder
from realtime.observe.error_log import log_error_event
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
from realtime.protocol.model import Item, OutputModality, SessionConfig
from realtime.protocol.names import Dialect
from realtime.protocol.server import ServerEvents
from realtime.session.commands import (
    _CLIENT_ACTIONS,
    Action,
    ConfigureTurnDetection,
    DeleteItem,
    EngineCommand,
    Send,
    StartResponse,
    _Command,
)
from realtime.session.input_audio import InputAudio, _InputBuffer
from realtime.session.items import ConversationItems
from realtime.session.output_audio import OutputAudio
from realtime.session.preemptive import PreemptiveReplies, _Tentative
from realtime.session.responses import ResponsePhase, Responses, _Response
from realtime.session.settings import EncoderFactory, SessionSettings
from realtime.session.transcripts import InputTranscription
from realtime.session.turns import TurnDetection
from realtime.session.updates import SessionUpdates
from realtime.tool_calls import FunctionCalls
from realtime.turns.idle import IdleTimer
from realtime.voices import VoiceTable, usable_aliases


class Session(
    FunctionCalls,
    SessionUpdates,
    InputAudio,
    InputTranscription,
    TurnDetection,
    PreemptiveReplies,
    ConversationItems,
    Responses,
    OutputAudio,
):
    """One client's session. Not thread-safe; every method is synchronous and returns the
    actions its input caused (an empty list when nothing follows)."""

    def __init__(
        self,
        settings: SessionSettings,
        *,
        ids: IdGenerator | None = None,
        encoder_factory: EncoderFactory = OutputEncoder,
    ) -> None:
        self.settings = settings
        self._ids = ids or RandomIds()
        self._events = ServerEvents(settings.dialect, self._ids)
        self._encoder_factory = encoder_factory
        self._voices = VoiceTable(settings.voices, usable_aliases(settings.voice_aliases, settings.voices)[0])
        self.session_id = self._ids.new(IdKind.SESSION)
        self.conversation_id = self._ids.new(IdKind.CONVERSATION)
        self.config = SessionConfig(
            instructions=settings.default_instructions,
            voice=settings.default_voice,
            modality=OutputModality.AUDIO if settings.audio_output else OutputModality.TEXT,
        )
        self._items: dict[str, Item] = {}  # the conversation mirror, in order
        self._buffer = _InputBuffer()
        self._clock_ms = 0.0  # all audio ever appended (the turn detector's clock too)
        self._speaking = False
        self._response: _Response | None = None
        self._auto_response_pending = False  # speech stopped while a cancelled response winds down
        self._audio_response_id: str | None = None  # last response whose audio reached the client
        self._tentative: _Tentative | None = None  # a preemptive reply the client has not seen yet
        self._idle = IdleTimer()  # since when the assistant has finished speaking (server_vad.idle_timeout_ms)
        self._withdrawn: set[str] = set()  # withdrawn replies still running: their output is dropped
        self._withdrawn_items: set[str] = set()  # items a withdrawal deleted: a failure to delete them is not news
        self._hold: list[Action] | None = None  # where client actions go while a tentative reply runs
        self._event_id: str | None = None  # the client event being handled: its engine commands carry its id
        self._out: list[Action] = []
        self._handlers: dict[type, Callable] = {
            SessionUpdate: self._session_update,
            InputAudioAppend: self._append,
            InputAudioCommit: self._commit_request,
            InputAudioClear: self._clear,
            ItemCreate: self._item_create,
            ItemRetrieve: self._item_retrieve,
            ItemDelete: self._item_delete,
            ItemTruncate: self._item_truncate,
            ResponseCreate: self._response_create,
            ResponseCancel: self._response_cancel,
            OutputAudioClear: self._output_audio_clear,
        }

    # --- read-only views ---

    @property
    def dialect(self) -> Dialect:
        return self.settings.dialect

    @property
    def items(self) -> tuple[Item, ...]:
        return tuple(self._items.values())

    @property
    def active_response_id(self) -> str | None:
        return self._response.id if self._response else None

    @property
    def response_phase(self) -> ResponsePhase | None:
        return self._response.phase if self._response else None

    @property
    def reply_pending(self) -> bool:
        """A reply is due to start once the cancelled one ends (speech stopped while it wound down)."""
        return self._auto_response_pending

    @property
    def input_buffer_ms(self) -> float:
        return self._buffer.duration_ms

    @property
    def audio_clock_ms(self) -> float:
        return self._clock_ms

    # --- inputs ---

    def start(self) -> list[Action]:
        """The first events of the session (call once, before anything else)."""
        self._send(self._events.session_created(self.config, session_id=self.session_id, model=self.settings.model))
        self._send(self._events.conversation_created(self.conversation_id))
        if self.config.turn_detection is not None:
            self._emit(ConfigureTurnDetection(self.config.turn_detection, 0))
        return self._drain()

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
            self._error(exc, exc.event_id, exc.event_type)
            return self._drain()
        if self._tentative is not None and not isinstance(event, InputAudioAppend):
            self._withdraw()
        self._error(exc, event.event_id, client_event_type(event).value)
        return self._drain()

    def handle(self, event: ClientEvent) -> list[Action]:
        """A parsed client event. A request the state does not allow yields only an error event. Anything but an
        audio append first withdraws a preemptive reply the client has not seen (it was made for a turn the client
        now acts on)."""
        if self._tentative is not None and not isinstance(event, InputAudioAppend):
            self._withdraw()
        self._event_id = event.event_id
        try:
            self._handlers[type(event)](event)
        except RealtimeError as exc:
            self._error(exc, event.event_id, client_event_type(event).value)
        finally:
            self._event_id = None
        return self._drain()

    def response_event(self, response_id: str, event: ResponseEvent) -> list[Action]:
        """Engine output of the active response ``response_id`` (``ResponseDone`` last). A withdrawn preemptive
        reply's output is dropped; a tentative one's client events are held."""
        if response_id in self._withdrawn:
            if isinstance(event, ResponseDone):
                self._withdrawn.discard(response_id)
            return self._drain()
        response = self._response
        if response is None or response.id != response_id:
            raise ValueError(f"engine output for {response_id}, which is not the active response")
        tentative = self._tentative if self._tentative and self._tentative.response_id == response_id else None
        with self._holding() if tentative else nullcontext():
            if isinstance(event, TextDelta):
                self._text_delta(response, event)
            elif isinstance(event, AudioChunk):
                self._audio_chunk(response, event)
            elif isinstance(event, (FunctionCallStarted, FunctionCallDelta, FunctionCallDone)):
                self._call_event(response, event)
            else:
                self._finish(response, event)
                if tentative is not None:
                    tentative.done = True
        return self._drain()

    def command_failed(self, command: EngineCommand, exc: Exception) -> list[Action]:
        """An engine command raised. A response that could not start ends as failed (an ``error``
        event, then ``response.done`` failed, as for a response that fails while generating); any
        other failure is reported as an error event."""
        withdrawn = (
            isinstance(command, StartResponse)
            and command.response_id in self._withdrawn
            or isinstance(command, DeleteItem)
            and command.item_id in self._withdrawn_items
        )
        if withdrawn:
            return self._drain()  # the client never saw the withdrawn reply or the commit its items came from
        t = self._tentative
        held = t is not None and bool(_command_ids(command) & {t.response_id, t.buffer.item_id})
        with self._holding() if held else nullcontext():
            response = self._response
            if isinstance(command, StartResponse) and response is not None and response.id == command.response_id:
                self._finish(response, ResponseDone(ResponseStatus.FAILED, Usage(), reason="error", error=exc))
                if held:
                    t.done = True  # type: ignore[union-attr]
            else:
                self._error(exc, command.event_id)
        return self._drain()

    # --- plumbing ---

    def _emit(self, action: Action) -> None:
        if self._event_id is not None and isinstance(action, _Command):
            action = dataclasses.replace(action, event_id=self._event_id)
        if self._hold is not None and isinstance(action, _CLIENT_ACTIONS):
            self._hold.append(action)
        else:
            self._out.append(action)

    def _send(self, event: dict | None) -> None:
        if event is not None:  # None: the client's dialect has no such event
            self._emit(Send(event))

    def _error(self, exc: Exception, event_id: str | None = None, answers: str | None = None) -> None:
        """Send (and log) the ``error`` event for ``exc``: every error event of the session comes from here.
        ``answers``: the type of the client event it answers, for the log. (An error of a preemptive reply
        that is then withdrawn unseen is logged but never reaches the client.)"""
        payload = to_error_payload(exc, event_id=event_id)
        log_error_event(payload, session_id=self.session_id, answers=answers)
        self._send(self._events.error(payload))

    def _drain(self) -> list[Action]:
        out, self._out = self._out, []
        return out

    def _new_id(self, kind: IdKind) -> str:
        return self._ids.new(kind)


def _command_ids(command: EngineCommand) -> set[str]:
    """The response and item ids an engine command names."""
    return {value for name in ("response_id", "item_id") if isinstance(value := getattr(command, name, None), str)}
