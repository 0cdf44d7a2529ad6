"""``session.update``, field by field: a refused field refuses only itself.

The rule: each field of ``session`` that is invalid or not supported is answered by its own ``error`` event (its
``param`` is the offending path, its ``event_id`` the client event's), and is left out; the other fields apply, and
``session.updated`` shows the resulting session. A problem outside ``session`` (the event's ``type``, a ``session``
that is not an object) refuses the whole event, as for any other event.

A *field* is a direct member of ``session`` (``instructions``, ``voice``, ``turn_detection``…), except under
``audio``, where it is a member of ``audio.input`` or ``audio.output`` (``audio.input.turn_detection``,
``audio.output.voice``…): a bad ``threshold`` refuses the whole ``turn_detection`` it is part of, never a part of it
(the settings of one turn detector are applied together or not at all).
"""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from realtime.errors import ProtocolError
from realtime.protocol import wire
from realtime.protocol.validation import from_errors, from_validation_error

_MAX_PASSES = 3
"""Validation passes: removing a refused field cannot uncover new problems of the others, so the second pass
succeeds; the bound only guards against a validator that breaks that."""

Loc = tuple[str | int, ...]


def validate_session_update(
    body: dict[str, Any], event_id: str | None
) -> tuple[wire.SessionUpdateModel, tuple[ProtocolError, ...]]:
    """The event without its refused fields, and one error per refused field (in the order pydantic met them).
    Raises :class:`ProtocolError` when the event itself is refused."""
    refused: list[ProtocolError] = []
    for _ in range(_MAX_PASSES):
        try:
            return wire.SessionUpdateModel.model_validate(body), tuple(refused)
        except ValidationError as exc:
            fields = _by_field(exc)
            if fields is None:
                raise from_validation_error(exc, event_id) from None
            for loc, problems in fields.items():
                refused.append(from_errors(problems, event_id))
                body = _without(body, loc)
    raise ProtocolError(f"session.update could not be validated in {_MAX_PASSES} passes", event_id=event_id)


def field_of(loc: Loc) -> Loc | None:
    """The field (see the module docstring) that the problem at ``loc`` refuses; None when it refuses the event."""
    if len(loc) < 2 or loc[0] != "session":
        return None
    if loc[1] == "audio" and len(loc) >= 3:
        return loc[:4] if loc[2] in ("input", "output") else loc[:3]
    return loc[:2]


def _by_field(exc: ValidationError) -> dict[Loc, list] | None:
    """The problems grouped by the field they refuse, or None if one of them refuses the whole event."""
    fields: dict[Loc, list] = {}
    for problem in exc.errors(include_url=False):
        loc = field_of(tuple(problem["loc"]))
        if loc is None:
            return None
        fields.setdefault(loc, []).append(problem)
    return fields


def _without(body: dict, loc: Loc) -> dict:
    """A copy of ``body`` without the member at ``loc`` (the objects on the way are copied, nothing else: a message
    may nest deeper than a deep copy can recurse). Its parents are objects: a problem inside a non-object is
    reported at it."""
    head, rest = loc[0], loc[1:]
    if not rest:
        return {key: value for key, value in body.items() if key != head}
    return body | {head: _without(body[head], rest)}
