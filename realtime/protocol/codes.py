"""Wire error codes (the ``error.code`` field) and response status reasons, named once.

Where the OpenAI Realtime API has a code for a situation we use its spelling
(``conversation_already_has_active_response``, ``input_audio_buffer_commit_empty``…); the rest are
ours, in the same snake_case style. Clients match on these strings: never change one.
"""

from __future__ import annotations

import enum


class ErrorCode(enum.StrEnum):
    # Malformed client messages (realtime.protocol.client).
    INVALID_JSON = "invalid_json"
    INVALID_EVENT = "invalid_event"
    UNKNOWN_EVENT_TYPE = "unknown_event_type"
    MISSING_REQUIRED_PARAMETER = "missing_required_parameter"
    UNKNOWN_PARAMETER = "unknown_parameter"
    INVALID_TYPE = "invalid_type"
    INVALID_VALUE = "invalid_value"
    UNSUPPORTED_VALUE = "unsupported_value"
    """A value the OpenAI API accepts but this server does not implement."""
    INVALID_BASE64 = "invalid_base64"
    INVALID_AUDIO = "invalid_audio"
    INVALID_IMAGE_URL = "invalid_image_url"
    """An ``input_image`` whose ``image_url`` is not a base64 data URI (realtime.media.images)."""
    UNSUPPORTED_IMAGE_FORMAT = "unsupported_image_format"
    """A picture that is not PNG or JPEG (by its media type or by its bytes)."""
    IMAGE_TOO_LARGE = "image_too_large"
    """A picture over the server's byte or pixel limit (``ServerConfig.image_limits``)."""
    INVALID_IMAGE = "invalid_image"
    """A picture that cannot be decoded (corrupt) or has no pixels; the engine's ``InvalidImageError`` too."""
    UNSUPPORTED_INPUT = "unsupported_input"
    """Pictures for a model without a vision tower (the engine's ``UnsupportedInputError``)."""

    # Requests that do not fit the session's state (realtime.session).
    UNKNOWN_VOICE = "unknown_voice"
    INPUT_AUDIO_BUFFER_COMMIT_EMPTY = "input_audio_buffer_commit_empty"
    INPUT_AUDIO_BUFFER_FULL = "input_audio_buffer_full"
    CONVERSATION_ALREADY_HAS_ACTIVE_RESPONSE = "conversation_already_has_active_response"
    CONVERSATION_BUSY = "conversation_busy"
    RESPONSE_CANCEL_NOT_ACTIVE = "response_cancel_not_active"
    ITEM_NOT_FOUND = "item_not_found"
    DUPLICATE_ITEM_ID = "duplicate_item_id"
    ITEM_IN_PROGRESS = "item_in_progress"
    UNKNOWN_CALL_ID = "unknown_call_id"
    """A ``function_call_output`` whose ``call_id`` is that of no ``function_call`` item in the conversation."""
    OUTPUT_AUDIO_BUFFER_EMPTY = "output_audio_buffer_empty"
    TRANSCRIPTION_BACKLOG = "transcription_backlog"
    """Too many input transcriptions of the session wait for their turn (``...input_audio_transcription.failed``)."""
    TRANSCRIPTION_UNAVAILABLE = "transcription_unavailable"
    """Input transcription was turned on while the committed message was being spoken: its audio was not kept."""
    UNSUPPORTED_EVENT = "unsupported_event"
    """An event the OpenAI API defines that this server or transport does not serve
    (``transcription_session.update``; ``output_audio_buffer.clear`` over a WebSocket)."""

    # Generic (realtime.errors).
    INVALID_REQUEST = "invalid_request"
    LIMIT_EXCEEDED = "limit_exceeded"
    INVALID_API_KEY = "invalid_api_key"
    SERVER_ERROR = "server_error"


class StatusReason(str, enum.Enum):
    """``response.status_details.reason`` values of the OpenAI Realtime API."""

    TURN_DETECTED = "turn_detected"
    CLIENT_CANCELLED = "client_cancelled"
    MAX_OUTPUT_TOKENS = "max_output_tokens"
    CONTENT_FILTER = "content_filter"

    @classmethod
    def from_engine(cls, reason: str | None) -> StatusReason | None:
        """The wire reason for an engine ``ResponseDone.reason``; reasons the protocol has no
        name for (``error``, ``client_disconnected``…) have none (the status says enough)."""
        return next((r for r in cls if r.value == reason), None)
