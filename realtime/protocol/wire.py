"""Pydantic models of client events: the public JSON edge, GA and beta shapes in one model each.

Validation is strict (no coercion of ``"5"`` to ``5``) and unknown fields are refused, so a typo
gets an ``unknown_parameter`` error instead of being ignored. Fields the OpenAI API defines but this
server does not implement are of two kinds:

- refused unless "off" (``null``, ``1.0``) because ignoring them would change what the client
  gets: ``idle_timeout_ms``, ``semantic_vad``, ``speed``, out-of-band responses (the
  ``unsupported_value`` message of each, saying what to send instead, is in
  :data:`realtime.protocol.validation.REFUSALS`);
- accepted and ignored, because SDK clients send them routinely and nothing the client relies on
  changes: ``model`` (one model per server), ``temperature`` (the engine's
  sampling settings apply), input ``transcription`` and ``noise_reduction`` (the model hears the
  audio itself; no transcription events are sent), ``tracing``, ``include``, ``truncation``. The
  ``session.updated`` reply shows the effective configuration (``transcription: null``...).

Unions are kept out of field types on purpose: pydantic names union branches in error locations,
and the error's ``param`` must be the client's field path.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

from realtime.protocol import tools

MAX_OUTPUT_TOKENS_LIMIT = 4096
"""Largest integer ``max_output_tokens`` the API accepts (``"inf"`` means no limit)."""


def _max_tokens(value: Any) -> int | None:
    """``int`` in [1, 4096] or ``"inf"`` (→ ``None``)."""
    if value == "inf":
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f'must be an integer or "inf", got {value!r}')
    if not 1 <= value <= MAX_OUTPUT_TOKENS_LIMIT:
        raise ValueError(f"must be between 1 and {MAX_OUTPUT_TOKENS_LIMIT}, got {value}")
    return value


MaxTokens = Annotated[Any, AfterValidator(_max_tokens)]
GaFormatType = Literal["audio/pcm", "audio/pcmu", "audio/pcma"]
BetaFormatName = Literal["pcm16", "g711_ulaw", "g711_alaw"]
ModalityName = Literal["text", "audio"]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


def _tool_choice(value: Any) -> Any:
    return tools.check_tool_choice(value)


ToolChoiceValue = Annotated[Any, AfterValidator(_tool_choice)]


class ToolModel(_Model):
    """A function tool (``tools.*``): see :mod:`realtime.protocol.tools` for what is checked."""

    type: Literal["function"] = "function"
    name: Annotated[str, AfterValidator(tools.check_name)]
    description: str | None = None
    parameters: Annotated[Any, AfterValidator(tools.check_parameters)] = None


ToolList = Annotated[list[ToolModel] | None, AfterValidator(tools.check_unique)]


class FormatModel(_Model):
    """GA audio format object. ``rate`` exists for ``audio/pcm`` only and is always 24000."""

    type: GaFormatType
    rate: Literal[24000] | None = None


class TurnDetectionModel(_Model):
    """``server_vad`` settings; missing fields take the API defaults. ``semantic_vad`` and the idle
    timeout are not implemented."""

    type: Literal["server_vad"] = "server_vad"
    threshold: float | None = Field(default=None, ge=0.0, le=1.0)
    prefix_padding_ms: int | None = Field(default=None, ge=0)
    silence_duration_ms: int | None = Field(default=None, ge=0)
    create_response: bool | None = None
    interrupt_response: bool | None = None
    idle_timeout_ms: None = None


class AudioInputModel(_Model):
    format: FormatModel | None = None
    turn_detection: TurnDetectionModel | None = None
    transcription: Any = None  # accepted and ignored (module docstring)
    noise_reduction: Any = None  # accepted and ignored


class AudioOutputModel(_Model):
    format: FormatModel | None = None
    voice: str | None = None
    speed: Literal[1.0] | None = None


class AudioModel(_Model):
    input: AudioInputModel | None = None
    output: AudioOutputModel | None = None


class SessionModel(_Model):
    """``session.update``'s ``session``: GA fields (``type``, ``audio``, ``output_modalities``,
    ``max_output_tokens``) and beta fields (``modalities``, ``voice``, ``input_audio_format``,
    ``output_audio_format``, ``turn_detection``, ``max_response_output_tokens``) side by side."""

    type: Literal["realtime"] | None = None
    instructions: str | None = None
    output_modalities: list[ModalityName] | None = Field(default=None, min_length=1)
    audio: AudioModel | None = None
    max_output_tokens: MaxTokens = None
    # beta spellings
    modalities: list[ModalityName] | None = Field(default=None, min_length=1)
    voice: str | None = None
    input_audio_format: BetaFormatName | None = None
    output_audio_format: BetaFormatName | None = None
    turn_detection: TurnDetectionModel | None = None
    max_response_output_tokens: MaxTokens = None
    tools: ToolList = None
    tool_choice: ToolChoiceValue = None
    # accepted and ignored (see the module docstring)
    model: str | None = None
    temperature: float | None = None
    input_audio_transcription: Any = None
    input_audio_noise_reduction: Any = None
    tracing: Any = None
    include: Any = None
    truncation: Any = None


class SessionUpdateModel(_Model):
    type: Literal["session.update"]
    event_id: str | None = None
    session: SessionModel


class AppendModel(_Model):
    type: Literal["input_audio_buffer.append"]
    event_id: str | None = None
    audio: str


class BareEventModel(_Model):
    """Events without payload: commit, clear, output_audio_buffer.clear."""

    type: Literal["input_audio_buffer.commit", "input_audio_buffer.clear", "output_audio_buffer.clear"]
    event_id: str | None = None


class ContentModel(_Model):
    """A content part of a created item; which fields must be set depends on ``type``."""

    type: Literal["input_text", "input_audio", "output_text", "text"]
    text: str | None = None
    audio: str | None = None
    transcript: str | None = None


class ItemModel(_Model):
    """A created item: a ``message`` (``role``, ``content``), a ``function_call`` (``call_id``, ``name``,
    ``arguments``) or a ``function_call_output`` (``call_id``, ``output``); which fields each needs is checked by
    the converter (:func:`realtime.protocol.client._new_item`)."""

    id: str | None = Field(default=None, min_length=1, max_length=32)
    type: Literal["message", "function_call", "function_call_output"]
    role: Literal["user", "assistant", "system"] | None = None
    content: list[ContentModel] | None = Field(default=None, min_length=1)
    call_id: str | None = Field(default=None, min_length=1)
    name: str | None = None
    arguments: str | None = None
    output: str | None = None
    status: Literal["completed", "incomplete", "in_progress"] | None = None
    object: Literal["realtime.item"] | None = None


class ItemCreateModel(_Model):
    type: Literal["conversation.item.create"]
    event_id: str | None = None
    previous_item_id: str | None = None
    item: ItemModel


class ItemRefModel(_Model):
    type: Literal["conversation.item.retrieve", "conversation.item.delete"]
    event_id: str | None = None
    item_id: str


class TruncateModel(_Model):
    type: Literal["conversation.item.truncate"]
    event_id: str | None = None
    item_id: str
    content_index: int = Field(ge=0)
    audio_end_ms: int = Field(ge=0)


class ResponseAudioOutputModel(_Model):
    format: FormatModel | None = None
    voice: str | None = None


class ResponseAudioModel(_Model):
    output: ResponseAudioOutputModel | None = None


class ResponseModel(_Model):
    """``response.create``'s ``response`` (GA and beta spellings). Out-of-band responses
    (``conversation: "none"``, ``input``) and tools are not implemented."""

    output_modalities: list[ModalityName] | None = Field(default=None, min_length=1)
    audio: ResponseAudioModel | None = None
    max_output_tokens: MaxTokens = None
    instructions: str | None = None
    metadata: dict[str, str] | None = Field(default=None, max_length=16)
    conversation: Literal["auto"] | None = None
    input: None = None
    tools: ToolList = None
    tool_choice: ToolChoiceValue = None
    # beta spellings
    modalities: list[ModalityName] | None = Field(default=None, min_length=1)
    voice: str | None = None
    output_audio_format: BetaFormatName | None = None
    max_response_output_tokens: MaxTokens = None
    # accepted and ignored (see the module docstring)
    temperature: float | None = None


class ResponseCreateModel(_Model):
    type: Literal["response.create"]
    event_id: str | None = None
    response: ResponseModel | None = None


class ResponseCancelModel(_Model):
    type: Literal["response.cancel"]
    event_id: str | None = None
    response_id: str | None = None
