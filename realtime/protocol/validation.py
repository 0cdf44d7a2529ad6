"""Validation errors of client events (pydantic, :mod:`.wire`) → one :class:`ProtocolError` in plain words.

A refused event gets one of two kinds of message:

- a **refusal** (code ``unsupported_value``): the field belongs to a feature the OpenAI Realtime API
  defines and this server does not implement (MCP tools, out-of-band responses,
  item references…); the message says what is not supported and what to send instead (:data:`REFUSALS`);
- a **plain description** of any other invalid field: ``missing_required_parameter``,
  ``unknown_parameter``, ``invalid_type`` ("must be an integer, not a string") or ``invalid_value``
  ("must be 'text' or 'audio', not 'video'"), never pydantic's own phrasing.

``param`` is always the dotted path of the client's field (``session.audio.input.turn_detection.type``).
When an event has several problems, a refusal is reported first (it is the one the client must act on),
else the first problem pydantic found. (``session.update`` reports each refused field on its own:
:mod:`.session_update`.)
"""

from __future__ import annotations

import fnmatch
import json
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from realtime.errors import ProtocolError
from realtime.protocol.codes import ErrorCode


@dataclass(frozen=True)
class RefusedFeature:
    """A feature of the OpenAI API this server refuses. ``pattern`` matches the dotted ``param``
    (:func:`fnmatch.fnmatchcase`: ``*`` spans any text); ``values``: the API's values that name the
    feature (others get the plain ``invalid_value`` message), or ``None`` for any value that fails
    validation. ``message`` may use ``{value}`` (the client's value, quoted) and ``{param}``."""

    pattern: str
    message: str
    values: frozenset[str] | None = None

    def matches(self, param: str, value: Any) -> bool:
        if not fnmatch.fnmatchcase(param, self.pattern):
            return False
        return self.values is None or (isinstance(value, str) and value in self.values)


REFUSALS = (
    RefusedFeature(
        "*.tools.*.type",
        "tool type {value} is not supported: this server runs function tools only; send 'function' tools",
        frozenset({"mcp"}),
    ),
    RefusedFeature(
        "session.prompt",
        "prompt templates are not supported: send the prompt as 'session.instructions'; send null, or leave "
        "'session.prompt' out",
    ),
    RefusedFeature(
        "*.speed",
        "output audio speed {value} is not supported: the voice speaks at 1.0; leave '{param}' out, or send 1.0",
    ),
    RefusedFeature(
        "*format.rate",
        "sample rate {value} is not supported: audio/pcm is 24000 Hz here; send 24000, or leave '{param}' out",
    ),
    RefusedFeature(
        "session.type",
        "session type {value} is not supported: this server runs 'realtime' (conversation) sessions only; "
        "send 'realtime', or leave 'session.type' out",
        frozenset({"transcription"}),
    ),
    RefusedFeature(
        "response.conversation",
        "out-of-band responses (conversation {value}) are not supported: every response joins the conversation; "
        "send 'auto', or leave 'response.conversation' out",
    ),
    RefusedFeature(
        "response.input",
        "out-of-band responses ('response.input') are not supported: a response answers the conversation; "
        "add items with conversation.item.create and leave 'response.input' out",
    ),
    RefusedFeature(
        "item.type",
        "item type {value} is not supported: this server has no MCP tools; create 'message', 'function_call' or "
        "'function_call_output' items",
        frozenset({"mcp_approval_response", "mcp_call", "mcp_list_tools", "mcp_approval_request"}),
    ),
    RefusedFeature(
        "item.content.*.type",
        "content type {value} is not supported: send 'input_text', 'input_image' or 'input_audio' parts (user), "
        "'input_text' (system) or 'output_text' (assistant)",
        frozenset({"output_audio", "audio", "item_reference"}),
    ),
)


def from_validation_error(exc: ValidationError, event_id: str | None) -> ProtocolError:
    """The event's problem (a refusal first, else the first one found) as a :class:`ProtocolError`."""
    return from_errors(exc.errors(include_url=False), event_id)


def from_errors(problems: list, event_id: str | None) -> ProtocolError:
    """:func:`from_validation_error` over some of a ``ValidationError``'s ``errors()`` (at least one)."""
    errors = [(_param(err), err) for err in problems]
    for param, err in errors:
        refusal = next((r for r in REFUSALS if r.matches(param, err.get("input"))), None)
        if refusal is not None:
            message = refusal.message.format(value=_show(err.get("input")), param=param)
            return ProtocolError(message, code=ErrorCode.UNSUPPORTED_VALUE, param=param, event_id=event_id)
    param, err = errors[0]
    code, message = _describe(param, err)
    return ProtocolError(message, code=code, param=param or None, event_id=event_id)


def _param(err: dict) -> str:
    return ".".join(str(part) for part in err["loc"])


_EXPECTED_TYPE = {
    "string_type": "a string",
    "int_type": "an integer",
    "float_type": "a number",
    "bool_type": "a boolean (true or false)",
    "list_type": "an array",
    "dict_type": "an object",
    "model_type": "an object",
    "model_attributes_type": "an object",
}

_BOUND = {
    "greater_than_equal": ("ge", "at least"),
    "greater_than": ("gt", "greater than"),
    "less_than_equal": ("le", "at most"),
    "less_than": ("lt", "less than"),
}


def _describe(param: str, err: dict) -> tuple[ErrorCode, str]:
    """The code and a plain message for one validation problem that is not a refusal."""
    kind, ctx, value = err["type"], err.get("ctx", {}), err.get("input")
    if kind == "missing":
        return ErrorCode.MISSING_REQUIRED_PARAMETER, f"missing required parameter '{param}'"
    if kind == "extra_forbidden":
        return ErrorCode.UNKNOWN_PARAMETER, f"unknown parameter '{param}'"
    if kind in _EXPECTED_TYPE:
        return ErrorCode.INVALID_TYPE, f"'{param}' must be {_EXPECTED_TYPE[kind]}, not {_json_kind(value)}"
    if kind == "literal_error":
        return ErrorCode.INVALID_VALUE, f"'{param}' must be {ctx['expected']}, not {_show(value)}"
    if kind == "none_required":
        return ErrorCode.INVALID_VALUE, f"'{param}' must be null (or left out), not {_show(value)}"
    if kind in _BOUND:
        key, words = _BOUND[kind]
        return ErrorCode.INVALID_VALUE, f"'{param}' must be {words} {ctx[key]}, not {_show(value)}"
    if kind in ("too_short", "too_long", "string_too_short", "string_too_long"):
        return ErrorCode.INVALID_VALUE, f"'{param}' {_length_rule(kind, ctx)}"
    if kind == "value_error":
        return ErrorCode.INVALID_VALUE, f"'{param}' {ctx['error']}"
    return ErrorCode.INVALID_VALUE, f"invalid value for '{param}': {err['msg']}"


def _length_rule(kind: str, ctx: dict) -> str:
    bound, words = (ctx["min_length"], "at least") if kind.endswith("too_short") else (ctx["max_length"], "at most")
    unit = "character" if kind.startswith("string") else "item"
    return f"must have {words} {bound} {unit}{'' if bound == 1 else 's'}"


def _json_kind(value: Any) -> str:
    """The JSON type of a decoded value, as a client would name it."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return "a string"
    return "an array" if isinstance(value, list) else "an object"


def _show(value: Any, limit: int = 60) -> str:
    """A short quoted rendering of a client's value for a message."""
    text = f"'{value}'" if isinstance(value, str) else json.dumps(value, default=str)
    return text if len(text) <= limit else text[: limit - 3] + "..."
