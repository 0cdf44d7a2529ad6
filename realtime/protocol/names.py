"""Event and content-type names of the OpenAI Realtime API, GA and beta: one table.

The session layer speaks in logical names (:class:`ServerEvent`, :class:`ContentType`); the
wire name for a client's dialect comes from :data:`SERVER_EVENT_NAMES` / :data:`CONTENT_TYPE_NAMES`
and nowhere else. A ``None`` wire name means the dialect has no such event: it is not sent.

Client event names are the same in both dialects.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass


class Dialect(enum.Enum):
    """Which version of the protocol a client speaks. Beta clients announce themselves with the
    ``OpenAI-Beta: realtime=v1`` header or the ``openai-beta.realtime-v1`` subprotocol."""

    GA = "ga"
    BETA = "beta"


@dataclass(frozen=True)
class WireName:
    ga: str | None
    beta: str | None

    def for_dialect(self, dialect: Dialect) -> str | None:
        return self.ga if dialect is Dialect.GA else self.beta


class ClientEventType(str, enum.Enum):
    SESSION_UPDATE = "session.update"
    INPUT_AUDIO_BUFFER_APPEND = "input_audio_buffer.append"
    INPUT_AUDIO_BUFFER_COMMIT = "input_audio_buffer.commit"
    INPUT_AUDIO_BUFFER_CLEAR = "input_audio_buffer.clear"
    CONVERSATION_ITEM_CREATE = "conversation.item.create"
    CONVERSATION_ITEM_RETRIEVE = "conversation.item.retrieve"
    CONVERSATION_ITEM_DELETE = "conversation.item.delete"
    CONVERSATION_ITEM_TRUNCATE = "conversation.item.truncate"
    RESPONSE_CREATE = "response.create"
    RESPONSE_CANCEL = "response.cancel"
    OUTPUT_AUDIO_BUFFER_CLEAR = "output_audio_buffer.clear"


class ServerEvent(enum.Enum):
    """Logical server events. The value is only a label; wire names come from the table."""

    ERROR = "error"
    SESSION_CREATED = "session.created"
    SESSION_UPDATED = "session.updated"
    CONVERSATION_CREATED = "conversation.created"
    ITEM_ADDED = "item.added"
    ITEM_DONE = "item.done"
    ITEM_RETRIEVED = "item.retrieved"
    ITEM_TRUNCATED = "item.truncated"
    ITEM_DELETED = "item.deleted"
    INPUT_AUDIO_BUFFER_COMMITTED = "input_audio_buffer.committed"
    INPUT_AUDIO_BUFFER_CLEARED = "input_audio_buffer.cleared"
    SPEECH_STARTED = "speech_started"
    SPEECH_STOPPED = "speech_stopped"
    TIMEOUT_TRIGGERED = "timeout_triggered"
    RESPONSE_CREATED = "response.created"
    RESPONSE_DONE = "response.done"
    OUTPUT_ITEM_ADDED = "output_item.added"
    OUTPUT_ITEM_DONE = "output_item.done"
    CONTENT_PART_ADDED = "content_part.added"
    CONTENT_PART_DONE = "content_part.done"
    AUDIO_DELTA = "audio.delta"
    AUDIO_DONE = "audio.done"
    TRANSCRIPT_DELTA = "transcript.delta"
    TRANSCRIPT_DONE = "transcript.done"
    TEXT_DELTA = "text.delta"
    TEXT_DONE = "text.done"
    FUNCTION_CALL_ARGUMENTS_DELTA = "function_call_arguments.delta"
    FUNCTION_CALL_ARGUMENTS_DONE = "function_call_arguments.done"
    OUTPUT_AUDIO_BUFFER_STARTED = "output_audio_buffer.started"
    OUTPUT_AUDIO_BUFFER_STOPPED = "output_audio_buffer.stopped"
    OUTPUT_AUDIO_BUFFER_CLEARED = "output_audio_buffer.cleared"
    INPUT_TRANSCRIPTION_DELTA = "input_transcription.delta"
    INPUT_TRANSCRIPTION_COMPLETED = "input_transcription.completed"
    INPUT_TRANSCRIPTION_FAILED = "input_transcription.failed"


def _same(name: str) -> WireName:
    return WireName(name, name)


SERVER_EVENT_NAMES: dict[ServerEvent, WireName] = {
    ServerEvent.ERROR: _same("error"),
    ServerEvent.SESSION_CREATED: _same("session.created"),
    ServerEvent.SESSION_UPDATED: _same("session.updated"),
    # GA dropped conversation.created; beta clients get it right after session.created.
    ServerEvent.CONVERSATION_CREATED: WireName(None, "conversation.created"),
    # GA announces an item twice (added, then done when complete); beta once, when created.
    ServerEvent.ITEM_ADDED: WireName("conversation.item.added", "conversation.item.created"),
    ServerEvent.ITEM_DONE: WireName("conversation.item.done", None),
    ServerEvent.ITEM_RETRIEVED: _same("conversation.item.retrieved"),
    ServerEvent.ITEM_TRUNCATED: _same("conversation.item.truncated"),
    ServerEvent.ITEM_DELETED: _same("conversation.item.deleted"),
    ServerEvent.INPUT_AUDIO_BUFFER_COMMITTED: _same("input_audio_buffer.committed"),
    ServerEvent.INPUT_AUDIO_BUFFER_CLEARED: _same("input_audio_buffer.cleared"),
    ServerEvent.SPEECH_STARTED: _same("input_audio_buffer.speech_started"),
    ServerEvent.SPEECH_STOPPED: _same("input_audio_buffer.speech_stopped"),
    # The idle timeout (server_vad.idle_timeout_ms) is a GA addition.
    ServerEvent.TIMEOUT_TRIGGERED: WireName("input_audio_buffer.timeout_triggered", None),
    ServerEvent.RESPONSE_CREATED: _same("response.created"),
    ServerEvent.RESPONSE_DONE: _same("response.done"),
    ServerEvent.OUTPUT_ITEM_ADDED: _same("response.output_item.added"),
    ServerEvent.OUTPUT_ITEM_DONE: _same("response.output_item.done"),
    ServerEvent.CONTENT_PART_ADDED: _same("response.content_part.added"),
    ServerEvent.CONTENT_PART_DONE: _same("response.content_part.done"),
    ServerEvent.AUDIO_DELTA: WireName("response.output_audio.delta", "response.audio.delta"),
    ServerEvent.AUDIO_DONE: WireName("response.output_audio.done", "response.audio.done"),
    ServerEvent.TRANSCRIPT_DELTA: WireName("response.output_audio_transcript.delta", "response.audio_transcript.delta"),
    ServerEvent.TRANSCRIPT_DONE: WireName("response.output_audio_transcript.done", "response.audio_transcript.done"),
    ServerEvent.TEXT_DELTA: WireName("response.output_text.delta", "response.text.delta"),
    ServerEvent.TEXT_DONE: WireName("response.output_text.done", "response.text.done"),
    ServerEvent.FUNCTION_CALL_ARGUMENTS_DELTA: _same("response.function_call_arguments.delta"),
    ServerEvent.FUNCTION_CALL_ARGUMENTS_DONE: _same("response.function_call_arguments.done"),
    ServerEvent.OUTPUT_AUDIO_BUFFER_STARTED: _same("output_audio_buffer.started"),
    ServerEvent.OUTPUT_AUDIO_BUFFER_STOPPED: _same("output_audio_buffer.stopped"),
    ServerEvent.OUTPUT_AUDIO_BUFFER_CLEARED: _same("output_audio_buffer.cleared"),
    ServerEvent.INPUT_TRANSCRIPTION_DELTA: _same("conversation.item.input_audio_transcription.delta"),
    ServerEvent.INPUT_TRANSCRIPTION_COMPLETED: _same("conversation.item.input_audio_transcription.completed"),
    ServerEvent.INPUT_TRANSCRIPTION_FAILED: _same("conversation.item.input_audio_transcription.failed"),
}


def server_event_name(event: ServerEvent, dialect: Dialect) -> str | None:
    """The wire ``type`` of ``event`` for ``dialect``; ``None`` when that dialect has no such event."""
    return SERVER_EVENT_NAMES[event].for_dialect(dialect)


class ContentType(enum.Enum):
    """Kinds of content in a conversation item (``item.content[i].type``)."""

    INPUT_TEXT = "input_text"
    INPUT_AUDIO = "input_audio"
    INPUT_IMAGE = "input_image"
    OUTPUT_TEXT = "output_text"
    OUTPUT_AUDIO = "output_audio"


CONTENT_TYPE_NAMES: dict[ContentType, WireName] = {
    ContentType.INPUT_TEXT: _same("input_text"),
    ContentType.INPUT_AUDIO: _same("input_audio"),
    ContentType.INPUT_IMAGE: _same("input_image"),
    ContentType.OUTPUT_TEXT: WireName("output_text", "text"),
    ContentType.OUTPUT_AUDIO: WireName("output_audio", "audio"),
}


def content_type_name(content: ContentType, dialect: Dialect) -> str:
    name = CONTENT_TYPE_NAMES[content].for_dialect(dialect)
    assert name is not None, f"every content type has a name in every dialect ({content})"
    return name


def parse_content_type(name: str) -> ContentType | None:
    """The content type called ``name`` in either dialect (clients mix them freely)."""
    for content, wire in CONTENT_TYPE_NAMES.items():
        if name in (wire.ga, wire.beta):
            return content
    return None


class PartType(str, enum.Enum):
    """``response.content_part.*`` part types: the same in both dialects."""

    TEXT = "text"
    AUDIO = "audio"
