"""Sans-I/O state machine of one realtime session (python-websockets style).

Inputs, each a method returning the list of :data:`Action` to execute, in order:

- client messages (:meth:`Session.receive`, or already parsed events: :meth:`Session.handle`);
- turn events from the server VAD (:meth:`Session.turn_event`: ``SpeechStarted`` / ``SpeechStopped``
  of :mod:`realtime.turns.server_vad`, in ms on the session's audio clock);
- engine output of the active response (:meth:`Session.response_event`);
- input transcription results (:meth:`Session.transcription_delta`, :meth:`Session.transcription_completed`,
  :meth:`Session.transcription_failed`);
- failures of engine commands (:meth:`Session.command_failed`) and, for WebRTC, the end of playback
  (:meth:`Session.playback_stopped`).

Outputs: :class:`Send` (a server event dict), engine commands (:class:`AddText`,
:class:`AppendAudio`, :class:`StartResponse`, :class:`Transcribe` …), turn-detection commands (:class:`DetectSpeech`,
:class:`ConfigureTurnDetection`), output-audio commands (:class:`DropQueuedAudio`, and for
WebRTC :class:`PlayAudio` / :class:`ClearOutputAudio`) and, for traces and metrics, :class:`PreemptiveReply`.
Whoever drives the session (``runner``) executes engine commands in the order given; no engine call happens here,
nothing blocks, and a client mistake is a ``Send(error)`` after which the session carries on.

Preemptive replies (``SessionSettings.preemptive_replies``): a detector made with ``pause_ms``
(``ServerConfig.preemptive_response_ms``) also reports ``SpeechPaused`` when a silence run reaches that length,
before the silence window ends the turn. The session then commits the message and starts the reply at once, but
holds every client event of both (a :class:`_Tentative`): on ``SpeechStopped`` it sends them right behind
``speech_stopped``, so the reply has had the rest of the silence window to make its first audio; on
``SpeechResumed`` (or any client event but an audio append) it withdraws them unseen: the reply is cancelled, both
items are deleted from the engine and the message is streamed again under the same item id, with the audio that
arrived meanwhile. The client sees the same events as without; the model hears the message without the silence
after the pause.

Input transcription (``audio.input.transcription`` set): every committed input audio buffer is followed by a
:class:`Transcribe` action, emitted after the response the commit starts (if any) so that whoever runs it can see
that a reply is pending; a preemptive reply's commit holds it with the reply's client events. Transcription results
for an item that was deleted meanwhile are dropped.

Audio input: in manual mode (``turn_detection: null``) every appended chunk goes to the engine at
once. With ``server_vad`` the audio before speech is held back (prefix padding plus
``SessionLimits.vad_lookback_ms`` for the detector's latency) and only the part from the detected
``audio_start_ms`` on reaches the engine, so silence never fills the model's context.

Modules: :mod:`~realtime.session.commands` (the actions), :mod:`~realtime.session.settings` (what the server tells a
session), :mod:`~realtime.session.core` (:class:`Session`: state, inputs, plumbing) and one mixin of ``Session`` per
concern: :mod:`~realtime.session.updates` (``session.update``), :mod:`~realtime.session.input_audio`,
:mod:`~realtime.session.transcripts`, :mod:`~realtime.session.turns`, :mod:`~realtime.session.preemptive`,
:mod:`~realtime.session.items`, :mod:`~realtime.session.responses`, :mod:`~realtime.session.output_audio` (and
:mod:`realtime.tool_calls`). Every public name is importable from here.
"""

from __future__ import annotations

from realtime.session.commands import (
    Action,
    AddAudio,
    AddContent,
    AddFunctionCall,
    AddFunctionOutput,
    AddText,
    AppendAudio,
    CancelResponse,
    ClearAudio,
    ClearOutputAudio,
    CommitAudio,
    ConfigureTurnDetection,
    DeleteItem,
    DetectSpeech,
    DropQueuedAudio,
    EngineCommand,
    PlayAudio,
    Preemption,
    PreemptiveReply,
    Send,
    SetContextPolicy,
    SetInstructions,
    SetTools,
    StartResponse,
    Transcribe,
    TruncateItem,
)
from realtime.session.core import Session
from realtime.session.response_state import ResponsePhase
from realtime.session.settings import AudioEncoder, AudioTransport, EncoderFactory, SessionLimits, SessionSettings
from realtime.turns.server_vad import TurnEvent

__all__ = [
    "Action",
    "AddAudio",
    "AddContent",
    "AddFunctionCall",
    "AddFunctionOutput",
    "AddText",
    "AppendAudio",
    "AudioEncoder",
    "AudioTransport",
    "CancelResponse",
    "ClearAudio",
    "ClearOutputAudio",
    "CommitAudio",
    "ConfigureTurnDetection",
    "DeleteItem",
    "DetectSpeech",
    "DropQueuedAudio",
    "EncoderFactory",
    "EngineCommand",
    "PlayAudio",
    "Preemption",
    "PreemptiveReply",
    "ResponsePhase",
    "Send",
    "Session",
    "SessionLimits",
    "SessionSettings",
    "SetContextPolicy",
    "SetInstructions",
    "SetTools",
    "StartResponse",
    "Transcribe",
    "TruncateItem",
    "TurnEvent",
]
