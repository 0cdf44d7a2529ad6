"""The asyncio driver of one :class:`realtime.session.Session` over any message transport.

A :class:`SessionRunner` owns four kinds of tasks, all tracked and all cancelled when it stops:

- the *reader* feeds client messages to the session and executes the resulting actions;
- the *writer* sends server events from the :class:`OutboundQueue` to the transport, in order;
- the *worker* executes engine commands one at a time, in the order the session emitted them
  (the engine seam requires it), except cancellation, which is executed at once; an audio commit is
  sent and not waited for, so the response that follows it reaches the engine with it;
- one *commit* task per audio commit awaits its outcome and reports a failure as an ``error`` event;
- one *pump* per response feeds the engine's output stream back into the session;
- with input transcription on, one *transcriber* runs the session's transcription jobs
  (:mod:`realtime.transcription`) over copies of the committed messages' 16 kHz audio, each once no reply
  is waiting for its first output (audio, or text for a text-only reply) and none is about to start.

The runner stops when the client goes away (the transport's message iterator ends, or ``send``
raises :class:`TransportClosed`), when the client stops reading (:class:`ClientNotReading`: its
outbound queue reached the hard limit, or the transport gave up on a stalled send), when one of its
tasks fails, or when it is cancelled. Stopping cancels the running response, cancels every task,
closes the engine conversation, reports why it stopped (:class:`SessionEnd`, to ``on_end``: the
WebSocket endpoint picks its close code from it) and closes the transport. Turn detection and input
decoding run inline in the reader (both are cheap per chunk). The WebSocket endpoint and the WebRTC
data channel both use this class.

Every task a session owns is named ``omni-session:<session id>:<role>``
(:func:`session_task_name`), so :func:`live_session_tasks` finds a task that outlived its session.

Modules: :mod:`~realtime.runner.contracts` (what the runner is plugged into, why a session ended, its tasks' names),
:mod:`~realtime.runner.outbound` (the bounded queue of server events), :mod:`~realtime.runner.core`
(:class:`SessionRunner`: state, tasks, loops, dispatch) over its parts :mod:`~realtime.runner.engine_commands`,
:mod:`~realtime.runner.turns` and :mod:`~realtime.runner.transcripts`. Every public name is importable from here.
"""

from realtime.runner.contracts import (
    DISCONNECT_REASON,
    SESSION_TASK_PREFIX,
    AudioDecoder,
    DecoderFactory,
    MediaSink,
    OpenMessage,
    SessionEnd,
    Transport,
    TransportClosed,
    TurnDetector,
    TurnDetectorFactory,
    live_session_tasks,
    session_task_name,
)
from realtime.runner.core import SessionRunner
from realtime.runner.outbound import ClientNotReading, OutboundOverflow, OutboundQueue

__all__ = [
    "DISCONNECT_REASON",
    "SESSION_TASK_PREFIX",
    "AudioDecoder",
    "ClientNotReading",
    "DecoderFactory",
    "MediaSink",
    "OpenMessage",
    "OutboundOverflow",
    "OutboundQueue",
    "SessionEnd",
    "SessionRunner",
    "Transport",
    "TransportClosed",
    "TurnDetector",
    "TurnDetectorFactory",
    "live_session_tasks",
    "session_task_name",
]
