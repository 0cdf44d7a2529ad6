"""What a :class:`~realtime.runner.SessionRunner` is plugged into: the transport and the media sink (the audio
decoder's protocol is :mod:`realtime.media.audio`'s, the speech detector's :mod:`realtime.turns.detection`'s); why a
session ended; the names of its tasks; how its parts spawn tasks and hand actions back; the open spoken message."""

from __future__ import annotations

import asyncio
import enum
from collections.abc import AsyncIterator, Callable, Coroutine
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from pipeline.api import AudioInputHandle
from realtime.protocol.client import InputAudioAppend
from realtime.session import Action

DISCONNECT_REASON = "client_disconnected"
"""Cancel reason given to the engine for a response whose client went away."""

SESSION_TASK_PREFIX = "omni-session:"
"""Name prefix of every asyncio task a session owns (runner loops, response pumps, the
transports' per-session tasks, the server's supervisor)."""


def session_task_name(session_id: str, role: str) -> str:
    """The name of a task of session ``session_id`` doing ``role`` (``reader``, ``pump``…)."""
    return f"{SESSION_TASK_PREFIX}{session_id}:{role}"


def live_session_tasks() -> int:
    """Session tasks (named by :func:`session_task_name`) not yet done in the running event loop.
    Zero once every session has ended: anything else is a leaked task."""
    return sum(1 for task in asyncio.all_tasks() if task.get_name().startswith(SESSION_TASK_PREFIX))


class SessionEnd(enum.Enum):
    """Why a session stopped (the WebSocket endpoint maps each to a close code)."""

    CLIENT_LEFT = "client_left"
    """The client closed the connection, or it broke."""
    CLIENT_NOT_READING = "client_not_reading"
    """The client stopped reading its events (:class:`ClientNotReading`)."""
    FAILED = "failed"
    """A task of the session failed unexpectedly (a bug), or the engine refused the conversation."""
    CANCELLED = "cancelled"
    """:meth:`SessionRunner.run` was cancelled: the server is shutting down."""
    ENGINE_FAILED = "engine_failed"
    """The engine serving the session failed (:meth:`SessionRunner.end_for`): its conversation is gone."""


Spawn = Callable[[Coroutine[Any, Any, None], str], "asyncio.Task[None]"]
"""``spawn(coro, role)``: start ``coro`` as a task of the session, named for ``role`` (:func:`session_task_name`). The
runner owns every such task: a failure ends the session, and the session's end cancels it."""

Dispatch = Callable[[list[Action]], None]
"""``dispatch(actions)``: execute the session's actions in order (the runner's); never blocks."""


# --- what the runner is plugged into ------------------------------------------------------------


class TransportClosed(Exception):
    """Raised by :meth:`Transport.send` when the client is gone."""


class Transport(Protocol):
    """One client's message channel (a WebSocket, a WebRTC data channel…).

    Iterating it yields the client's text messages and ends when the client disconnects; a transport
    that makes client events itself (a WebRTC call's microphone audio) may yield them already parsed,
    as :class:`~realtime.protocol.client.InputAudioAppend` events, which skip the JSON round trip.
    ``send`` delivers one server event (JSON-encoding it) or raises :class:`TransportClosed`;
    ``close`` ends the connection and may be called more than once."""

    def __aiter__(self) -> AsyncIterator[str | bytes | InputAudioAppend]: ...

    async def send(self, event: dict) -> None: ...

    async def close(self) -> None: ...


class MediaSink(Protocol):
    """WebRTC output track: plays reply audio (float32, 24 kHz) paced in real time."""

    def play(self, response_id: str, pcm: np.ndarray) -> None: ...

    def clear(self, response_id: str) -> None:
        """Drop the unplayed audio of ``response_id``."""
        ...


@dataclass(frozen=True)
class OpenMessage:
    """The spoken message being recorded: its engine handle and when (``time.monotonic`` seconds) its first audio
    sample reached the server."""

    item_id: str
    handle: AudioInputHandle
    started_at: float
