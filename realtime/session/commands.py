"""What a :class:`~realtime.session.Session` returns: the actions its caller executes, in order.

:class:`Send` is a server event for the client; the :data:`EngineCommand` types go to the engine (``event_id``: the
client event that caused one, for the ``error`` of its failure); :class:`DetectSpeech` and
:class:`ConfigureTurnDetection` drive the turn detector; :class:`DropQueuedAudio`, :class:`PlayAudio` and
:class:`ClearOutputAudio` the output audio; :class:`PreemptiveReply` is for traces and metrics only.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

import numpy as np

from pipeline.api import ContextPolicy, Modality
from pipeline.tools import AUTO, Tool, ToolChoice
from realtime.protocol.audio_format import AudioFormat
from realtime.protocol.codes import StatusReason
from realtime.protocol.model import Role
from realtime.protocol.turn_detection import ServerVadParams


@dataclass(frozen=True)
class Send:
    """Send this server event to the client."""

    event: dict


@dataclass(frozen=True)
class _Command:
    """An engine command (every :data:`EngineCommand` is one). ``event_id``: that of the client event whose handling
    emitted it (None for commands of turn detection or engine output), so that its failure's ``error`` event carries
    it; not part of equality."""

    event_id: str | None = field(default=None, compare=False, kw_only=True)


@dataclass(frozen=True)
class SetTools(_Command):
    """The function tools offered to the model (part of its prompt); ``()``: none. Applied between responses."""

    tools: tuple[Tool, ...]


@dataclass(frozen=True)
class AddFunctionCall(_Command):
    """A client's ``function_call`` item (history replay), appended to the conversation."""

    item_id: str
    name: str
    arguments: str


@dataclass(frozen=True)
class AddFunctionOutput(_Command):
    """A client's ``function_call_output`` item, appended to the conversation."""

    item_id: str
    output: str


@dataclass(frozen=True)
class SetInstructions(_Command):
    instructions: str


@dataclass(frozen=True)
class SetContextPolicy(_Command):
    """The conversation's context policy in the engine (the session's ``truncation``; None: the engine's own)."""

    policy: ContextPolicy | None


@dataclass(frozen=True)
class AddText(_Command):
    """Appended (``previous_item_id`` None), or inserted right after ``previous_item_id`` (``root``: first): an
    insertion needs the conversation idle, like :class:`DeleteItem`."""

    item_id: str
    text: str
    role: Role
    previous_item_id: str | None = None


@dataclass(frozen=True, eq=False)
class AddContent(_Command):
    """A user message of text and pictures (uint8 RGB arrays), in order. Placed as :class:`AddText` is."""

    item_id: str
    parts: tuple[str | np.ndarray, ...]
    previous_item_id: str | None = None


@dataclass(frozen=True)
class AddAudio(_Command):
    """A complete user audio message: ``audio`` is wire bytes in ``format``. Placed as :class:`AddText` is."""

    item_id: str
    audio: bytes
    format: AudioFormat
    previous_item_id: str | None = None


@dataclass(frozen=True)
class AppendAudio(_Command):
    """The next chunk of the input buffer's message ``item_id`` (opened by its first chunk). ``start_ms``: where
    the chunk begins on the session's audio clock (:attr:`Session.audio_clock_ms`)."""

    item_id: str
    audio: bytes
    format: AudioFormat
    start_ms: float = field(default=0.0, compare=False, kw_only=True)


@dataclass(frozen=True)
class CommitAudio(_Command):
    item_id: str


@dataclass(frozen=True)
class ClearAudio(_Command):
    """Discard the open input message ``item_id``."""

    item_id: str


@dataclass(frozen=True)
class StartResponse(_Command):
    response_id: str
    item_id: str
    modalities: frozenset[Modality]
    voice: str | None
    """None: the engine has no audio output (its replies are text)."""
    max_output_tokens: int | None
    tool_choice: ToolChoice = AUTO
    call_item_ids: tuple[str, ...] = ()
    """Item ids of the calls the reply may make (none: it makes no calls; see :mod:`realtime.session.tool_calls`)."""


@dataclass(frozen=True)
class CancelResponse(_Command):
    response_id: str
    reason: StatusReason


@dataclass(frozen=True)
class DeleteItem(_Command):
    """Needs the conversation idle: the executor waits for a cancelled response to end first."""

    item_id: str


@dataclass(frozen=True)
class TruncateItem(_Command):
    """Needs the conversation idle: the executor waits for the running response (cancelled or not) to end first.
    The response running meanwhile was written for the item as it was."""

    item_id: str
    audio_end_ms: int


@dataclass(frozen=True)
class Transcribe(_Command):
    """Transcribe the committed input audio of user item ``item_id`` (content part ``content_index``) and report
    the result through :meth:`Session.transcription_delta` / ``_completed`` / ``_failed``. Follows the item's
    :class:`CommitAudio` and, when the commit starts a reply, that reply's :class:`StartResponse`. ``language``
    and ``prompt``: the client's hints (``audio.input.transcription``)."""

    item_id: str
    content_index: int = 0
    language: str | None = None
    prompt: str | None = None


EngineCommand = (
    SetInstructions
    | SetContextPolicy
    | SetTools
    | AddFunctionCall
    | AddFunctionOutput
    | AddText
    | AddContent
    | AddAudio
    | AppendAudio
    | CommitAudio
    | ClearAudio
    | StartResponse
    | CancelResponse
    | DeleteItem
    | TruncateItem
    | Transcribe
)


@dataclass(frozen=True)
class DetectSpeech:
    """Feed this appended audio (wire bytes) to the turn detector; its events come back through
    :meth:`Session.turn_event`. Always the last action of an append."""

    audio: bytes
    format: AudioFormat


@dataclass(frozen=True)
class ConfigureTurnDetection:
    """(Re)start turn detection with ``params`` (``None``: stop). A restarted detector forgets any
    speech in progress; its clock starts at ``start_ms`` of the session's audio clock."""

    params: ServerVadParams | None
    start_ms: int


@dataclass(frozen=True)
class DropQueuedAudio:
    """Audio deltas of this response still waiting to be sent must not be sent."""

    response_id: str


@dataclass(frozen=True, eq=False)
class PlayAudio:
    """WebRTC: play this float32 24 kHz audio on the output track."""

    response_id: str
    pcm: np.ndarray


@dataclass(frozen=True)
class ClearOutputAudio:
    """WebRTC: stop playing, and drop the unplayed audio of, this response."""

    response_id: str


class Preemption(enum.Enum):
    """What became of a reply started on a pause (see :mod:`realtime.session`)."""

    STARTED = "started"
    """Committed and started at the pause; its client events are held."""
    SHOWN = "shown"
    """Speech stopped: its held events went out right behind ``speech_stopped``."""
    WITHDRAWN = "withdrawn"
    """Speech resumed (or a client event came): cancelled and deleted unseen."""


@dataclass(frozen=True)
class PreemptiveReply:
    """For the runner's trace and metrics only: the reply ``response_id`` started on a pause reached ``outcome``.
    Never held, never sent: the client does not learn which replies were preemptive."""

    response_id: str
    outcome: Preemption


Action = (
    EngineCommand
    | Send
    | DetectSpeech
    | ConfigureTurnDetection
    | DropQueuedAudio
    | PlayAudio
    | ClearOutputAudio
    | PreemptiveReply
)


_CLIENT_ACTIONS = (Send, PlayAudio, ClearOutputAudio, DropQueuedAudio, Transcribe)
"""What a :class:`_Tentative` holds back: the actions that reach the client (a transcription's events do); engine
commands always go."""
