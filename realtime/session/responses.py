"""Responses: ``response.create`` / ``response.cancel``, a response's start, its output and its end
(``response.done``, with the outcome our cancel decision gives it).

One response at a time (:attr:`Responses.active`). A cancel is decided here (:class:`ResponsePhase` ``CANCELLING``):
engine output is dropped from then on, until the engine's ``ResponseDone`` ends the response as cancelled. A reply
asked for by turn detection while one is being cancelled starts when that one ends. Audio output is
:mod:`realtime.session.output_audio`'s, function calls :mod:`realtime.session.tool_calls`'; when the assistant
starts and stops being busy is told to an :class:`AssistantActivity` (the turn state's idle timer).
"""

from __future__ import annotations

from typing import Protocol

from pipeline.api import reply_token_limit
from pipeline.response_events import (
    AudioChunk,
    FunctionCallDelta,
    FunctionCallDone,
    FunctionCallStarted,
    ResponseDone,
    ResponseEvent,
    TextDelta,
)
from realtime.errors import RealtimeError, to_error_payload
from realtime.ids import IdGenerator, IdKind
from realtime.protocol.client import ResponseCancel, ResponseCreate
from realtime.protocol.codes import ErrorCode, StatusReason
from realtime.protocol.model import (
    KEEP,
    ContentPart,
    Item,
    ItemStatus,
    OutputModality,
    ResponseParams,
    ResponseWireStatus,
    Role,
)
from realtime.protocol.names import ContentType
from realtime.protocol.server import ServerEvents
from realtime.session.commands import CancelResponse, SetInstructions, StartResponse
from realtime.session.emitter import AudioClock, Emitter
from realtime.session.mirror import ItemMirror
from realtime.session.output_audio import OutputAudio
from realtime.session.response_state import ActiveResponse, ResponsePhase
from realtime.session.settings import AudioTransport, EncoderFactory, SessionSettings
from realtime.session.tool_calls import FunctionCalls
from realtime.session.updates import SessionUpdates
from realtime.turns.idle import playback_end_ms


class AssistantActivity(Protocol):
    """Told when a reply starts and when the assistant has finished (for the idle timeout)."""

    def reply_started(self) -> None: ...

    def reply_ended(self, at_ms: float) -> None: ...


class Responses:
    """Owns the active response and the reply due once a cancelled one ends."""

    def __init__(
        self,
        settings: SessionSettings,
        updates: SessionUpdates,
        ids: IdGenerator,
        events: ServerEvents,
        out: Emitter,
        *,
        conversation_id: str,
        encoder_factory: EncoderFactory,
        mirror: ItemMirror,
        calls: FunctionCalls,
        audio: OutputAudio,
        clock: AudioClock,
        activity: AssistantActivity,
    ) -> None:
        self._settings = settings
        self._updates = updates
        self._ids = ids
        self._events = events
        self._out = out
        self._conversation_id = conversation_id
        self._encoder_factory = encoder_factory
        self._mirror = mirror
        self._calls = calls
        self._audio = audio
        self._clock = clock
        self._activity = activity
        self._active: ActiveResponse | None = None
        self._reply_pending = False  # speech stopped while a cancelled response winds down

    @property
    def active(self) -> ActiveResponse | None:
        return self._active

    @property
    def reply_pending(self) -> bool:
        """A reply is due to start once the cancelled one ends."""
        return self._reply_pending

    def create_request(self, event: ResponseCreate) -> None:
        """``response.create`` (``conversation_already_has_active_response`` while one runs)."""
        if self._active is not None:
            raise RealtimeError(
                f"conversation already has an active response in progress: {self._active.id}",
                code=ErrorCode.CONVERSATION_ALREADY_HAS_ACTIVE_RESPONSE,
            )
        if event.params.modality is not KEEP:  # the session's own was checked when it was set
            self._updates.check_modality(event.params.modality, event.params.modality_param)
        self.start(event.params, requested=True)

    def cancel_request(self, event: ResponseCancel) -> None:
        """``response.cancel`` (``response_cancel_not_active`` unless it names the response in progress, or none)."""
        response = self._active
        if response is None or response.phase is not ResponsePhase.IN_PROGRESS:
            raise RealtimeError("no active response to cancel", code=ErrorCode.RESPONSE_CANCEL_NOT_ACTIVE)
        if event.response_id is not None and event.response_id != response.id:
            raise RealtimeError(
                f"response {event.response_id!r} is not the active response",
                code=ErrorCode.RESPONSE_CANCEL_NOT_ACTIVE,
                param="response_id",
            )
        self._cancel(response, StatusReason.CLIENT_CANCELLED)

    def interrupt(self) -> None:
        """The user started speaking: cancel the response in progress (not one already being cancelled)."""
        if self._active is not None and self._active.phase is ResponsePhase.IN_PROGRESS:
            self._cancel(self._active, StatusReason.TURN_DETECTED)

    def reply_to_turn(self) -> None:
        """A turn ended asking for a reply: start it, or have it start when the cancelled response ends. A response
        the user did not interrupt (``interrupt_response`` false) keeps going and no new one starts, as in the OpenAI
        API."""
        if self._active is None:
            self.start(ResponseParams())
        elif self._active.phase is ResponsePhase.CANCELLING:
            self._reply_pending = True

    def abandon(self) -> None:
        """Forget the active response without a ``response.done`` (a preemptive reply withdrawn unseen, whose cancel
        its withdrawal emitted)."""
        self._active = None

    def start(self, params: ResponseParams, *, requested: bool = False) -> ActiveResponse:
        """Start a response. ``requested``: by the client event being handled (a ``response.create``), whose id the
        response keeps."""
        cfg = self._updates.config
        voice = self._updates.voice(params.voice, params.voice_param) if params.voice is not KEEP else cfg.voice
        self._activity.reply_started()
        modality = cfg.modality if params.modality is KEEP else params.modality
        fmt = cfg.output_format if params.output_format is KEEP else params.output_format
        max_tokens = reply_token_limit(
            cfg.max_output_tokens if params.max_output_tokens is KEEP else params.max_output_tokens,
            self._settings.max_output_tokens,
        )
        calls = self._calls.response_calls(params)
        override = params.instructions is not KEEP and params.instructions != cfg.instructions
        if override:
            self._out.emit(SetInstructions(params.instructions))  # type: ignore[arg-type]
        audio = modality is OutputModality.AUDIO
        events_audio = audio and self._settings.audio_transport is AudioTransport.EVENTS
        item = Item(self._ids.new(IdKind.ITEM), Role.ASSISTANT, [], ItemStatus.IN_PROGRESS)  # before the response id
        response = ActiveResponse(
            id=self._ids.new(IdKind.RESPONSE),
            item=item,
            part=ContentPart(ContentType.OUTPUT_AUDIO, transcript="")
            if audio
            else ContentPart(ContentType.OUTPUT_TEXT, text=""),
            previous_item_id=None,
            modality=modality,
            voice=voice,
            output_format=fmt,
            max_output_tokens=max_tokens,
            metadata=params.metadata,
            encoder=self._encoder_factory(fmt) if events_audio else None,
            restore_instructions=override,
            event_id=self._out.event_id if requested else None,
            requested=requested,
            calls=calls,
        )
        self._active = response
        created = response.summary(self._conversation_id, ResponseWireStatus.IN_PROGRESS)
        self._out.send(self._events.response_created(created))
        if not calls.lazy_message:
            self._announce_message(response)
        self._out.emit(
            StartResponse(
                response.id,
                item.id,
                modality.engine_modalities,
                self._updates.speaker(voice),
                max_tokens,
                tool_choice=calls.choice,
                call_item_ids=calls.item_ids,
            )
        )
        return response

    def output(self, response: ActiveResponse, event: ResponseEvent) -> None:
        """Engine output of ``response`` (the active one; ``ResponseDone`` last)."""
        if isinstance(event, TextDelta):
            self._text_delta(response, event)
        elif isinstance(event, AudioChunk):
            self._audio_chunk(response, event)
        elif isinstance(event, (FunctionCallStarted, FunctionCallDelta, FunctionCallDone)):
            self._calls.call_event(response, event)
        else:
            assert isinstance(event, ResponseDone)
            self.finish(response, event)

    def finish(self, response: ActiveResponse, done: ResponseDone) -> None:
        """End ``response`` (``response.done``); a reply due once it ended starts."""
        state, reason, error = _outcome(response, done)
        if not response.outputs:  # a reply of neither text nor calls still has its (empty) message
            self._announce_message(response)
        if state is ResponseWireStatus.COMPLETED and response.announced:
            self._audio.flush(response)
        if response.announced:
            self._finish_message(response, state)
        self._calls.finish(response)
        summary = response.summary(
            self._conversation_id, state, output=tuple(response.outputs), reason=reason, error=error, usage=done.usage
        )
        if state is ResponseWireStatus.FAILED:  # also as an error event: clients that only watch errors see it
            self._out.error(_failure(done), response.event_id, "response.create" if response.requested else None)
        self._out.send(self._events.response_done(summary))
        self._active = None
        media = self._settings.audio_transport is AudioTransport.MEDIA
        if not (media and self._audio.playing == response.id):  # else the end of playback decides
            clock_ms = self._clock.clock_ms
            self._activity.reply_ended(playback_end_ms(clock_ms, response.first_audio_ms, response.part.audio_ms))
        if response.restore_instructions:
            self._out.emit(SetInstructions(self._updates.config.instructions))
        if self._reply_pending:
            self._reply_pending = False
            self.start(ResponseParams())

    def _cancel(self, response: ActiveResponse, reason: StatusReason) -> None:
        response.phase = ResponsePhase.CANCELLING
        response.cancel_reason = reason
        self._out.emit(CancelResponse(response.id, reason))
        self._audio.stop(response.id)

    def _announce_message(self, response: ActiveResponse) -> None:
        """The reply's message item joins the conversation and the response's output (before its first text or audio
        is sent)."""
        item = response.item
        response.previous_item_id = self._mirror.add(item)
        response.outputs.append(item)
        self._out.send(self._events.output_item_added(response.id, response.output_index(item), item))
        self._out.send(self._events.item_added(item, response.previous_item_id))
        item.content.append(response.part)
        self._out.send(self._events.content_part_added(response.ref, response.part))

    def _text_delta(self, response: ActiveResponse, event: TextDelta) -> None:
        if response.phase is ResponsePhase.CANCELLING or not event.text:
            return
        if not response.announced:
            self._announce_message(response)
        if response.modality is OutputModality.AUDIO:
            response.part.transcript = (response.part.transcript or "") + event.text
            self._out.send(self._events.transcript_delta(response.ref, event.text))
        else:
            response.part.text = (response.part.text or "") + event.text
            self._out.send(self._events.text_delta(response.ref, event.text))

    def _audio_chunk(self, response: ActiveResponse, event: AudioChunk) -> None:
        # Audio after the cancel decision is never sent; audio of a text response is not either
        # (the engine was asked for text only, so this is defensive).
        if response.phase is ResponsePhase.CANCELLING or response.modality is OutputModality.TEXT:
            return
        if not response.announced:
            self._announce_message(response)
        self._audio.play(response, event.pcm)

    def _finish_message(self, response: ActiveResponse, state: ResponseWireStatus) -> None:
        item, part, ref = response.item, response.part, response.ref
        item.status = ItemStatus.COMPLETED if state is ResponseWireStatus.COMPLETED else ItemStatus.INCOMPLETE
        if response.modality is OutputModality.AUDIO:
            self._out.send(self._events.audio_done(ref))
            self._out.send(self._events.transcript_done(ref, part.transcript or ""))
        else:
            self._out.send(self._events.text_done(ref, part.text or ""))
        self._out.send(self._events.content_part_done(ref, part))
        self._out.send(self._events.output_item_done(response.id, ref.output_index, item))
        self._out.send(self._events.item_done(item, response.previous_item_id))


def _outcome(
    response: ActiveResponse, done: ResponseDone
) -> tuple[ResponseWireStatus, StatusReason | None, dict | None]:
    """Our cancel decision wins over what the engine managed to finish."""
    if response.cancel_reason is not None:
        return ResponseWireStatus.CANCELLED, response.cancel_reason, None
    state = ResponseWireStatus(done.status.value)
    error = None
    if state is ResponseWireStatus.FAILED:
        payload = to_error_payload(_failure(done))
        error = {"type": payload["type"], "code": payload["code"], "message": payload["message"]}
    return state, StatusReason.from_engine(done.reason), error


def _failure(done: ResponseDone) -> Exception:
    """Why a failed response failed (an engine that gave no reason failed internally)."""
    return done.error or RuntimeError("response failed")
