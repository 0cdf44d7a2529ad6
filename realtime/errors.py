"""The session layer's error hierarchy and its single mapping to protocol ``error`` events.

Every problem a client can cause is a :class:`RealtimeError` with a stable wire ``code`` (named in
:mod:`realtime.protocol.codes`); engine errors (:class:`pipeline.errors.PipelineError`) are
translated by :func:`to_error_payload`, the one place where exceptions become
``{"type", "code", "message", "param", "event_id"}``.
"""

from __future__ import annotations

import enum

from pipeline.errors import EngineProcessError, PipelineError
from realtime.protocol.codes import ErrorCode


class ErrorType(str, enum.Enum):
    """The ``error.type`` values of the OpenAI Realtime API."""

    INVALID_REQUEST = "invalid_request_error"
    SERVER = "server_error"
    AUTHENTICATION = "authentication_error"
    RATE_LIMIT = "rate_limit_error"


class RealtimeError(Exception):
    """A client-caused problem. ``param`` is the dotted path of the offending field
    (``session.audio.input.format.type``) when there is one; ``event_id`` the id of the client
    event that caused it, when the raiser knows it (parsers do; the session passes it along);
    ``event_type`` that event's ``type``, when it is a string (for the log only: not sent)."""

    code: str = ErrorCode.INVALID_REQUEST
    type = ErrorType.INVALID_REQUEST

    def __init__(
        self,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        event_id: str | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        self.event_id = event_id
        self.event_type: str | None = None
        if code is not None:
            self.code = code


class ProtocolError(RealtimeError):
    """A client message that is not a valid event: bad JSON, unknown type, missing or invalid
    field. The ``code`` says which (``ErrorCode.INVALID_JSON``, ``UNKNOWN_PARAMETER``…)."""

    code = ErrorCode.INVALID_EVENT


class InvalidAudioData(RealtimeError):
    """Undecodable base64, odd-length pcm16, or otherwise malformed audio bytes."""

    code = ErrorCode.INVALID_AUDIO


class LimitExceeded(RealtimeError):
    type = ErrorType.RATE_LIMIT
    code = ErrorCode.LIMIT_EXCEEDED


class AuthError(RealtimeError):
    type = ErrorType.AUTHENTICATION
    code = ErrorCode.INVALID_API_KEY


def to_error_payload(exc: Exception, *, event_id: str | None = None) -> dict:
    """Map any exception to the body of a protocol ``error`` event.

    ``event_id`` (the client event being handled) wins over the one the exception carries.
    Unexpected exceptions become a generic ``server_error`` without internals in the message
    (the caller logs the traceback); so does an unexpected exception raised in the engine's child process
    (:class:`~pipeline.errors.EngineProcessError`), whose message names internal types."""
    if isinstance(exc, RealtimeError):
        etype, code, message, param = exc.type.value, str(exc.code), exc.message, exc.param
        event_id = event_id if event_id is not None else exc.event_id
    elif isinstance(exc, PipelineError) and not isinstance(exc, EngineProcessError):
        invalid = not exc.code.startswith("engine")
        etype = ErrorType.INVALID_REQUEST.value if invalid else ErrorType.SERVER.value
        code, message, param = exc.code, exc.message, exc.param
    else:
        etype, code = ErrorType.SERVER.value, ErrorCode.SERVER_ERROR.value
        message, param = "internal server error", None
    return {"type": etype, "code": code, "message": message, "param": param, "event_id": event_id}
