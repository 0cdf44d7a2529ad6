"""Server events: typed protocol objects → JSON-ready dicts, in the client's dialect.

:class:`ServerEvents` has one builder per event. Each returns the event dict with a fresh
``event_id``, or ``None`` when the dialect has no such event (see :mod:`.names`): callers skip
``None``. Object shapes that differ between dialects (session, response, item content, audio
formats) are serialized by the ``*_object`` functions below.
"""

from __future__ import annotations

from dataclasses import dataclass

from pipeline.response_events import Usage
from realtime.ids import IdGenerator, IdKind
from realtime.protocol.audio_format import AudioFormat
from realtime.protocol.model import (
    ContentPart,
    Item,
    ItemType,
    OutputModality,
    ResponseSummary,
    ResponseWireStatus,
    SessionConfig,
    TranscriptionSettings,
    Truncation,
    TruncationType,
)
from realtime.protocol.names import ContentType, Dialect, PartType, ServerEvent, content_type_name, server_event_name
from realtime.protocol.tools import beta_tool_choice, tool_choice_object, tool_object
from realtime.protocol.turn_detection import ServerVadParams


@dataclass(frozen=True)
class ContentRef:
    """Where a streamed content part lives: response, item, output index, content index."""

    response_id: str
    item_id: str
    output_index: int = 0
    content_index: int = 0

    def fields(self) -> dict:
        return {
            "response_id": self.response_id,
            "item_id": self.item_id,
            "output_index": self.output_index,
            "content_index": self.content_index,
        }


# --- objects ------------------------------------------------------------------------------------


def format_object(fmt: AudioFormat, dialect: Dialect) -> dict | str:
    if dialect is Dialect.BETA:
        return fmt.beta_name
    if fmt is AudioFormat.PCM:
        return {"type": fmt.value, "rate": fmt.sample_rate}
    return {"type": fmt.value}


def turn_detection_object(params: ServerVadParams | None, dialect: Dialect) -> dict | None:
    """The detector as the client configured it: ``semantic_vad`` with its ``eagerness`` (the silence window it
    maps to is not shown: the API's semantic_vad has no such field), or ``server_vad`` with every setting (the beta
    shape has no ``idle_timeout_ms``)."""
    if params is None:
        return None
    flags = {"create_response": params.create_response, "interrupt_response": params.interrupt_response}
    if params.eagerness is not None:
        return {"type": "semantic_vad", "eagerness": params.eagerness, **flags}
    body = {
        "type": "server_vad",
        "threshold": params.threshold,
        "prefix_padding_ms": params.prefix_padding_ms,
        "silence_duration_ms": params.silence_duration_ms,
        **flags,
    }
    return body if dialect is Dialect.BETA else body | {"idle_timeout_ms": params.idle_timeout_ms}


def transcription_object(settings: TranscriptionSettings | None) -> dict | None:
    if settings is None:
        return None
    return {"model": settings.model, "language": settings.language, "prompt": settings.prompt}


def transcription_usage_object(usage: Usage) -> dict:
    """The ``usage`` of ``conversation.item.input_audio_transcription.completed`` (token-billed form)."""
    return {
        "type": "tokens",
        "input_tokens": usage.input_tokens,
        "output_tokens": usage.output_tokens,
        "total_tokens": usage.input_tokens + usage.output_tokens,
        "input_token_details": {"text_tokens": usage.input_text_tokens, "audio_tokens": usage.input_audio_tokens},
    }


def truncation_object(truncation: Truncation) -> str | dict:
    if truncation.type is not TruncationType.RETENTION_RATIO:
        return truncation.type.value
    body: dict = {"type": "retention_ratio", "retention_ratio": truncation.retention_ratio}
    if truncation.post_instructions_tokens is not None:
        body["token_limits"] = {"post_instructions": truncation.post_instructions_tokens}
    return body


def _modalities(modality: OutputModality, dialect: Dialect) -> list[str]:
    """GA lists the one output modality; beta lists text alongside audio (the transcript)."""
    if modality is OutputModality.TEXT:
        return ["text"]
    return ["audio"] if dialect is Dialect.GA else ["text", "audio"]


def _max_tokens(value: int | None) -> int | str:
    return "inf" if value is None else value


def session_object(config: SessionConfig, *, session_id: str, model: str, dialect: Dialect) -> dict:
    """The full effective session, as ``session.created`` / ``session.updated`` carry it.

    The beta shape leaves ``model`` out: the beta SDK types it as a list of OpenAI model names."""
    if dialect is Dialect.BETA:
        return {
            "id": session_id,
            "object": "realtime.session",
            "modalities": _modalities(config.modality, dialect),
            "instructions": config.instructions,
            "voice": config.voice,
            "input_audio_format": format_object(config.input_format, dialect),
            "output_audio_format": format_object(config.output_format, dialect),
            "input_audio_transcription": transcription_object(config.transcription),
            "turn_detection": turn_detection_object(config.turn_detection, dialect),
            "tools": [tool_object(tool) for tool in config.tools],
            "tool_choice": beta_tool_choice(config.tool_choice),
            "max_response_output_tokens": _max_tokens(config.max_output_tokens),
        }
    return {
        "type": "realtime",
        "object": "realtime.session",
        "id": session_id,
        "model": model,
        "output_modalities": _modalities(config.modality, dialect),
        "instructions": config.instructions,
        "audio": {
            "input": {
                "format": format_object(config.input_format, dialect),
                "transcription": transcription_object(config.transcription),
                "noise_reduction": None,
                "turn_detection": turn_detection_object(config.turn_detection, dialect),
            },
            "output": {"format": format_object(config.output_format, dialect), "voice": config.voice, "speed": 1.0},
        },
        "tools": [tool_object(tool) for tool in config.tools],
        "tool_choice": tool_choice_object(config.tool_choice),
        "max_output_tokens": _max_tokens(config.max_output_tokens),
        "truncation": truncation_object(config.truncation),
    }


def content_object(part: ContentPart, dialect: Dialect) -> dict:
    body: dict = {"type": content_type_name(part.type, dialect)}
    if part.type in (ContentType.INPUT_TEXT, ContentType.OUTPUT_TEXT):
        body["text"] = part.text
    elif part.type is ContentType.INPUT_IMAGE:
        body["detail"] = part.detail  # the picture itself is not kept, so never echoed
    else:
        body["transcript"] = part.transcript
    return body


def item_object(item: Item, dialect: Dialect) -> dict:
    body = {"id": item.id, "object": "realtime.item", "type": item.type.value, "status": item.status.value}
    if item.type is ItemType.FUNCTION_CALL:
        return body | {"call_id": item.call_id, "name": item.name, "arguments": item.arguments or ""}
    if item.type is ItemType.FUNCTION_CALL_OUTPUT:
        return body | {"call_id": item.call_id, "output": item.output}
    return body | {"role": item.role.value, "content": [content_object(part, dialect) for part in item.content]}


def part_object(part: ContentPart) -> dict:
    """A content part as ``response.content_part.*`` carry it (same in both dialects)."""
    if part.type is ContentType.OUTPUT_AUDIO:
        return {"type": PartType.AUDIO.value, "transcript": part.transcript or ""}
    return {"type": PartType.TEXT.value, "text": part.text or ""}


def usage_object(usage: Usage, dialect: Dialect = Dialect.GA) -> dict:
    """``image_tokens`` is GA's (the beta API had no pictures)."""
    input_details = {
        "text_tokens": usage.input_text_tokens,
        "audio_tokens": usage.input_audio_tokens,
        "image_tokens": usage.input_image_tokens,
        "cached_tokens": usage.cached_tokens,
    }
    if dialect is Dialect.BETA:
        del input_details["image_tokens"]
    return {
        "total_tokens": usage.input_tokens + usage.output_tokens,
        "input_tokens": usage.input_tokens,
        "output_tokens": usage.output_tokens,
        "input_token_details": input_details,
        "output_token_details": {
            "text_tokens": usage.output_text_tokens,
            "audio_tokens": usage.output_audio_tokens,
        },
    }


def response_object(r: ResponseSummary, dialect: Dialect) -> dict:
    body: dict = {
        "id": r.id,
        "object": "realtime.response",
        "status": r.state.value,
        "status_details": _status_details(r),
        "output": [item_object(item, dialect) for item in r.output],
        "conversation_id": r.conversation_id,
        "max_output_tokens": _max_tokens(r.max_output_tokens),
        "usage": usage_object(r.usage, dialect) if r.usage is not None else None,
        "metadata": r.metadata,
    }
    if dialect is Dialect.BETA:
        body["modalities"] = _modalities(r.modality, dialect)
        body["voice"] = r.voice
        body["output_audio_format"] = format_object(r.output_format, dialect)
    else:
        body["output_modalities"] = _modalities(r.modality, dialect)
        body["audio"] = {"output": {"format": format_object(r.output_format, dialect), "voice": r.voice}}
    return body


def _status_details(r: ResponseSummary) -> dict | None:
    if r.state is ResponseWireStatus.IN_PROGRESS:
        return None
    details: dict = {"type": r.state.value}
    if r.reason is not None:
        details["reason"] = r.reason.value
    if r.error is not None:
        details["error"] = r.error
    return details


# --- events -------------------------------------------------------------------------------------


class ServerEvents:
    """Builders of server events for one dialect; every event gets a fresh ``event_id``."""

    def __init__(self, dialect: Dialect, ids: IdGenerator) -> None:
        self.dialect = dialect
        self._ids = ids

    def _event(self, kind: ServerEvent, **fields: object) -> dict | None:
        name = server_event_name(kind, self.dialect)
        if name is None:
            return None
        return {"type": name, "event_id": self._ids.new(IdKind.EVENT), **fields}

    def error(self, payload: dict) -> dict | None:
        """``payload`` comes from :func:`realtime.errors.to_error_payload`."""
        return self._event(ServerEvent.ERROR, error=payload)

    def session_created(self, config: SessionConfig, *, session_id: str, model: str) -> dict | None:
        session = session_object(config, session_id=session_id, model=model, dialect=self.dialect)
        return self._event(ServerEvent.SESSION_CREATED, session=session)

    def session_updated(self, config: SessionConfig, *, session_id: str, model: str) -> dict | None:
        session = session_object(config, session_id=session_id, model=model, dialect=self.dialect)
        return self._event(ServerEvent.SESSION_UPDATED, session=session)

    def conversation_created(self, conversation_id: str) -> dict | None:
        conversation = {"id": conversation_id, "object": "realtime.conversation"}
        return self._event(ServerEvent.CONVERSATION_CREATED, conversation=conversation)

    def item_added(self, item: Item, previous_item_id: str | None) -> dict | None:
        item_body = item_object(item, self.dialect)
        return self._event(ServerEvent.ITEM_ADDED, previous_item_id=previous_item_id, item=item_body)

    def item_done(self, item: Item, previous_item_id: str | None) -> dict | None:
        item_body = item_object(item, self.dialect)
        return self._event(ServerEvent.ITEM_DONE, previous_item_id=previous_item_id, item=item_body)

    def item_retrieved(self, item: Item) -> dict | None:
        return self._event(ServerEvent.ITEM_RETRIEVED, item=item_object(item, self.dialect))

    def item_truncated(self, item_id: str, content_index: int, audio_end_ms: int) -> dict | None:
        return self._event(
            ServerEvent.ITEM_TRUNCATED, item_id=item_id, content_index=content_index, audio_end_ms=audio_end_ms
        )

    def item_deleted(self, item_id: str) -> dict | None:
        return self._event(ServerEvent.ITEM_DELETED, item_id=item_id)

    def input_audio_buffer_committed(self, item_id: str, previous_item_id: str | None) -> dict | None:
        return self._event(ServerEvent.INPUT_AUDIO_BUFFER_COMMITTED, previous_item_id=previous_item_id, item_id=item_id)

    def input_audio_buffer_cleared(self) -> dict | None:
        return self._event(ServerEvent.INPUT_AUDIO_BUFFER_CLEARED)

    def speech_started(self, audio_start_ms: int, item_id: str) -> dict | None:
        return self._event(ServerEvent.SPEECH_STARTED, audio_start_ms=audio_start_ms, item_id=item_id)

    def speech_stopped(self, audio_end_ms: int, item_id: str) -> dict | None:
        return self._event(ServerEvent.SPEECH_STOPPED, audio_end_ms=audio_end_ms, item_id=item_id)

    def timeout_triggered(self, audio_start_ms: int, audio_end_ms: int, item_id: str) -> dict | None:
        return self._event(
            ServerEvent.TIMEOUT_TRIGGERED, audio_start_ms=audio_start_ms, audio_end_ms=audio_end_ms, item_id=item_id
        )

    def response_created(self, response: ResponseSummary) -> dict | None:
        return self._event(ServerEvent.RESPONSE_CREATED, response=response_object(response, self.dialect))

    def response_done(self, response: ResponseSummary) -> dict | None:
        return self._event(ServerEvent.RESPONSE_DONE, response=response_object(response, self.dialect))

    def output_item_added(self, response_id: str, output_index: int, item: Item) -> dict | None:
        item_body = item_object(item, self.dialect)
        return self._event(
            ServerEvent.OUTPUT_ITEM_ADDED, response_id=response_id, output_index=output_index, item=item_body
        )

    def output_item_done(self, response_id: str, output_index: int, item: Item) -> dict | None:
        item_body = item_object(item, self.dialect)
        return self._event(
            ServerEvent.OUTPUT_ITEM_DONE, response_id=response_id, output_index=output_index, item=item_body
        )

    def content_part_added(self, ref: ContentRef, part: ContentPart) -> dict | None:
        return self._event(ServerEvent.CONTENT_PART_ADDED, **ref.fields(), part=part_object(part))

    def content_part_done(self, ref: ContentRef, part: ContentPart) -> dict | None:
        return self._event(ServerEvent.CONTENT_PART_DONE, **ref.fields(), part=part_object(part))

    def audio_delta(self, ref: ContentRef, audio_b64: str) -> dict | None:
        return self._event(ServerEvent.AUDIO_DELTA, **ref.fields(), delta=audio_b64)

    def audio_done(self, ref: ContentRef) -> dict | None:
        return self._event(ServerEvent.AUDIO_DONE, **ref.fields())

    def transcript_delta(self, ref: ContentRef, delta: str) -> dict | None:
        return self._event(ServerEvent.TRANSCRIPT_DELTA, **ref.fields(), delta=delta)

    def transcript_done(self, ref: ContentRef, transcript: str) -> dict | None:
        return self._event(ServerEvent.TRANSCRIPT_DONE, **ref.fields(), transcript=transcript)

    def text_delta(self, ref: ContentRef, delta: str) -> dict | None:
        return self._event(ServerEvent.TEXT_DELTA, **ref.fields(), delta=delta)

    def text_done(self, ref: ContentRef, text: str) -> dict | None:
        return self._event(ServerEvent.TEXT_DONE, **ref.fields(), text=text)

    def function_call_arguments_delta(self, response_id: str, output_index: int, item: Item, delta: str) -> dict | None:
        return self._event(
            ServerEvent.FUNCTION_CALL_ARGUMENTS_DELTA,
            response_id=response_id,
            item_id=item.id,
            output_index=output_index,
            call_id=item.call_id,
            delta=delta,
        )

    def function_call_arguments_done(self, response_id: str, output_index: int, item: Item) -> dict | None:
        """GA names the function here too; beta does not."""
        name = {"name": item.name} if self.dialect is Dialect.GA else {}
        return self._event(
            ServerEvent.FUNCTION_CALL_ARGUMENTS_DONE,
            response_id=response_id,
            item_id=item.id,
            output_index=output_index,
            call_id=item.call_id,
            **name,
            arguments=item.arguments,
        )

    def output_audio_buffer_started(self, response_id: str) -> dict | None:
        return self._event(ServerEvent.OUTPUT_AUDIO_BUFFER_STARTED, response_id=response_id)

    def output_audio_buffer_stopped(self, response_id: str) -> dict | None:
        return self._event(ServerEvent.OUTPUT_AUDIO_BUFFER_STOPPED, response_id=response_id)

    def output_audio_buffer_cleared(self, response_id: str) -> dict | None:
        return self._event(ServerEvent.OUTPUT_AUDIO_BUFFER_CLEARED, response_id=response_id)

    def input_transcription_delta(self, item_id: str, content_index: int, delta: str) -> dict | None:
        return self._event(
            ServerEvent.INPUT_TRANSCRIPTION_DELTA, item_id=item_id, content_index=content_index, delta=delta
        )

    def input_transcription_completed(
        self, item_id: str, content_index: int, transcript: str, usage: Usage
    ) -> dict | None:
        return self._event(
            ServerEvent.INPUT_TRANSCRIPTION_COMPLETED,
            item_id=item_id,
            content_index=content_index,
            transcript=transcript,
            usage=transcription_usage_object(usage),
        )

    def input_transcription_failed(self, item_id: str, content_index: int, error: dict) -> dict | None:
        """``error``: ``{"type", "code", "message", "param"}``."""
        return self._event(
            ServerEvent.INPUT_TRANSCRIPTION_FAILED, item_id=item_id, content_index=content_index, error=error
        )
