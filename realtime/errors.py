"""The session layer's error hierarchy and its single mapping to protocol ``error`` events.

Every problem a client can cause is a :class:`RealtimeError` with a stable wire ``code``; engine
errors (:class:`pipeline.errors.PipelineError`) are translated by :func:`to_error_payload`, the one
place where exceptions become ``{"type", "code", "message", "param", "event_id"}``.
"""

from __future__ import annotations

import enum

from pipeline.errors import PipelineError


class ErrorType(str, enum.Enum):
    """The ``error.type`` values of the OpenAI Realtime API."""

    INVALID_REQUEST = "invalid_request_error"
    SERVER = "server_error"
    AUTHENTICATION = "authentication_error"
    RATE_LIMIT = "rate_limit_error"


class RealtimeError(Exception):
    code = "invalid_request"
    type = ErrorType.INVALID_REQUEST

    def __init__(self, message: str, *, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        if code is not None:
            self.code = code


class InvalidAudioData(RealtimeError):
    """Undecodable base64, odd-length pcm16, or otherwise malformed audio bytes."""

    code = "invalid_audio"


class LimitExceeded(RealtimeError):
    type = ErrorType.RATE_LIMIT
    code = "limit_exceeded"


class AuthError(RealtimeError):
    type = ErrorType.AUTHENTICATION
    code = "invalid_api_key"


def to_error_payload(exc: Exception, *, event_id: str | None = None) -> dict:
    """Map any exception to the body of a protocol ``error`` event.

    Unexpected exceptions become a generic ``server_error`` without internals in the message
    (the caller logs the traceback)."""
    if isinstance(exc, RealtimeError):
        etype, code, message, param = exc.type.value, exc.code, exc.message, exc.param
    elif isinstance(exc, PipelineError):
        invalid = not exc.code.startswith("engine")
        etype = ErrorType.INVALID_REQUEST.value if invalid else ErrorType.SERVER.value
        code, message, param = exc.code, exc.message, exc.param
    else:
        etype, code, message, param = ErrorType.SERVER.value, "server_error", "internal server error", None
    return {"type": etype, "code": code, "message": message, "param": param, "event_id": event_id}
