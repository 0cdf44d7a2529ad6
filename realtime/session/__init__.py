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

Structure: :class:`Session` (:mod:`~realtime.session.core`) is a thin composition. It owns the parts below, routes
each input to them and returns what they emitted; coordination between parts is a call of a public method (or of a
small protocol: :class:`~realtime.session.emitter.ConfigView`, :class:`~realtime.session.emitter.AudioClock`,
:class:`~realtime.session.responses.AssistantActivity`), never shared attributes. Every part is made with what it
needs (the settings, the id generator, the event builder :class:`~realtime.protocol.server.ServerEvents`, the other
parts it calls) and emits into one :class:`~realtime.session.emitter.Emitter` (actions in order; ``client_event``
stamps engine commands with the client event's id, ``holding`` diverts client actions into a tentative reply's list).

- :class:`~realtime.session.updates.SessionUpdates` (``updates``): the configuration (``config``), voices and
  modalities; ``update``, ``check_modality``, ``voice``, ``speaker``.
- :class:`~realtime.session.mirror.ItemMirror` (``mirror``): the conversation's items in order; ``add``, ``get``,
  ``discard``, ``previous_id``, ``input_audio_part``.
- :class:`~realtime.session.input_audio.InputAudio` (``input_audio``): the input buffer and the audio clock;
  ``accept``, ``add``, ``stream_held``, ``commit``, ``discard``, ``reopen``.
- :class:`~realtime.session.transcripts.InputTranscription` (``transcripts``): ``request``, ``delta``,
  ``completed``, ``failed``.
- :class:`~realtime.session.output_audio.OutputAudio` (``output_audio``): which response's audio plays; ``play``,
  ``flush``, ``stop``, ``forget``, ``clear_request``, ``playback_stopped``.
- :class:`~realtime.session.tool_calls.FunctionCalls` (``tool_calls``): ``response_calls``, ``client_item``,
  ``call_event``, ``finish``.
- :class:`~realtime.session.responses.Responses` (``responses``, with the data of
  :mod:`~realtime.session.response_state`): the active response; ``create_request``, ``cancel_request``, ``start``,
  ``output``, ``finish``, ``interrupt``, ``reply_to_turn``, ``abandon``.
- :class:`~realtime.session.items.ConversationItems` (``items``): the client's item requests; ``create``,
  ``retrieve``, ``delete``, ``truncate``.
- :class:`~realtime.session.preemptive.PreemptiveReplies` (``preemptive``): the tentative reply; ``pause``,
  ``show``, ``withdraw``, ``keep_aside``, ``holding``, ``drops_output``.
- :class:`~realtime.session.turns.SpeechAndIdle` and :class:`~realtime.session.turns.TurnTracker` (``turns``): speaking
  and the idle timer; the detector's events, barge-in, the idle timeout (``turn_event``, ``audio_appended``,
  ``detection_changed``, ``restart_if_speaking``).

The actions are :mod:`~realtime.session.commands`', what the server tells a session :mod:`~realtime.session.settings`'.
Every public name is importable from here.
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
