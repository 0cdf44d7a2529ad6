"""Client events: JSON text → typed dataclasses, in either dialect.

:func:`parse_client_event` raises nothing but :class:`realtime.errors.RealtimeError` subclasses,
each with a specific ``code`` (:class:`realtime.protocol.codes.ErrorCode`), the dotted ``param``
path of the offending field, and the client's ``event_id`` when the message had one.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TypeVar

from pydantic import BaseModel, ValidationError

from pipeline.tools import Tool
from realtime.errors import InvalidAudioData, ProtocolError, RealtimeError
from realtime.protocol import wire
from realtime.protocol.audio_format import AudioFormat
from realtime.protocol.codes import ErrorCode
from realtime.protocol.model import (
    DEFAULT_TURN_DETECTION,
    KEEP,
    Detail,
    ImagePart,
    ItemType,
    Keep,
    NewItem,
    OutputModality,
    ResponseParams,
    Role,
    SessionPatch,
    TranscriptionSettings,
    Truncation,
    TruncationType,
)
from realtime.protocol.names import ClientEventType, ContentType, parse_content_type
from realtime.protocol.session_update import validate_session_update
from realtime.protocol.tools import engine_tool
from realtime.protocol.turn_detection import ServerVadParams
from realtime.protocol.validation import from_validation_error


@dataclass(frozen=True)
class SessionUpdate:
    """``patch`` holds the fields that passed validation; ``refused`` one error per field that did not (each is
    answered on its own, the rest applies: :mod:`realtime.protocol.session_update`)."""

    event_id: str | None
    patch: SessionPatch
    refused: tuple[RealtimeError, ...] = ()


@dataclass(frozen=True)
class InputAudioAppend:
    """``audio`` is the decoded wire bytes, in whatever input format the session has."""

    event_id: str | None
    audio: bytes


@dataclass(frozen=True)
class InputAudioCommit:
    event_id: str | None


@dataclass(frozen=True)
class InputAudioClear:
    event_id: str | None


@dataclass(frozen=True)
class ItemCreate:
    event_id: str | None
    item: NewItem
    previous_item_id: str | None = None


@dataclass(frozen=True)
class ItemRetrieve:
    event_id: str | None
    item_id: str


@dataclass(frozen=True)
class ItemDelete:
    event_id: str | None
    item_id: str


@dataclass(frozen=True)
class ItemTruncate:
    event_id: str | None
    item_id: str
    content_index: int
    audio_end_ms: int


@dataclass(frozen=True)
class ResponseCreate:
    event_id: str | None
    params: ResponseParams = ResponseParams()


@dataclass(frozen=True)
class ResponseCancel:
    event_id: str | None
    response_id: str | None = None


@dataclass(frozen=True)
class OutputAudioClear:
    event_id: str | None


ClientEvent = (
    SessionUpdate
    | InputAudioAppend
    | InputAudioCommit
    | InputAudioClear
    | ItemCreate
    | ItemRetrieve
    | ItemDelete
    | ItemTruncate
    | ResponseCreate
    | ResponseCancel
    | OutputAudioClear
)


_UNSUPPORTED_EVENTS = {
    "transcription_session.update": "transcription sessions are not supported: this server runs conversation "
    "sessions only (configure them with 'session.update')",
}
"""Client event types of the OpenAI API that this server does not serve, with what to do instead."""


def parse_client_event(message: str | bytes) -> ClientEvent:
    """Parse one client message (a JSON object with a ``type``) into its typed event."""
    body = _load_json(message)
    event_id = body.get("event_id") if isinstance(body.get("event_id"), str) else None
    kind = body.get("type")
    if not isinstance(kind, str):
        code = ErrorCode.MISSING_REQUIRED_PARAMETER if kind is None else ErrorCode.INVALID_TYPE
        raise ProtocolError("event 'type' must be a string", code=code, param="type", event_id=event_id)
    try:
        event_type = ClientEventType(kind)
    except ValueError:
        unsupported = kind in _UNSUPPORTED_EVENTS
        error = ProtocolError(
            _UNSUPPORTED_EVENTS[kind] if unsupported else f"unknown client event type {kind!r}",
            code=ErrorCode.UNSUPPORTED_EVENT if unsupported else ErrorCode.UNKNOWN_EVENT_TYPE,
            param="type",
            event_id=event_id,
        )
        error.event_type = kind
        raise error from None
    try:
        if event_type is ClientEventType.SESSION_UPDATE:
            update, refused = validate_session_update(body, event_id)
            return SessionUpdate(update.event_id, _session_patch(update.session), refused)
        return _PARSERS[event_type](body)
    except ValidationError as exc:
        error = from_validation_error(exc, event_id)
        error.event_type = kind
        raise error from None
    except RealtimeError as exc:  # raised by the converters, which do not see the event id
        exc.event_id, exc.event_type = event_id, kind
        raise


def client_event_type(event: ClientEvent) -> ClientEventType:
    """The wire ``type`` of a parsed client event (the same in both dialects)."""
    return _EVENT_TYPES[type(event)]


def decode_base64(data: str, *, param: str) -> bytes:
    """Strict base64 (RFC 4648 alphabet, padding required) → bytes."""
    try:
        return base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise InvalidAudioData(
            f"'{param}' is not valid base64: {exc}", code=ErrorCode.INVALID_BASE64, param=param
        ) from None


def _load_json(message: str | bytes) -> dict:
    try:
        body = json.loads(message)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ProtocolError(f"message is not valid JSON: {exc}", code=ErrorCode.INVALID_JSON) from None
    except RecursionError:  # the decoder recurses per nesting level: a message may nest deeper than the stack
        raise ProtocolError("message is nested too deeply to decode", code=ErrorCode.INVALID_JSON) from None
    if not isinstance(body, dict):
        raise ProtocolError("a client event must be a JSON object", code=ErrorCode.INVALID_EVENT)
    return body


def _unsupported(message: str, param: str) -> ProtocolError:
    return ProtocolError(message, code=ErrorCode.UNSUPPORTED_VALUE, param=param)


# --- per-event conversion -----------------------------------------------------------------------


def _session_update(m: wire.SessionUpdateModel) -> SessionUpdate:
    """Without field-by-field refusal: ``parse_client_event`` validates ``session.update`` itself."""
    return SessionUpdate(m.event_id, _session_patch(m.session))


def _session_patch(s: wire.SessionModel) -> SessionPatch:
    """GA fields win over their beta spellings when a client sends both."""
    audio_in = s.audio.input if s.audio and s.audio.input else None
    audio_out = s.audio.output if s.audio and s.audio.output else None
    voice: str | Keep = KEEP
    voice_param = "session.voice"
    if audio_out is not None and audio_out.voice is not None:
        voice, voice_param = audio_out.voice, "session.audio.output.voice"
    elif s.voice is not None:
        voice = s.voice
    return SessionPatch(
        instructions=s.instructions if s.instructions is not None else KEEP,
        voice=voice,
        voice_param=voice_param,
        modality=_modality(s.output_modalities or s.modalities),
        modality_param=_modality_param("session", s),
        input_format=_format(audio_in.format if audio_in else None, s.input_audio_format),
        output_format=_format(audio_out.format if audio_out else None, s.output_audio_format),
        turn_detection=_session_turn_detection(s, audio_in),
        max_output_tokens=_max_tokens(s, "max_output_tokens", "max_response_output_tokens"),
        transcription=_session_transcription(s, audio_in),
        truncation=_truncation(s.truncation),
        tools=_tools(s.tools),
        tool_choice=s.tool_choice if s.tool_choice is not None else KEEP,
    )


def _truncation(value: str | dict | None) -> Truncation | Keep:
    """The wire value, already validated (:func:`realtime.protocol.wire._truncation`); null leaves it as it is."""
    if value is None:
        return KEEP
    if isinstance(value, str):
        return Truncation(TruncationType(value))
    limits = value.get("token_limits") or {}
    return Truncation(
        TruncationType.RETENTION_RATIO,
        retention_ratio=float(value["retention_ratio"]),
        post_instructions_tokens=limits.get("post_instructions"),
    )


def _session_transcription(
    s: wire.SessionModel, audio_in: wire.AudioInputModel | None
) -> TranscriptionSettings | None | Keep:
    """``null`` turns transcription off; an object (even empty) turns it on."""
    if audio_in is not None and "transcription" in audio_in.model_fields_set:
        m = audio_in.transcription
    elif "input_audio_transcription" in s.model_fields_set:
        m = s.input_audio_transcription
    else:
        return KEEP
    return None if m is None else TranscriptionSettings(model=m.model, language=m.language, prompt=m.prompt)


def _tools(tools: list[wire.ToolModel] | None) -> tuple[Tool, ...] | Keep:
    if tools is None:
        return KEEP
    return tuple(engine_tool(t.name, t.description, t.parameters) for t in tools)


def _session_turn_detection(
    s: wire.SessionModel, audio_in: wire.AudioInputModel | None
) -> ServerVadParams | None | Keep:
    if audio_in is not None and "turn_detection" in audio_in.model_fields_set:
        return _turn_detection(audio_in.turn_detection)
    if "turn_detection" in s.model_fields_set:
        return _turn_detection(s.turn_detection)
    return KEEP


def _turn_detection(m: wire.TurnDetectionModel | None) -> ServerVadParams | None:
    if m is None:
        return None
    d = DEFAULT_TURN_DETECTION
    create_response = d.create_response if m.create_response is None else m.create_response
    interrupt_response = d.interrupt_response if m.interrupt_response is None else m.interrupt_response
    if m.type == "semantic_vad":
        return ServerVadParams.semantic(
            m.eagerness or "auto", create_response=create_response, interrupt_response=interrupt_response
        )
    return ServerVadParams(
        threshold=d.threshold if m.threshold is None else m.threshold,
        prefix_padding_ms=d.prefix_padding_ms if m.prefix_padding_ms is None else m.prefix_padding_ms,
        silence_duration_ms=d.silence_duration_ms if m.silence_duration_ms is None else m.silence_duration_ms,
        idle_timeout_ms=m.idle_timeout_ms,
        create_response=create_response,
        interrupt_response=interrupt_response,
    )


def _modality(names: Sequence[str] | None) -> OutputModality | Keep:
    if names is None:
        return KEEP
    return OutputModality.AUDIO if "audio" in names else OutputModality.TEXT


def _modality_param(prefix: str, m: wire.SessionModel | wire.ResponseModel) -> str:
    """Where the client gave the output modality: the beta spelling only when it alone was sent."""
    return f"{prefix}.modalities" if m.output_modalities is None and m.modalities else f"{prefix}.output_modalities"


def _format(ga: wire.FormatModel | None, beta: str | None) -> AudioFormat | Keep:
    if ga is not None:
        return AudioFormat(ga.type)
    if beta is not None:
        return next(fmt for fmt in AudioFormat if fmt.beta_name == beta)
    return KEEP


def _max_tokens(model: wire.SessionModel | wire.ResponseModel, ga: str, beta: str) -> int | None | Keep:
    for name in (ga, beta):
        if name in model.model_fields_set:
            return getattr(model, name)
    return KEEP


def _append(m: wire.AppendModel) -> InputAudioAppend:
    return InputAudioAppend(m.event_id, decode_base64(m.audio, param="audio"))


def _bare(m: wire.BareEventModel) -> InputAudioCommit | InputAudioClear | OutputAudioClear:
    kind = ClientEventType(m.type)
    if kind is ClientEventType.INPUT_AUDIO_BUFFER_COMMIT:
        return InputAudioCommit(m.event_id)
    if kind is ClientEventType.INPUT_AUDIO_BUFFER_CLEAR:
        return InputAudioClear(m.event_id)
    return OutputAudioClear(m.event_id)


def _item_create(m: wire.ItemCreateModel) -> ItemCreate:
    return ItemCreate(m.event_id, _new_item(m.item), m.previous_item_id)


_ALLOWED_CONTENT = {
    Role.USER: (ContentType.INPUT_TEXT, ContentType.INPUT_AUDIO, ContentType.INPUT_IMAGE),
    Role.SYSTEM: (ContentType.INPUT_TEXT,),
    Role.ASSISTANT: (ContentType.OUTPUT_TEXT,),
}


_ITEM_FIELDS = {
    "message": ("role", "content"),
    "function_call": ("call_id", "name", "arguments"),
    "function_call_output": ("call_id", "output"),
}


def _new_item(m: wire.ItemModel) -> NewItem:
    """A message, a function call or a function call's output, with the fields its type needs and no others."""
    needed = _ITEM_FIELDS[m.type]
    for name in needed:
        if getattr(m, name) is None:
            raise ProtocolError(
                f"missing required parameter 'item.{name}' (a {m.type} item has {', '.join(needed)})",
                code=ErrorCode.MISSING_REQUIRED_PARAMETER,
                param=f"item.{name}",
            )
    for name in ("role", "content", "call_id", "name", "arguments", "output"):
        if name not in needed and getattr(m, name) is not None and not (name == "role" and m.type == "function_call"):
            raise ProtocolError(
                f"unknown parameter 'item.{name}' for a {m.type} item",
                code=ErrorCode.UNKNOWN_PARAMETER,
                param=f"item.{name}",
            )
    if m.type == "function_call":
        _check_arguments(m.arguments)
        return NewItem(
            m.id,
            Role.ASSISTANT,
            None,
            type=ItemType.FUNCTION_CALL,
            call_id=m.call_id,
            name=m.name,
            arguments=m.arguments,
        )
    if m.type == "function_call_output":
        return NewItem(m.id, Role.USER, None, type=ItemType.FUNCTION_CALL_OUTPUT, call_id=m.call_id, output=m.output)
    return _message(m)


def _check_arguments(arguments: str | None) -> None:
    try:
        value = json.loads(arguments or "")
    except json.JSONDecodeError:
        value = None
    if not isinstance(value, dict):
        raise ProtocolError(
            "'item.arguments' must be the JSON text of an object", code=ErrorCode.INVALID_VALUE, param="item.arguments"
        )


def _message(m: wire.ItemModel) -> NewItem:
    """One message of one content kind: text parts are joined, audio must be a single part; a user message with
    pictures keeps its text and picture parts in order."""
    role = Role(m.role)
    content = m.content
    assert content is not None, "_new_item checked that a message item has its content"
    kinds = [parse_content_type(part.type) for part in content]
    for i, kind in enumerate(kinds):
        if kind not in _ALLOWED_CONTENT[role]:
            allowed = ", ".join(k.value for k in _ALLOWED_CONTENT[role])
            raise _unsupported(
                f"content type '{content[i].type}' is not supported in {role.value} messages: use {allowed}",
                f"item.content.{i}.type",
            )
    if ContentType.INPUT_AUDIO in kinds:
        if len(kinds) > 1:
            raise _unsupported("an audio message must have exactly one content part", "item.content")
        return _audio_item(m.id, role, content[0])
    if ContentType.INPUT_IMAGE in kinds:
        return _picture_item(m.id, role, content, kinds)
    for i, part in enumerate(content):
        if part.text is None:
            raise ProtocolError(
                f"missing required parameter 'item.content.{i}.text'",
                code=ErrorCode.MISSING_REQUIRED_PARAMETER,
                param=f"item.content.{i}.text",
            )
    text = "".join(part.text or "" for part in content)
    return NewItem(m.id, role, _ALLOWED_CONTENT[role][0], text=text)


def _picture_item(
    item_id: str | None, role: Role, content: list[wire.ContentModel], kinds: list[ContentType | None]
) -> NewItem:
    parts: list[str | ImagePart] = []
    for i, (part, kind) in enumerate(zip(content, kinds, strict=True)):
        field = "image_url" if kind is ContentType.INPUT_IMAGE else "text"
        value = getattr(part, field)
        if value is None:
            raise ProtocolError(
                f"missing required parameter 'item.content.{i}.{field}'",
                code=ErrorCode.MISSING_REQUIRED_PARAMETER,
                param=f"item.content.{i}.{field}",
            )
        parts.append(ImagePart(value, Detail(part.detail or "auto")) if kind is ContentType.INPUT_IMAGE else value)
    return NewItem(item_id, role, ContentType.INPUT_IMAGE, parts=tuple(parts))


def _audio_item(item_id: str | None, role: Role, part: wire.ContentModel) -> NewItem:
    if part.audio is None:
        raise ProtocolError(
            "missing required parameter 'item.content.0.audio'",
            code=ErrorCode.MISSING_REQUIRED_PARAMETER,
            param="item.content.0.audio",
        )
    audio = decode_base64(part.audio, param="item.content.0.audio")
    return NewItem(item_id, role, ContentType.INPUT_AUDIO, audio=audio, transcript=part.transcript)


def _retrieve_or_delete(m: wire.ItemRefModel) -> ItemRetrieve | ItemDelete:
    if ClientEventType(m.type) is ClientEventType.CONVERSATION_ITEM_RETRIEVE:
        return ItemRetrieve(m.event_id, m.item_id)
    return ItemDelete(m.event_id, m.item_id)


def _truncate(m: wire.TruncateModel) -> ItemTruncate:
    return ItemTruncate(m.event_id, m.item_id, m.content_index, m.audio_end_ms)


def _response_create(m: wire.ResponseCreateModel) -> ResponseCreate:
    r = m.response
    if r is None:
        return ResponseCreate(m.event_id)
    out = r.audio.output if r.audio and r.audio.output else None
    voice: str | Keep = KEEP
    voice_param = "response.voice"
    if out is not None and out.voice is not None:
        voice, voice_param = out.voice, "response.audio.output.voice"
    elif r.voice is not None:
        voice = r.voice
    params = ResponseParams(
        modality=_modality(r.output_modalities or r.modalities),
        modality_param=_modality_param("response", r),
        voice=voice,
        voice_param=voice_param,
        output_format=_format(out.format if out else None, r.output_audio_format),
        max_output_tokens=_max_tokens(r, "max_output_tokens", "max_response_output_tokens"),
        instructions=r.instructions if r.instructions is not None else KEEP,
        tools=_tools(r.tools),
        tool_choice=r.tool_choice if r.tool_choice is not None else KEEP,
        metadata=r.metadata,
    )
    return ResponseCreate(m.event_id, params)


def _response_cancel(m: wire.ResponseCancelModel) -> ResponseCancel:
    return ResponseCancel(m.event_id, m.response_id)


_M = TypeVar("_M", bound=BaseModel)


def _parser(model: type[_M], convert: Callable[[_M], ClientEvent]) -> Callable[[dict], ClientEvent]:
    """Validate an event's body as ``model`` (raising pydantic's ``ValidationError``), then convert it."""
    return lambda body: convert(model.model_validate(body))


_PARSERS: dict[ClientEventType, Callable[[dict], ClientEvent]] = {
    ClientEventType.SESSION_UPDATE: _parser(wire.SessionUpdateModel, _session_update),
    ClientEventType.INPUT_AUDIO_BUFFER_APPEND: _parser(wire.AppendModel, _append),
    ClientEventType.INPUT_AUDIO_BUFFER_COMMIT: _parser(wire.BareEventModel, _bare),
    ClientEventType.INPUT_AUDIO_BUFFER_CLEAR: _parser(wire.BareEventModel, _bare),
    ClientEventType.OUTPUT_AUDIO_BUFFER_CLEAR: _parser(wire.BareEventModel, _bare),
    ClientEventType.CONVERSATION_ITEM_CREATE: _parser(wire.ItemCreateModel, _item_create),
    ClientEventType.CONVERSATION_ITEM_RETRIEVE: _parser(wire.ItemRefModel, _retrieve_or_delete),
    ClientEventType.CONVERSATION_ITEM_DELETE: _parser(wire.ItemRefModel, _retrieve_or_delete),
    ClientEventType.CONVERSATION_ITEM_TRUNCATE: _parser(wire.TruncateModel, _truncate),
    ClientEventType.RESPONSE_CREATE: _parser(wire.ResponseCreateModel, _response_create),
    ClientEventType.RESPONSE_CANCEL: _parser(wire.ResponseCancelModel, _response_cancel),
}

_EVENT_TYPES: dict[type, ClientEventType] = {
    SessionUpdate: ClientEventType.SESSION_UPDATE,
    InputAudioAppend: ClientEventType.INPUT_AUDIO_BUFFER_APPEND,
    InputAudioCommit: ClientEventType.INPUT_AUDIO_BUFFER_COMMIT,
    InputAudioClear: ClientEventType.INPUT_AUDIO_BUFFER_CLEAR,
    OutputAudioClear: ClientEventType.OUTPUT_AUDIO_BUFFER_CLEAR,
    ItemCreate: ClientEventType.CONVERSATION_ITEM_CREATE,
    ItemRetrieve: ClientEventType.CONVERSATION_ITEM_RETRIEVE,
    ItemDelete: ClientEventType.CONVERSATION_ITEM_DELETE,
    ItemTruncate: ClientEventType.CONVERSATION_ITEM_TRUNCATE,
    ResponseCreate: ClientEventType.RESPONSE_CREATE,
    ResponseCancel: ClientEventType.RESPONSE_CANCEL,
}
