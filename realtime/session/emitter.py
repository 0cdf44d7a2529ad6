"""The sink every part of a :class:`~realtime.session.Session` emits its actions into, and the two read-only views
the parts share (:class:`ConfigView`, :class:`AudioClock`).

:class:`Emitter` keeps the actions of one input in the order they were emitted; the session drains it once per input.
Two contexts change where an action goes: :meth:`Emitter.client_event` stamps the engine commands emitted while a
client event is handled with its ``event_id``, and :meth:`Emitter.holding` diverts the actions that reach the client
(:data:`~realtime.session.commands._CLIENT_ACTIONS`) into a list instead (a preemptive reply's held events); engine
commands always go out.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Protocol

from realtime.errors import to_error_payload
from realtime.observe.error_log import log_error_event
from realtime.protocol.model import SessionConfig
from realtime.protocol.server import ServerEvents
from realtime.session.commands import _CLIENT_ACTIONS, Action, Send, _Command


class ConfigView(Protocol):
    """The session's current configuration (what ``session.update`` last set)."""

    @property
    def config(self) -> SessionConfig: ...


class AudioClock(Protocol):
    """The session's audio clock: all input audio ever appended, in ms (the turn detector's clock too)."""

    @property
    def clock_ms(self) -> float: ...


class Emitter:
    """Collects the actions the parts emit, in order. Not thread-safe (the session is not)."""

    def __init__(self, events: ServerEvents, session_id: str) -> None:
        self._events = events
        self._session_id = session_id
        self._out: list[Action] = []
        self._hold: list[Action] | None = None
        self._event_id: str | None = None

    @property
    def event_id(self) -> str | None:
        """The ``event_id`` of the client event being handled (None outside :meth:`client_event`)."""
        return self._event_id

    def emit(self, action: Action) -> None:
        if self._event_id is not None and isinstance(action, _Command):
            action = dataclasses.replace(action, event_id=self._event_id)
        if self._hold is not None and isinstance(action, _CLIENT_ACTIONS):
            self._hold.append(action)
        else:
            self._out.append(action)

    def send(self, event: dict | None) -> None:
        """Send a server event; None (the client's dialect has no such event) sends nothing."""
        if event is not None:
            self.emit(Send(event))

    def release(self, actions: Iterable[Action]) -> None:
        """Put actions held earlier out as they are (already stamped; never held again)."""
        self._out.extend(actions)

    def error(self, exc: Exception, event_id: str | None = None, answers: str | None = None) -> None:
        """Send (and log) the ``error`` event for ``exc``: every error event of the session comes from here.
        ``answers``: the type of the client event it answers, for the log. (An error of a preemptive reply that is
        then withdrawn unseen is logged but never reaches the client.)"""
        payload = to_error_payload(exc, event_id=event_id)
        log_error_event(payload, session_id=self._session_id, answers=answers)
        self.send(self._events.error(payload))

    @contextmanager
    def client_event(self, event_id: str | None) -> Iterator[None]:
        """Engine commands emitted inside carry ``event_id`` (their failure's ``error`` event answers it)."""
        self._event_id = event_id
        try:
            yield
        finally:
            self._event_id = None

    @contextmanager
    def holding(self, into: list[Action]) -> Iterator[None]:
        """Actions that reach the client, emitted inside, are appended to ``into`` instead of going out."""
        self._hold = into
        try:
            yield
        finally:
            self._hold = None

    def drain(self) -> list[Action]:
        """The actions emitted since the last drain, in order."""
        out, self._out = self._out, []
        return out
