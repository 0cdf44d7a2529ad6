"""Responses in the session: ``response.create`` / ``response.cancel``, a response's start, its text output and its
end (``response.done``, with the outcome our cancel decision gives it).

One response at a time (:attr:`~realtime.session.Session.active_response_id`). A cancel is decided here
(:class:`ResponsePhase` ``CANCELLING``): engine output is dropped from then on, until the engine's ``ResponseDone``
ends the response as cancelled. A reply asked for by turn detection while one is being cancelled starts when that
one ends. Audio output is :mod:`realtime.session.output_audio`'s, function calls :mod:`realtime.tool_calls`'.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from pipeline.response_events import ResponseDone, TextDelta
from realtime.errors import RealtimeError, to_error_payload
from realtime.ids import IdKind
from realtime.protocol.audio_format import AudioFormat
from realtime.protocol.client import ResponseCancel, ResponseCreate
from realtime.protocol.codes import ErrorCode, StatusReason
from realtime.protocol.model import (
    KEEP,
    ContentPart,
    Item,
    ItemStatus,
    OutputModality,
    ResponseParams,
    ResponseSummary,
    ResponseWireStatus,
    Role,
)
from realtime.protocol.names import ContentType
from realtime.protocol.server import ContentRef
from realtime.session.commands import CancelResponse, SetInstructions, StartResponse
from realtime.session.settings import AudioEncoder, AudioTransport
from realtime.tool_calls import ResponseCalls
from realtime.turns.idle import playback_end_ms


class ResponsePhase(enum.Enum):
    IN_PROGRESS = "in_progress"
    CANCELLING = "cancelling"
    """Cancel decided: engine output is dropped until its ``ResponseDone`` arrives."""


@dataclass
class _Response:
    id: str
    item: Item
    part: ContentPart
    previous_item_id: str | None
    modality: OutputModality
    voice: str | None
    output_format: AudioFormat
    max_output_tokens: int | None
    metadata: dict[str, str] | None
    encoder: AudioEncoder | None
    restore_instructions: bool
    event_id: str | None = None
    """The ``event_id`` of the ``response.create`` that asked for it (None for one started by turn detection):
    an ``error`` of its failure carries it."""
    requested: bool = False
    """Asked for by a ``response.create`` (rather than by turn detection)."""
    first_audio_ms: float | None = None
    """The audio clock when its first audio delta was sent (WebSocket), for the idle timeout."""
    phase: ResponsePhase = ResponsePhase.IN_PROGRESS
    cancel_reason: StatusReason | None = None
    calls: ResponseCalls = field(default_factory=ResponseCalls)
    outputs: list[Item] = field(default_factory=list)
    """The output items announced so far, in output order (the message, then function calls)."""

    @property
    def announced(self) -> bool:
        return self.item in self.outputs

    @property
    def ref(self) -> ContentRef:
        return ContentRef(self.id, self.item.id, output_index=self.outputs.index(self.item))

    def summary(self, conversation_id: str, state: ResponseWireStatus, **done: object) -> ResponseSummary:
        return ResponseSummary(
            id=self.id,
            conversation_id=conversation_id,
            state=state,
            modality=self.modality,
            voice=self.voice,
            output_format=self.output_format,
            max_output_tokens=self.max_output_tokens,
            metadata=self.metadata,
            **done,  # type: ignore[arg-type]
        )


class Responses:
    """Responses (mixed into :class:`realtime.session.Session`). Owns the active response and the reply due once a
    cancelled one ends; uses the session's ``_emit``, ``_send``, ``_error``, ``_new_id``, ``_events``,
    ``_encoder_factory``, ``config``, ``settings``, ``conversation_id``, ``_event_id``, the conversation
    (``_add_item``), the voices and output modalities (``_voice``, ``_speaker``, ``_check_modality``), function
    calling (``_response_calls``, ``_finish_calls``), output audio (``_send_audio``, ``_stop_output_audio``,
    ``_audio_response_id``) and the turn state (``_speaking``, ``_idle``, ``_clock_ms``)."""

    _response: _Response | None
    _auto_response_pending: bool

    def _response_create(self, event: ResponseCreate) -> None:
        if self._response is not None:
            raise RealtimeError(
                f"conversation already has an active response in progress: {self._response.id}",
                code=ErrorCode.CONVERSATION_ALREADY_HAS_ACTIVE_RESPONSE,
            )
        if event.params.modality is not KEEP:  # the session's own was checked when it was set
            self._check_modality(event.params.modality, event.params.modality_param)
        self._start_response(event.params, requested=True)

    def _response_cancel(self, event: ResponseCancel) -> None:
        response = self._response
        if response is None or response.phase is not ResponsePhase.IN_PROGRESS:
            raise RealtimeError("no active response to cancel", code=ErrorCode.RESPONSE_CANCEL_NOT_ACTIVE)
        if event.response_id is not None and event.response_id != response.id:
            raise RealtimeError(
                f"response {event.response_id!r} is not the active response",
                code=ErrorCode.RESPONSE_CANCEL_NOT_ACTIVE,
                param="response_id",
            )
        self._cancel(response, StatusReason.CLIENT_CANCELLED)

    def _cancel(self, response: _Response, reason: StatusReason) -> None:
        response.phase = ResponsePhase.CANCELLING
        response.cancel_reason = reason
        self._emit(CancelResponse(response.id, reason))
        if self._audio_response_id == response.id:
            self._stop_output_audio(response.id)

    def _start_response(self, params: ResponseParams, *, requested: bool = False) -> None:
        """``requested``: by the client event being handled (a ``response.create``), whose id the response keeps."""
        cfg = self.config
        voice = self._voice(params.voice, params.voice_param) if params.voice is not KEEP else cfg.voice
        self._idle.stop()
        modality = cfg.modality if params.modality is KEEP else params.modality
        fmt = cfg.output_format if params.output_format is KEEP else params.output_format
        max_tokens = _capped(
            cfg.max_output_tokens if params.max_output_tokens is KEEP else params.max_output_tokens,
            self.settings.max_output_tokens,
        )
        calls = self._response_calls(params)
        override = params.instructions is not KEEP and params.instructions != cfg.instructions
        if override:
            self._emit(SetInstructions(params.instructions))  # type: ignore[arg-type]
        audio = modality is OutputModality.AUDIO
        part = (
            ContentPart(ContentType.OUTPUT_AUDIO, transcript="")
            if audio
            else ContentPart(ContentType.OUTPUT_TEXT, text="")
        )
        item = Item(self._new_id(IdKind.ITEM), Role.ASSISTANT, [], ItemStatus.IN_PROGRESS)
        encoder = (
            self._encoder_factory(fmt) if audio and self.settings.audio_transport is AudioTransport.EVENTS else None
        )
        response = _Response(
            id=self._new_id(IdKind.RESPONSE),
            item=item,
            part=part,
            previous_item_id=None,
            modality=modality,
            voice=voice,
            output_format=fmt,
            max_output_tokens=max_tokens,
            metadata=params.metadata,
            encoder=encoder,
            restore_instructions=override,
            event_id=self._event_id if requested else None,
            requested=requested,
            calls=calls,
        )
        self._response = response
        self._send(
            self._events.response_created(response.summary(self.conversation_id, ResponseWireStatus.IN_PROGRESS))
        )
        if not calls.lazy_message:
            self._announce_message(response)
        self._emit(
            StartResponse(
                response.id,
                item.id,
                modality.engine_modalities,
                self._speaker(voice),
                max_tokens,
                tool_choice=calls.choice,
                call_item_ids=calls.item_ids,
            )
        )

    def _announce_message(self, response: _Response) -> None:
        """The reply's message item joins the conversation and the response's output (before its first text or audio
        is sent)."""
        item = response.item
        response.previous_item_id = self._add_item(item)
        response.outputs.append(item)
        self._send(self._events.output_item_added(response.id, response.outputs.index(item), item))
        self._send(self._events.item_added(item, response.previous_item_id))
        item.content.append(response.part)
        self._send(self._events.content_part_added(response.ref, response.part))

    def _text_delta(self, response: _Response, event: TextDelta) -> None:
        if response.phase is ResponsePhase.CANCELLING or not event.text:
            return
        if not response.announced:
            self._announce_message(response)
        if response.modality is OutputModality.AUDIO:
            response.part.transcript = (response.part.transcript or "") + event.text
            self._send(self._events.transcript_delta(response.ref, event.text))
        else:
            response.part.text = (response.part.text or "") + event.text
            self._send(self._events.text_delta(response.ref, event.text))

    def _finish(self, response: _Response, done: ResponseDone) -> None:
        state, reason, error = self._outcome(response, done)
        if not response.outputs:  # a reply of neither text nor calls still has its (empty) message
            self._announce_message(response)
        if state is ResponseWireStatus.COMPLETED and response.encoder is not None and response.announced:
            self._send_audio(response, response.encoder.flush())
        if response.announced:
            self._finish_message(response, state)
        self._finish_calls(response)
        summary = response.summary(
            self.conversation_id, state, output=tuple(response.outputs), reason=reason, error=error, usage=done.usage
        )
        if state is ResponseWireStatus.FAILED:  # also as an error event: clients that only watch errors see it
            self._error(_failure(done), response.event_id, "response.create" if response.requested else None)
        self._send(self._events.response_done(summary))
        self._response = None
        media_playing = self.settings.audio_transport is AudioTransport.MEDIA and self._audio_response_id == response.id
        if not media_playing and not self._speaking:  # else the end of playback (or speech) decides
            self._idle.start(playback_end_ms(self._clock_ms, response.first_audio_ms, response.part.audio_ms))
        if response.restore_instructions:
            self._emit(SetInstructions(self.config.instructions))
        if self._auto_response_pending:
            self._auto_response_pending = False
            self._start_response(ResponseParams())

    def _finish_message(self, response: _Response, state: ResponseWireStatus) -> None:
        item, part, ref = response.item, response.part, response.ref
        item.status = ItemStatus.COMPLETED if state is ResponseWireStatus.COMPLETED else ItemStatus.INCOMPLETE
        if response.modality is OutputModality.AUDIO:
            self._send(self._events.audio_done(ref))
            self._send(self._events.transcript_done(ref, part.transcript or ""))
        else:
            self._send(self._events.text_done(ref, part.text or ""))
        self._send(self._events.content_part_done(ref, part))
        self._send(self._events.output_item_done(response.id, ref.output_index, item))
        self._send(self._events.item_done(item, response.previous_item_id))

    @staticmethod
    def _outcome(
        response: _Response, done: ResponseDone
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


def _capped(requested: int | None, cap: int | None) -> int | None:
    """The reply limit a response really gets: what was asked (None: ``"inf"``) within the engine's cap."""
    if cap is None:
        return requested
    return cap if requested is None else min(requested, cap)
