"""The server's log of the ``error`` events it sends to clients: one line per event, so that an operator
sees in the log why a client's request or setup failed.

The line names the session, the wire ``code``, the client event the error answers (its ``type`` and
``event_id``, ``-`` where there is none: a message that is not JSON, a refused oversized message, an engine
failure), the ``param`` and the message the client got. Client mistakes (``invalid_request_error``,
``rate_limit_error``, ``authentication_error``) are logged at INFO, which the default log level shows;
``server_error`` at WARNING (the traceback of an unexpected exception is logged where it was caught).

Callers: :class:`realtime.session.Session` (every error it sends, one method) and the transports'
message gates (refusals that never reach the session).
"""

from __future__ import annotations

import logging

from realtime.errors import ErrorType

logger = logging.getLogger(__name__)


def log_error_event(error: dict, *, session_id: str | None, answers: str | None) -> None:
    """Log one ``error`` event's payload (:func:`realtime.errors.to_error_payload`); ``answers`` is the
    type of the client event it answers, when known."""
    level = logging.WARNING if error.get("type") == ErrorType.SERVER.value else logging.INFO
    logger.log(
        level,
        "session %s: error %s answering %s (event_id %s, param %s): %s",
        session_id or "-",
        error.get("code"),
        answers or "-",
        error.get("event_id") or "-",
        error.get("param") or "-",
        error.get("message"),
    )
