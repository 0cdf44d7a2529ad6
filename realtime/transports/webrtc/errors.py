"""The errors a WebRTC call can end or be refused with, wherever its media run."""

from __future__ import annotations

from realtime.errors import ErrorType, RealtimeError
from realtime.protocol.codes import ErrorCode


class WebRTCUnavailable(RealtimeError):
    """The server cannot take calls now (shutting down, no media worker running, a worker not answering)."""

    type = ErrorType.SERVER
    code = ErrorCode.SERVER_ERROR


class MediaBacklog(RealtimeError):
    """The session fell too far behind its microphone audio."""

    type = ErrorType.SERVER
    code = ErrorCode.SERVER_ERROR


class MediaWorkerLost(RealtimeError):
    """The media worker carrying the call stopped."""

    type = ErrorType.SERVER
    code = ErrorCode.SERVER_ERROR


def answer_refused(message: str, param: str | None) -> RealtimeError:
    """Why an offer was not answered: ``param`` set (``sdp``) is the client's fault (HTTP 400, ``invalid_value``),
    None the server's (:class:`WebRTCUnavailable`)."""
    if param is not None:
        return RealtimeError(message, code=ErrorCode.INVALID_VALUE, param=param)
    return WebRTCUnavailable(message)
