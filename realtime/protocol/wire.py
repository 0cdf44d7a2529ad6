"""Pydantic models of client events: the public JSON edge, GA and beta shapes in one model each.

Validation is strict (no coercion of ``"5"`` to ``5``) and unknown fields are refused, so a typo
gets an ``unknown_parameter`` error instead of being ignored. Fields the OpenAI API defines but this
server does not implement are of two kinds:

- refused unless "off" (``null``, ``1.0``) because ignoring them would change what the client
  gets: ``prompt``, ``speed``, MCP tools, out-of-band responses (the ``unsupported_value`` message of each, saying
  what to send instead, is in :data:`realtime.protocol.validation.REFUSALS`);
- accepted and ignored, because SDK clients send them routinely and nothing the client relies on
  changes: ``model`` (one model per server), ``temperature`` (the engine's sampling settings apply), input
  ``noise_reduction`` (the model hears the audio as sent), ``tracing``, ``include`` (it only asks for transcription
  log-probabilities). The ``session.updated`` reply shows the effective configuration (``noise_reduction: null``...).

Input ``transcription`` (beta ``input_audio_transcription``) is implemented (:mod:`realtime.runner.transcription_jobs`):
its ``model`` is echoed, ``language`` and ``prompt`` are hints to the server's own model.
``semantic_vad`` is served by the turn model (Smart Turn v3.2, :mod:`realtime.turns.semantic_detector`), with
silence-based detection as its fallback.
In ``session.update`` a refused field refuses only itself (:mod:`.session_update`). ``truncation`` maps onto the
conversation's context policy. Function ``tools`` and ``tool_choice`` are implemented
(:mod:`realtime.session.tool_calls`).

Unions are kept out of field types on purpose: pydantic names union branches in error locations,
and the error's ``param`` must be the client's field path.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, model_validator

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

_TRUNCATION_SHAPE = (
    'must be "auto", "disabled" or {"type": "retention_ratio", "retention_ratio": <0 to 1>, '
    '"token_limits": {"post_instructions": <tokens>}} (token_limits optional)'
)


def _truncation(value: Any) -> Any:
    """``"auto"``, ``"disabled"`` or a retention-ratio object (``retention_ratio`` in [0, 1], optional
    ``token_limits.post_instructions`` a positive integer or null); returned as given."""
    if value is None or value in ("auto", "disabled"):
        return value
    if not isinstance(value, dict) or value.get("type") != "retention_ratio" or "retention_ratio" not in value:
        raise ValueError(_TRUNCATION_SHAPE)
    if set(value) - {"type", "retention_ratio", "token_limits"}:
        raise ValueError(f"has unknown fields {sorted(set(value) - {'type', 'retention_ratio', 'token_limits'})}")
    ratio = value["retention_ratio"]
    if isinstance(ratio, bool) or not isinstance(ratio, (int, float)) or not 0.0 <= ratio <= 1.0:
        raise ValueError(f"retention_ratio must be a number between 0 and 1, got {ratio!r}")
    limits = value.get("token_limits")
    if limits is None:
        return value
    if not isinstance(limits, dict) or set(limits) - {"post_instructions"}:
        raise ValueError('token_limits must be an object with the one field "post_instructions"')
    post = limits.get("post_instructions")
    if post is not None and (isinstance(post, bool) or not isinstance(post, int) or post < 1):
        raise ValueError(f"token_limits.post_instructions must be a positive integer, got {post!r}")
    return value


Truncation = Annotated[Any, AfterValidator(_truncation)]
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


_SERVER_VAD_ONLY = ("threshold", "prefix_padding_ms", "silence_duration_ms", "idle_timeout_ms")


class TurnDetectionModel(_Model):
    """``server_vad`` or ``semantic_vad`` settings; missing fields take the API defaults. Each type takes its own
    fields only (``eagerness`` is semantic_vad's; the silence settings and the idle timeout are server_vad's)."""

    type: Literal["server_vad", "semantic_vad"] = "server_vad"
    threshold: float | None = Field(default=None, ge=0.0, le=1.0)
    prefix_padding_ms: int | None = Field(default=None, ge=0)
    silence_duration_ms: int | None = Field(default=None, ge=0)
    create_response: bool | None = None
    interrupt_response: bool | None = None
    idle_timeout_ms: int | None = Field(default=None, ge=1)
    eagerness: Literal["low", "medium", "high", "auto"] | None = None

    @model_validator(mode="after")
    def _fields_of_its_type(self) -> TurnDetectionModel:
        if self.type == "server_vad" and self.eagerness is not None:
            raise ValueError("sets 'eagerness', a semantic_vad setting: send type 'semantic_vad', or leave it out")
        if self.type == "semantic_vad":
            given = [name for name in _SERVER_VAD_ONLY if getattr(self, name) is not None]
            if given:
                raise ValueError(
                    f"sets {', '.join(repr(n) for n in given)}: server_vad settings that semantic_vad does not take "
                    "(its silence window comes from 'eagerness')"
                )
        return self


class TranscriptionModel(_Model):
    """Input audio transcription settings (GA ``audio.input.transcription``, beta ``input_audio_transcription``).
    Fields of the API this server has no use for (``delay``, ``keywords``, ``languages``) are refused as unknown."""

    model: str | None = None
    language: str | None = None
    prompt: str | None = None


class AudioInputModel(_Model):
    format: FormatModel | None = None
    turn_detection: TurnDetectionModel | None = None
    transcription: TranscriptionModel | None = None
    noise_reduction: Any = None  # accepted and ignored


class AudioOutputModel(_Model):
    format: FormatModel | None = None
    voice: str | None = None
    speed: Annotated[float, Field(ge=1.0, le=1.0)] | None = None  # the voice speaks at 1.0 only


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
    input_audio_transcription: TranscriptionModel | None = None
    tools: ToolList = None
    tool_choice: ToolChoiceValue = None
    truncation: Truncation = None
    # defined by the API, refused unless off
    prompt: None = None
    # accepted and ignored (see the module docstring)
    model: str | None = None
    temperature: float | None = None
    input_audio_noise_reduction: Any = None
    tracing: Any = None
    include: Any = None


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

    type: Literal["input_text", "input_audio", "input_image", "output_text", "text"]
    text: str | None = None
    audio: str | None = None
    transcript: str | None = None
    image_url: str | None = None
    detail: Literal["auto", "low", "high"] | None = None


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
