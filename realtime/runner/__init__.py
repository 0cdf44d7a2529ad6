"""The asyncio driver of one :class:`realtime.session.Session` over any message transport.

A :class:`SessionRunner` is a thin composition of parts that each own their state and talk through public methods:

- :class:`~realtime.runner.responses.ResponseDriver` starts each response on the engine and runs its *pump*, which feeds
  the engine's output back into the session (pausing while the client lags), applies cancels (at once, or as the
  response starts), and knows which replies still wait for their first output;
- :class:`~realtime.runner.executor.CommandExecutor` executes engine commands one at a time, in the order the session
  emitted them (the engine seam requires it), with the input audio streams they open; an audio commit is sent and not
  waited for, so the response that follows it reaches the engine with it (a *commit* task awaits its outcome and
  reports a failure as an ``error`` event). Its queue is bounded: the reader stops reading client messages while
  :data:`~realtime.runner.executor.COMMANDS_HIGH_WATER` commands wait;
- :class:`~realtime.turns.detection.SpeechDetection` runs the turn detector on input audio (inline in the reader:
  each chunk's events reach the session before the next message);
- :class:`~realtime.runner.transcripts.TranscriptionDriver`, with input transcription on, runs the session's
  transcription jobs (:mod:`~realtime.runner.transcription_jobs`, its *transcriber* task) over copies of the
  committed messages' 16 kHz audio, each once no reply is waiting for its first output (audio, or text for a
  text-only reply) and none is about to start.

The runner owns every task, its own and those its parts start through its ``spawn``: the *reader* feeds client
messages to the session (:mod:`~realtime.runner.inbound`) and dispatches the resulting actions to the parts, the
*writer* sends server events from the :class:`OutboundQueue` to the transport in order, the *worker* is the command
executor's loop; then the pumps, commit tasks and the transcriber.

The runner stops when the client goes away (the transport's message iterator ends, or ``send``
raises :class:`TransportClosed`), when the client stops reading (:class:`ClientNotReading`: its
outbound queue reached the hard limit, or the transport gave up on a stalled send), when one of its
tasks fails, or when it is cancelled. Stopping cancels the running responses, cancels every task (a running
transcription's side reply with it), closes the engine conversation, reports why it stopped (:class:`SessionEnd`, to
``on_end``: the WebSocket endpoint picks its close code from it) and closes the transport. The WebSocket endpoint and
the WebRTC data channel both use this class.

Every task a session owns is named ``omni-session:<session id>:<role>``
(:func:`session_task_name`), so :func:`live_session_tasks` finds a task that outlived its session.

Modules: :mod:`~realtime.runner.contracts` (what the runner is plugged into, why a session ended, its tasks' names),
:mod:`~realtime.runner.core` (:class:`SessionRunner`: the parts, the tasks, the loops, the dispatch),
:mod:`~realtime.runner.inbound`, :mod:`~realtime.runner.outbound` (the bounded queue of server events),
:mod:`~realtime.runner.responses`, :mod:`~realtime.runner.executor`, :mod:`~realtime.runner.transcripts` and
:mod:`~realtime.runner.transcription_jobs`; speech detection is :mod:`realtime.turns.detection`. Every public name is
importable from here.
"""

from realtime.media.audio import AudioDecoder, DecoderFactory
from realtime.runner.contracts import (
    DISCONNECT_REASON,
    SESSION_TASK_PREFIX,
    MediaSink,
    OpenMessage,
    SessionEnd,
    Transport,
    TransportClosed,
    live_session_tasks,
    session_task_name,
)
from realtime.runner.core import SessionRunner
from realtime.runner.outbound import ClientNotReading, OutboundOverflow, OutboundQueue
from realtime.turns.detection import SpeechDetector, SpeechDetectorFactory

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
    "SpeechDetector",
    "SpeechDetectorFactory",
    "Transport",
    "TransportClosed",
    "live_session_tasks",
    "session_task_name",
]
