"""Typed protocol objects: session configuration, conversation items, responses.

Parsers (:mod:`.client`) produce these from either dialect's JSON; builders (:mod:`.server`)
serialize them into either dialect's JSON; the session state machine works on them only.
Times are milliseconds; audio formats are :class:`realtime.media.audio.AudioFormat`.
"""

from __future__ import annotations

import dataclasses
import enum
from dataclasses import dataclass, field

import numpy as np

from pipeline.api import ContextPolicy, Modality
from pipeline.response_events import Usage
from pipeline.tools import AUTO, Tool, ToolChoice
from realtime.protocol.audio_format import AudioFormat
from realtime.protocol.codes import StatusReason
from realtime.protocol.names import ContentType
from realtime.protocol.turn_detection import ServerVadParams


class Keep(enum.Enum):
    """Marks a field a ``session.update`` / ``response.create`` left out (``None`` is a value:
    ``turn_detection: null`` turns detection off, ``max_output_tokens: "inf"`` is ``None``)."""

    KEEP = "keep"


KEEP = Keep.KEEP


class OutputModality(enum.Enum):
    """What a response produces. The API allows one of the two: audio always comes with its
    transcript, so the engine is asked for text and audio."""

    AUDIO = "audio"
    TEXT = "text"

    @property
    def engine_modalities(self) -> frozenset[Modality]:
        return frozenset({"text", "audio"}) if self is OutputModality.AUDIO else frozenset({"text"})


class Role(str, enum.Enum):
    USER = "user"
    ASSISTANT = "assistant"
    SYSTEM = "system"


class ItemType(str, enum.Enum):
    MESSAGE = "message"
    FUNCTION_CALL = "function_call"
    FUNCTION_CALL_OUTPUT = "function_call_output"


class ItemStatus(str, enum.Enum):
    IN_PROGRESS = "in_progress"
    COMPLETED = "completed"
    INCOMPLETE = "incomplete"


class ResponseWireStatus(str, enum.Enum):
    """``response.status`` on the wire (the engine's statuses plus ``in_progress``)."""

    IN_PROGRESS = "in_progress"
    COMPLETED = "completed"
    CANCELLED = "cancelled"
    FAILED = "failed"
    INCOMPLETE = "incomplete"


class TruncationType(str, enum.Enum):
    AUTO = "auto"
    DISABLED = "disabled"
    RETENTION_RATIO = "retention_ratio"


@dataclass(frozen=True)
class Truncation:
    """The session's ``truncation``: what happens when a response's prompt and its reply room would not fit the
    context. ``auto``: the engine's context policy (the stage config's ``thinker.context_policy``); ``disabled``: the
    response fails with ``context_length_exceeded`` and nothing is dropped; ``retention_ratio``: the oldest turns are
    dropped until the prompt takes at most ``retention_ratio`` of the room beside the reply, and, with
    ``post_instructions_tokens`` (the API's ``token_limits.post_instructions``), the items after the instructions are
    kept within that many tokens."""

    type: TruncationType = TruncationType.AUTO
    retention_ratio: float | None = None
    post_instructions_tokens: int | None = None

    def context_policy(self) -> ContextPolicy | None:
        """The conversation's context policy in the engine (None: the engine's own)."""
        if self.type is TruncationType.AUTO:
            return None
        if self.type is TruncationType.DISABLED:
            return ContextPolicy(drop_oldest=False)
        assert self.retention_ratio is not None
        return ContextPolicy(
            drop_oldest=True, retention_ratio=self.retention_ratio, max_history_tokens=self.post_instructions_tokens
        )


DEFAULT_TURN_DETECTION = ServerVadParams()
"""``server_vad`` with the API's defaults: threshold 0.5, 300 ms padding, 500 ms silence."""


@dataclass(frozen=True)
class TranscriptionSettings:
    """``audio.input.transcription`` (beta ``input_audio_transcription``): input transcription is on. ``model`` is
    the client's and only echoed (the server's own model transcribes); ``language`` (ISO-639-1) and ``prompt`` are
    passed to it as hints."""

    model: str | None = None
    language: str | None = None
    prompt: str | None = None


@dataclass(frozen=True)
class SessionPatch:
    """The fields one ``session.update`` sets; ``KEEP`` leaves a field as it is.

    ``voice_param`` is where the voice was given (``session.audio.output.voice`` for GA,
    ``session.voice`` for beta) so that an unknown voice is reported at the client's path; ``modality_param`` likewise
    where the output modality was given (``session.output_modalities``, beta ``session.modalities``)."""

    instructions: str | Keep = KEEP
    voice: str | Keep = KEEP
    modality: OutputModality | Keep = KEEP
    input_format: AudioFormat | Keep = KEEP
    output_format: AudioFormat | Keep = KEEP
    turn_detection: ServerVadParams | None | Keep = KEEP
    max_output_tokens: int | None | Keep = KEEP
    transcription: TranscriptionSettings | None | Keep = KEEP
    truncation: Truncation | Keep = KEEP
    tools: tuple[Tool, ...] | Keep = KEEP
    tool_choice: ToolChoice | Keep = KEEP
    voice_param: str = "session.voice"
    modality_param: str = "session.output_modalities"


@dataclass(frozen=True)
class SessionConfig:
    """The effective configuration of a session. ``max_output_tokens=None`` means ``"inf"``;
    ``turn_detection=None`` means manual turns (client commits and asks for responses); ``voice=None``: the engine
    has no audio output (no voice to report)."""

    instructions: str
    voice: str | None
    modality: OutputModality = OutputModality.AUDIO
    input_format: AudioFormat = AudioFormat.PCM
    output_format: AudioFormat = AudioFormat.PCM
    turn_detection: ServerVadParams | None = DEFAULT_TURN_DETECTION
    max_output_tokens: int | None = None
    transcription: TranscriptionSettings | None = None
    """Input audio transcription settings; None: off (the API's default)."""
    truncation: Truncation = Truncation()
    tools: tuple[Tool, ...] = ()
    tool_choice: ToolChoice = AUTO

    def apply(self, patch: SessionPatch) -> SessionConfig:
        """A copy with the patch's set fields replaced."""
        changes = {
            f.name: getattr(patch, f.name) for f in dataclasses.fields(self) if getattr(patch, f.name) is not KEEP
        }
        return dataclasses.replace(self, **changes)


@dataclass(frozen=True)
class ResponseParams:
    """Per-response overrides from ``response.create``; ``KEEP`` uses the session's setting.
    ``instructions`` replaces the system prompt for this response only."""

    modality: OutputModality | Keep = KEEP
    voice: str | Keep = KEEP
    output_format: AudioFormat | Keep = KEEP
    max_output_tokens: int | None | Keep = KEEP
    instructions: str | Keep = KEEP
    tools: tuple[Tool, ...] | Keep = KEEP
    tool_choice: ToolChoice | Keep = KEEP
    metadata: dict[str, str] | None = None
    voice_param: str = "response.voice"
    modality_param: str = "response.output_modalities"


class Detail(str, enum.Enum):
    """``input_image.detail``: how many pixels of the picture the model sees (``realtime.media.images.ImageLimits``)."""

    AUTO = "auto"
    LOW = "low"
    HIGH = "high"


@dataclass(frozen=True, eq=False)
class ImagePart:
    """An ``input_image`` content part of a created message: ``url`` as the client sent it (checked and decoded off
    the event loop by :mod:`realtime.media.images`, which fills ``pixels``: uint8 RGB ``(H, W, 3)`` as the engine takes
    it)."""

    url: str
    detail: Detail = Detail.AUTO
    pixels: np.ndarray | None = None


@dataclass
class ContentPart:
    """One content part of an item. ``audio_ms`` counts the audio of an output part actually
    sent to the client (what ``conversation.item.truncate`` may cut); it is not serialized.
    ``detail``: an ``input_image`` part's (its picture is not kept)."""

    type: ContentType
    text: str | None = None
    transcript: str | None = None
    audio_ms: float = 0.0
    detail: str | None = None


@dataclass
class Item:
    """A conversation item: a message (``role``, ``content``), a function call (``call_id``, ``name``,
    ``arguments``; role assistant) or a function call's output (``call_id``, ``output``; role user)."""

    id: str
    role: Role
    content: list[ContentPart] = field(default_factory=list)
    status: ItemStatus = ItemStatus.COMPLETED
    type: ItemType = ItemType.MESSAGE
    call_id: str | None = None
    name: str | None = None
    arguments: str | None = None
    output: str | None = None


@dataclass(frozen=True)
class NewItem:
    """An item from ``conversation.item.create``, validated. A message has exactly one kind of content:
    ``content`` is ``INPUT_TEXT`` (user/system), ``OUTPUT_TEXT`` (assistant), ``INPUT_AUDIO``
    (user; ``audio`` holds the decoded wire bytes, in the session's input format) or ``INPUT_IMAGE`` (user text and
    pictures in order: ``parts``, each text or an :class:`ImagePart`). A function call or output has no content
    (``None``)."""

    id: str | None
    role: Role
    content: ContentType | None
    text: str | None = None
    audio: bytes | None = None
    transcript: str | None = None
    type: ItemType = ItemType.MESSAGE
    call_id: str | None = None
    name: str | None = None
    arguments: str | None = None
    """JSON text of an object (checked)."""
    output: str | None = None
    parts: tuple[str | ImagePart, ...] = ()

    @property
    def images(self) -> tuple[ImagePart, ...]:
        return tuple(part for part in self.parts if isinstance(part, ImagePart))


@dataclass(frozen=True)
class ResponseSummary:
    """A snapshot of a response for ``response.created`` / ``response.done``."""

    id: str
    conversation_id: str
    state: ResponseWireStatus
    modality: OutputModality
    voice: str | None
    """None: the engine has no audio output."""
    output_format: AudioFormat
    max_output_tokens: int | None
    output: tuple[Item, ...] = ()
    reason: StatusReason | None = None
    error: dict | None = None
    """``{"type", "code", "message"}`` of a failed response."""
    usage: Usage | None = None
    metadata: dict[str, str] | None = None
