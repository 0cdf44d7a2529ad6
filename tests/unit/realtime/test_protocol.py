"""realtime.protocol: client event parsing (GA + beta), error mapping, server event builders
checked against the official openai SDK's pydantic models."""

from __future__ import annotations

import base64
import dataclasses
import json
import typing

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.response_events import Usage
from pipeline.tools import Tool, ToolChoice, ToolMode
from realtime.errors import InvalidAudioData, ProtocolError, RealtimeError
from realtime.ids import SequentialIds
from realtime.protocol.audio_format import AudioFormat
from realtime.protocol.client import (
    InputAudioAppend,
    InputAudioClear,
    InputAudioCommit,
    ItemCreate,
    ItemDelete,
    ItemRetrieve,
    ItemTruncate,
    OutputAudioClear,
    ResponseCancel,
    ResponseCreate,
    SessionUpdate,
    parse_client_event,
)
from realtime.protocol.codes import ErrorCode, StatusReason
from realtime.protocol.model import (
    KEEP,
    ContentPart,
    Item,
    ItemStatus,
    ItemType,
    OutputModality,
    ResponseSummary,
    ResponseWireStatus,
    Role,
    SessionConfig,
    SessionPatch,
    TranscriptionSettings,
)
from realtime.protocol.names import (
    CONTENT_TYPE_NAMES,
    SERVER_EVENT_NAMES,
    ClientEventType,
    ContentType,
    Dialect,
    ServerEvent,
    parse_content_type,
    server_event_name,
)
from realtime.protocol.server import ContentRef, ServerEvents, session_object
from realtime.protocol.turn_detection import ServerVadParams

openai = pytest.importorskip("openai")
pydantic = pytest.importorskip("pydantic")
from openai.types.beta import realtime as beta_types  # noqa: E402
from openai.types.realtime import realtime_client_event, realtime_server_event  # noqa: E402

GA_SERVER = pydantic.TypeAdapter(realtime_server_event.RealtimeServerEvent)
BETA_SERVER = pydantic.TypeAdapter(beta_types.RealtimeServerEvent)


def parse(event: dict):
    return parse_client_event(json.dumps(event))


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def parse_error(message) -> RealtimeError:
    """The error of a refused event; of a session.update, that of its first refused field."""
    try:
        event = parse_client_event(message if isinstance(message, (str, bytes)) else json.dumps(message))
    except RealtimeError as exc:
        return exc
    assert isinstance(event, SessionUpdate) and event.refused, f"accepted: {event}"
    return event.refused[0]


# --- client events: every type, GA shape --------------------------------------------------------


def test_session_update_ga_shape():
    event = parse(
        {
            "type": "session.update",
            "event_id": "c1",
            "session": {
                "type": "realtime",
                "instructions": "Be brief.",
                "output_modalities": ["text"],
                "max_output_tokens": 200,
                "audio": {
                    "input": {
                        "format": {"type": "audio/pcmu"},
                        "turn_detection": {
                            "type": "server_vad",
                            "threshold": 0.7,
                            "prefix_padding_ms": 100,
                            "silence_duration_ms": 800,
                            "create_response": False,
                            "interrupt_response": False,
                        },
                    },
                    "output": {"format": {"type": "audio/pcm", "rate": 24000}, "voice": "Ethan"},
                },
            },
        }
    )
    assert event == SessionUpdate(
        "c1",
        SessionPatch(
            instructions="Be brief.",
            voice="Ethan",
            voice_param="session.audio.output.voice",
            modality=OutputModality.TEXT,
            input_format=AudioFormat.PCMU,
            output_format=AudioFormat.PCM,
            turn_detection=ServerVadParams(0.7, 100, 800, False, False),
            max_output_tokens=200,
        ),
    )


def test_session_update_beta_shape_means_the_same_as_ga():
    beta = parse(
        {
            "type": "session.update",
            "session": {
                "modalities": ["text", "audio"],
                "voice": "Ethan",
                "input_audio_format": "g711_alaw",
                "output_audio_format": "g711_ulaw",
                "turn_detection": None,
                "max_response_output_tokens": "inf",
                "input_audio_transcription": None,
                "temperature": 0.8,
            },
        }
    )
    ga = parse(
        {
            "type": "session.update",
            "session": {
                "type": "realtime",
                "output_modalities": ["audio"],
                "max_output_tokens": "inf",
                "audio": {
                    "input": {"format": {"type": "audio/pcma"}, "turn_detection": None},
                    "output": {"format": {"type": "audio/pcmu"}, "voice": "Ethan"},
                },
            },
        }
    )
    assert beta.patch.voice_param == "session.voice"
    assert ga.patch.voice_param == "session.audio.output.voice"
    fields = ("voice", "modality", "input_format", "output_format", "turn_detection", "max_output_tokens")
    for name in fields:
        assert getattr(beta.patch, name) == getattr(ga.patch, name), name
    assert beta.patch.turn_detection is None and beta.patch.max_output_tokens is None


def test_session_update_leaves_out_what_is_not_given():
    patch = parse({"type": "session.update", "session": {"type": "realtime", "instructions": ""}}).patch
    assert patch == SessionPatch(instructions="")
    assert patch.turn_detection is KEEP and patch.max_output_tokens is KEEP


def test_settings_sdk_clients_send_routinely_are_accepted():
    ga = {
        "type": "realtime",
        "model": "gpt-realtime",
        "tool_choice": "auto",
        "tools": [],
        "tracing": "auto",
        "include": ["item.input_audio_transcription.logprobs"],
        "truncation": "auto",
        "prompt": None,
        "audio": {
            "input": {
                "transcription": None,
                "noise_reduction": {"type": "near_field"},
                "turn_detection": {"type": "server_vad", "idle_timeout_ms": None},
            },
            "output": {"speed": 1.0},
        },
    }
    beta = {
        "temperature": 0.7,
        "input_audio_transcription": None,
        "input_audio_noise_reduction": {"type": "far_field"},
    }
    ga_update = parse({"type": "session.update", "session": ga})
    assert ga_update.patch.turn_detection == ServerVadParams() and ga_update.refused == ()
    assert parse({"type": "session.update", "session": beta}) == SessionUpdate(None, SessionPatch(transcription=None))


def test_transcription_settings_ga_wins_over_beta_and_null_turns_it_off():
    beta = parse({"type": "session.update", "session": {"input_audio_transcription": {"model": "whisper-1"}}})
    assert beta.patch == SessionPatch(transcription=TranscriptionSettings(model="whisper-1")) and beta.refused == ()
    both = {
        "audio": {"input": {"transcription": {"model": "m", "language": "de", "prompt": "p"}}},
        "input_audio_transcription": {"model": "beta"},
    }
    patch = parse({"type": "session.update", "session": both}).patch
    assert patch.transcription == TranscriptionSettings("m", "de", "p")
    off = parse({"type": "session.update", "session": {"input_audio_transcription": None}}).patch
    assert off.transcription is None
    assert parse({"type": "session.update", "session": {"audio": {"input": {}}}}).patch.transcription is KEEP


@pytest.mark.parametrize(
    ("session", "param", "instead"),
    [
        ({"audio": {"output": {"speed": 1.2}}}, "session.audio.output.speed", "send 1.0"),
        ({"prompt": {"id": "pmpt_1"}}, "session.prompt", "session.instructions"),
        ({"tools": [{"type": "mcp", "server_label": "s"}]}, "session.tools.0.type", "send 'function' tools"),
        (
            {"audio": {"input": {"format": {"type": "audio/pcm", "rate": 16000}}}},
            "session.audio.input.format.rate",
            "24000",
        ),
        ({"type": "transcription"}, "session.type", "send 'realtime'"),
    ],
)
def test_settings_that_would_change_the_result_are_refused_as_not_supported(session, param, instead):
    """A feature of the OpenAI API this server lacks is refused as such, with what to send instead."""
    error = parse_error({"type": "session.update", "session": session})
    assert (error.code, error.param) == (ErrorCode.UNSUPPORTED_VALUE, param)
    assert "not supported" in error.message and instead in error.message, error.message


@pytest.mark.parametrize(
    ("event", "param", "words"),
    [
        (
            {"type": "response.create", "response": {"tools": [{"type": "mcp", "server_label": "s"}]}},
            "response.tools.0.type",
            "function tools only",
        ),
        ({"type": "response.create", "response": {"conversation": "none"}}, "response.conversation", "out-of-band"),
        ({"type": "response.create", "response": {"input": []}}, "response.input", "out-of-band"),
        (
            {
                "type": "conversation.item.create",
                "item": {"type": "mcp_approval_response", "approval_request_id": "r", "approve": True},
            },
            "item.type",
            "create 'message', 'function_call' or 'function_call_output' items",
        ),
        (
            {
                "type": "conversation.item.create",
                "item": {"type": "message", "role": "user", "content": [{"type": "item_reference", "id": "x"}]},
            },
            "item.content.0.type",
            "content type 'item_reference' is not supported",
        ),
    ],
)
def test_unsupported_response_and_item_features_say_so(event, param, words):
    error = parse_error(event)
    assert (error.code, error.param) == (ErrorCode.UNSUPPORTED_VALUE, param)
    assert "not supported" in error.message and words in error.message, error.message


def test_a_transcription_session_is_refused_as_an_unsupported_event():
    error = parse_error({"type": "transcription_session.update", "event_id": "t", "session": {}})
    assert (error.code, error.param, error.event_id) == (ErrorCode.UNSUPPORTED_EVENT, "type", "t")
    assert "not supported" in error.message and "session.update" in error.message


@pytest.mark.parametrize(
    ("event", "message"),
    [
        (
            {"type": "session.update", "session": {"instructions": 5}},
            "'session.instructions' must be a string, not a number",
        ),
        (
            {"type": "session.update", "session": {"output_modalities": ["video"]}},
            "'session.output_modalities.0' must be 'text' or 'audio', not 'video'",
        ),
        ({"type": "session.update", "session": {"modalities": []}}, "'session.modalities' must have at least 1 item"),
        (
            {"type": "session.update", "session": {"audio": {"input": {"format": {"type": "audio/opus"}}}}},
            "'session.audio.input.format.type' must be 'audio/pcm', 'audio/pcmu' or 'audio/pcma', not 'audio/opus'",
        ),
        (
            {"type": "session.update", "session": {"turn_detection": {"threshold": 1.5}}},
            "'session.turn_detection.threshold' must be at most 1.0, not 1.5",
        ),
        (
            {"type": "conversation.item.truncate", "item_id": "i", "content_index": 0, "audio_end_ms": -5},
            "'audio_end_ms' must be at least 0, not -5",
        ),
        (
            {"type": "conversation.item.create", "item": {"id": "x" * 33, "type": "message", "role": "user"}},
            "'item.id' must have at most 32 characters",
        ),
        (
            {"type": "session.update", "session": {"max_output_tokens": 0}},
            "'session.max_output_tokens' must be between 1 and 4096, got 0",
        ),
        ({"type": "session.update", "session": "x"}, "'session' must be an object, not a string"),
        ({"type": "response.create", "response": {"metadata": {"k": True}}}, "'response.metadata.k' must be a string"),
    ],
)
def test_validation_errors_read_as_plain_words(event, message):
    """Messages name the client's field and the rule, not the validation library's phrasing."""
    error = parse_error(event)
    assert error.message.startswith(message), error.message
    for phrase in ("Input should", "should have", "after validation", "valid dictionary", "instance of"):
        assert phrase not in error.message


def test_turn_detection_defaults_fill_missing_fields():
    patch = parse({"type": "session.update", "session": {"turn_detection": {"silence_duration_ms": 200}}}).patch
    assert patch.turn_detection == ServerVadParams(silence_duration_ms=200)


@pytest.mark.parametrize(
    ("event", "expected"),
    [
        (
            {"type": "input_audio_buffer.append", "audio": b64(b"\x01\x02\x03\x04")},
            InputAudioAppend(None, b"\x01\x02\x03\x04"),
        ),
        ({"type": "input_audio_buffer.commit", "event_id": "e"}, InputAudioCommit("e")),
        ({"type": "input_audio_buffer.clear"}, InputAudioClear(None)),
        ({"type": "output_audio_buffer.clear"}, OutputAudioClear(None)),
        ({"type": "conversation.item.retrieve", "item_id": "item_1"}, ItemRetrieve(None, "item_1")),
        ({"type": "conversation.item.delete", "item_id": "item_1"}, ItemDelete(None, "item_1")),
        (
            {"type": "conversation.item.truncate", "item_id": "i", "content_index": 0, "audio_end_ms": 1500},
            ItemTruncate(None, "i", 0, 1500),
        ),
        ({"type": "response.create"}, ResponseCreate(None)),
        ({"type": "response.cancel"}, ResponseCancel(None)),
        ({"type": "response.cancel", "response_id": "resp_1"}, ResponseCancel(None, "resp_1")),
    ],
)
def test_simple_client_events(event, expected):
    assert parse(event) == expected


def test_every_client_event_type_has_a_parser():
    minimal = {
        ClientEventType.SESSION_UPDATE: {"session": {}},
        ClientEventType.INPUT_AUDIO_BUFFER_APPEND: {"audio": ""},
        ClientEventType.CONVERSATION_ITEM_CREATE: {
            "item": {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "x"}]}
        },
        ClientEventType.CONVERSATION_ITEM_RETRIEVE: {"item_id": "i"},
        ClientEventType.CONVERSATION_ITEM_DELETE: {"item_id": "i"},
        ClientEventType.CONVERSATION_ITEM_TRUNCATE: {"item_id": "i", "content_index": 0, "audio_end_ms": 0},
    }
    for kind in ClientEventType:
        event = parse({"type": kind.value, "event_id": "x", **minimal.get(kind, {})})
        assert event.event_id == "x"


def test_item_create_text_parts_are_joined():
    event = parse(
        {
            "type": "conversation.item.create",
            "previous_item_id": "item_0",
            "item": {
                "id": "mine",
                "type": "message",
                "role": "user",
                "content": [{"type": "input_text", "text": "Hello "}, {"type": "input_text", "text": "world"}],
            },
        }
    )
    assert isinstance(event, ItemCreate) and event.previous_item_id == "item_0"
    assert (event.item.id, event.item.role, event.item.content, event.item.text) == (
        "mine",
        Role.USER,
        ContentType.INPUT_TEXT,
        "Hello world",
    )


@pytest.mark.parametrize("assistant_type", ["output_text", "text"])
def test_item_create_assistant_text_in_both_dialects(assistant_type):
    item = {"type": "message", "role": "assistant", "content": [{"type": assistant_type, "text": "Hi."}]}
    event = parse({"type": "conversation.item.create", "item": item})
    assert (event.item.role, event.item.content, event.item.text) == (Role.ASSISTANT, ContentType.OUTPUT_TEXT, "Hi.")


def test_item_create_audio_is_decoded():
    pcm = b"\x00\x10" * 100
    item = {"type": "message", "role": "user", "content": [{"type": "input_audio", "audio": b64(pcm)}]}
    event = parse({"type": "conversation.item.create", "item": item})
    assert (event.item.content, event.item.audio, event.item.text) == (ContentType.INPUT_AUDIO, pcm, None)


def test_response_create_ga_and_beta_overrides():
    ga = parse(
        {
            "type": "response.create",
            "response": {
                "output_modalities": ["text"],
                "max_output_tokens": 12,
                "instructions": "Whisper.",
                "metadata": {"k": "v"},
                "audio": {"output": {"voice": "Ethan", "format": {"type": "audio/pcma"}}},
            },
        }
    )
    beta = parse(
        {
            "type": "response.create",
            "response": {
                "modalities": ["text"],
                "max_response_output_tokens": 12,
                "instructions": "Whisper.",
                "metadata": {"k": "v"},
                "voice": "Ethan",
                "output_audio_format": "g711_alaw",
            },
        }
    )
    for event in (ga, beta):
        p = event.params
        assert (p.modality, p.max_output_tokens, p.instructions, p.metadata, p.voice, p.output_format) == (
            OutputModality.TEXT,
            12,
            "Whisper.",
            {"k": "v"},
            "Ethan",
            AudioFormat.PCMA,
        )
    assert ga.params.voice_param == "response.audio.output.voice"
    assert beta.params.voice_param == "response.voice"


# --- the official SDK's own client events parse -------------------------------------------------


def _sdk_json(model) -> str:
    return model.to_json(use_api_names=True, exclude_unset=True)


def test_events_built_with_the_ga_sdk_models_parse():
    from openai.types import realtime as ga

    events = [
        ga.SessionUpdateEvent(
            type="session.update",
            session={
                "type": "realtime",
                "instructions": "x",
                "output_modalities": ["audio"],
                "audio": {
                    "input": {
                        "format": {"type": "audio/pcm", "rate": 24000},
                        "turn_detection": {"type": "server_vad", "threshold": 0.6, "create_response": True},
                    },
                    "output": {"voice": "Chelsie", "format": {"type": "audio/pcm", "rate": 24000}},
                },
            },
        ),
        ga.InputAudioBufferAppendEvent(type="input_audio_buffer.append", audio=b64(b"\0\0")),
        ga.InputAudioBufferCommitEvent(type="input_audio_buffer.commit"),
        ga.InputAudioBufferClearEvent(type="input_audio_buffer.clear"),
        ga.ConversationItemCreateEvent(
            type="conversation.item.create",
            item={"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]},
        ),
        ga.ConversationItemRetrieveEvent(type="conversation.item.retrieve", item_id="i"),
        ga.ConversationItemDeleteEvent(type="conversation.item.delete", item_id="i"),
        ga.ConversationItemTruncateEvent(
            type="conversation.item.truncate", item_id="i", content_index=0, audio_end_ms=3
        ),
        ga.ResponseCreateEvent(type="response.create", response={"output_modalities": ["text"]}),
        ga.ResponseCancelEvent(type="response.cancel"),
        ga.OutputAudioBufferClearEvent(type="output_audio_buffer.clear"),
    ]
    parsed = [parse_client_event(_sdk_json(e)) for e in events]
    assert [type(p) for p in parsed] == [
        SessionUpdate,
        InputAudioAppend,
        InputAudioCommit,
        InputAudioClear,
        ItemCreate,
        ItemRetrieve,
        ItemDelete,
        ItemTruncate,
        ResponseCreate,
        ResponseCancel,
        OutputAudioClear,
    ]
    # and the SDK's own union covers exactly the client event types we parse
    sdk_types = {
        _literal_type(m) for m in typing.get_args(typing.get_args(realtime_client_event.RealtimeClientEvent)[0])
    }
    assert sdk_types == {t.value for t in ClientEventType}


def test_events_built_with_the_beta_sdk_models_parse():
    events = [
        beta_types.SessionUpdateEvent(
            type="session.update",
            session={
                "modalities": ["text", "audio"],
                "voice": "Ethan",
                "input_audio_format": "pcm16",
                "output_audio_format": "g711_ulaw",
                "turn_detection": {"type": "server_vad", "silence_duration_ms": 300},
            },
        ),
        beta_types.ConversationItemCreateEvent(
            type="conversation.item.create",
            item={"type": "message", "role": "assistant", "content": [{"type": "text", "text": "hey"}]},
        ),
        beta_types.ResponseCreateEvent(type="response.create", response={"modalities": ["text"], "voice": "Ethan"}),
    ]
    update, create, respond = (parse_client_event(_sdk_json(e)) for e in events)
    assert update.patch.output_format is AudioFormat.PCMU and update.patch.voice == "Ethan"
    assert update.patch.turn_detection == ServerVadParams(silence_duration_ms=300)
    assert create.item.content is ContentType.OUTPUT_TEXT and create.item.text == "hey"
    assert respond.params.modality is OutputModality.TEXT and respond.params.voice == "Ethan"


# --- parse errors -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("message", "code", "param"),
    [
        ("{not json", ErrorCode.INVALID_JSON, None),
        (b"\xff\xfe", ErrorCode.INVALID_JSON, None),
        ("[1, 2]", ErrorCode.INVALID_EVENT, None),
        ({"event_id": "e"}, ErrorCode.MISSING_REQUIRED_PARAMETER, "type"),
        ({"type": 7}, ErrorCode.INVALID_TYPE, "type"),
        ({"type": "response.audio.delta"}, ErrorCode.UNKNOWN_EVENT_TYPE, "type"),
        ({"type": "session.update"}, ErrorCode.MISSING_REQUIRED_PARAMETER, "session"),
        ({"type": "session.update", "session": {"voice": 3}}, ErrorCode.INVALID_TYPE, "session.voice"),
        ({"type": "session.update", "session": {"vocie": "x"}}, ErrorCode.UNKNOWN_PARAMETER, "session.vocie"),
        ({"type": "session.update", "session": {"type": "transcription"}}, ErrorCode.UNSUPPORTED_VALUE, "session.type"),
        ({"type": "session.update", "session": {"modalities": []}}, ErrorCode.INVALID_VALUE, "session.modalities"),
        (
            {"type": "session.update", "session": {"max_output_tokens": 0}},
            ErrorCode.INVALID_VALUE,
            "session.max_output_tokens",
        ),
        (
            {"type": "session.update", "session": {"max_output_tokens": "5"}},
            ErrorCode.INVALID_VALUE,
            "session.max_output_tokens",
        ),
        (
            {"type": "session.update", "session": {"input_audio_format": "opus"}},
            ErrorCode.INVALID_VALUE,
            "session.input_audio_format",
        ),
        (
            {"type": "session.update", "session": {"tools": [{"type": "function"}]}},
            ErrorCode.MISSING_REQUIRED_PARAMETER,
            "session.tools.0.name",
        ),
        (
            {
                "type": "session.update",
                "session": {"audio": {"input": {"format": {"type": "audio/pcm", "rate": 16000}}}},
            },
            ErrorCode.UNSUPPORTED_VALUE,
            "session.audio.input.format.rate",
        ),
        (
            {"type": "session.update", "session": {"audio": {"input": {"transcription": {"delay": "low"}}}}},
            ErrorCode.UNKNOWN_PARAMETER,
            "session.audio.input.transcription.delay",
        ),
        (
            {"type": "session.update", "session": {"turn_detection": {"threshold": 1.5}}},
            ErrorCode.INVALID_VALUE,
            "session.turn_detection.threshold",
        ),
        (
            {"type": "session.update", "session": {"turn_detection": {"silence_duration_ms": "500"}}},
            ErrorCode.INVALID_TYPE,
            "session.turn_detection.silence_duration_ms",
        ),
        ({"type": "input_audio_buffer.append"}, ErrorCode.MISSING_REQUIRED_PARAMETER, "audio"),
        ({"type": "input_audio_buffer.append", "audio": "not base64!"}, ErrorCode.INVALID_BASE64, "audio"),
        ({"type": "input_audio_buffer.append", "audio": "AAA"}, ErrorCode.INVALID_BASE64, "audio"),
        (
            {"type": "conversation.item.truncate", "item_id": "i", "content_index": 0, "audio_end_ms": -5},
            ErrorCode.INVALID_VALUE,
            "audio_end_ms",
        ),
        (
            {"type": "response.create", "response": {"conversation": "none"}},
            ErrorCode.UNSUPPORTED_VALUE,
            "response.conversation",
        ),
        ({"type": "response.cancel", "response_id": 5}, ErrorCode.INVALID_TYPE, "response_id"),
    ],
)
def test_parse_errors_have_a_specific_code_and_param(message, code, param):
    error = parse_error(message)
    assert (error.code, error.param) == (code, param)
    assert error.message


@pytest.mark.parametrize(
    ("item", "code", "param"),
    [
        (
            {"type": "function_call", "name": "f", "arguments": "{}"},
            ErrorCode.MISSING_REQUIRED_PARAMETER,
            "item.call_id",
        ),
        (
            {"type": "function_call", "call_id": "c", "name": "f", "arguments": "[1]"},
            ErrorCode.INVALID_VALUE,
            "item.arguments",
        ),
        ({"type": "function_call_output", "call_id": "c"}, ErrorCode.MISSING_REQUIRED_PARAMETER, "item.output"),
        (
            {"type": "function_call_output", "call_id": "c", "output": "x", "role": "user"},
            ErrorCode.UNKNOWN_PARAMETER,
            "item.role",
        ),
        ({"type": "reasoning", "role": "assistant", "content": []}, ErrorCode.INVALID_VALUE, "item.type"),
        (
            {"type": "message", "role": "tool", "content": [{"type": "input_text", "text": "x"}]},
            ErrorCode.INVALID_VALUE,
            "item.role",
        ),
        ({"type": "message", "role": "user", "content": []}, ErrorCode.INVALID_VALUE, "item.content"),
        (
            {"type": "message", "role": "user", "content": [{"type": "input_image"}]},
            ErrorCode.MISSING_REQUIRED_PARAMETER,
            "item.content.0.image_url",
        ),
        (
            {"type": "message", "role": "system", "content": [{"type": "input_image", "image_url": "data:,"}]},
            ErrorCode.UNSUPPORTED_VALUE,
            "item.content.0.type",
        ),
        (
            {
                "type": "message",
                "role": "user",
                "content": [{"type": "input_image", "image_url": "x", "detail": "max"}],
            },
            ErrorCode.INVALID_VALUE,
            "item.content.0.detail",
        ),
        (
            {"type": "message", "role": "user", "content": [{"type": "input_text"}]},
            ErrorCode.MISSING_REQUIRED_PARAMETER,
            "item.content.0.text",
        ),
        (
            {"type": "message", "role": "assistant", "content": [{"type": "input_text", "text": "x"}]},
            ErrorCode.UNSUPPORTED_VALUE,
            "item.content.0.type",
        ),
        (
            {"type": "message", "role": "system", "content": [{"type": "input_audio", "audio": ""}]},
            ErrorCode.UNSUPPORTED_VALUE,
            "item.content.0.type",
        ),
        (
            {"type": "message", "role": "user", "content": [{"type": "input_audio"}]},
            ErrorCode.MISSING_REQUIRED_PARAMETER,
            "item.content.0.audio",
        ),
        (
            {"type": "message", "role": "user", "content": [{"type": "input_audio", "audio": "??"}]},
            ErrorCode.INVALID_BASE64,
            "item.content.0.audio",
        ),
        (
            {
                "type": "message",
                "role": "user",
                "content": [{"type": "input_audio", "audio": ""}, {"type": "input_text", "text": "x"}],
            },
            ErrorCode.UNSUPPORTED_VALUE,
            "item.content",
        ),
        (
            {"id": "x" * 33, "type": "message", "role": "user", "content": [{"type": "input_text", "text": "x"}]},
            ErrorCode.INVALID_VALUE,
            "item.id",
        ),
    ],
)
def test_item_create_errors(item, code, param):
    error = parse_error({"type": "conversation.item.create", "event_id": "evt", "item": item})
    assert (error.code, error.param, error.event_id) == (code, param, "evt")


def test_errors_carry_the_client_event_id():
    assert parse_error({"type": "session.update", "event_id": "abc", "session": {"x": 1}}).event_id == "abc"
    assert parse_error({"type": "input_audio_buffer.append", "event_id": "b", "audio": "%%"}).event_id == "b"
    assert parse_error({"type": "nope", "event_id": "c"}).event_id == "c"
    assert parse_error({"type": "nope", "event_id": 5}).event_id is None


def test_error_classes():
    assert isinstance(parse_error("{"), ProtocolError)
    assert isinstance(parse_error({"type": "input_audio_buffer.append", "audio": "%%"}), InvalidAudioData)


_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda children: st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=8), children, max_size=3),
    max_leaves=12,
)
_field_names = st.sampled_from(
    ["session", "audio", "item", "item_id", "response", "content_index", "audio_end_ms", "event_id", "response_id"]
)


@pytest.mark.slow
@settings(max_examples=300, deadline=None)
@given(
    kind=st.sampled_from([t.value for t in ClientEventType] + ["bogus"]),
    body=st.dictionaries(_field_names, _json, max_size=4),
)
def test_parsing_raises_only_realtime_errors(kind, body):
    try:
        parse_client_event(json.dumps({"type": kind, **body}))
    except RealtimeError as exc:
        assert exc.code in {c.value for c in ErrorCode}
        assert exc.message


# --- naming table -------------------------------------------------------------------------------


def _literal_type(model) -> str:
    return typing.get_args(model.model_fields["type"].annotation)[0]


def _sdk_server_types(union) -> set[str]:
    return {_literal_type(m) for m in typing.get_args(typing.get_args(union)[0])}


def test_every_wire_name_is_a_server_event_of_that_dialect():
    ga = _sdk_server_types(realtime_server_event.RealtimeServerEvent)
    beta = _sdk_server_types(beta_types.RealtimeServerEvent)
    assert set(SERVER_EVENT_NAMES) == set(ServerEvent)
    for event, wire in SERVER_EVENT_NAMES.items():
        assert wire.ga is None or wire.ga in ga, event
        assert wire.beta is None or wire.beta in beta, event


def test_ga_and_beta_names_differ_where_the_api_does():
    assert server_event_name(ServerEvent.AUDIO_DELTA, Dialect.GA) == "response.output_audio.delta"
    assert server_event_name(ServerEvent.AUDIO_DELTA, Dialect.BETA) == "response.audio.delta"
    assert server_event_name(ServerEvent.TRANSCRIPT_DONE, Dialect.BETA) == "response.audio_transcript.done"
    assert server_event_name(ServerEvent.TEXT_DELTA, Dialect.GA) == "response.output_text.delta"
    assert server_event_name(ServerEvent.TEXT_DELTA, Dialect.BETA) == "response.text.delta"
    assert server_event_name(ServerEvent.ITEM_ADDED, Dialect.GA) == "conversation.item.added"
    assert server_event_name(ServerEvent.ITEM_ADDED, Dialect.BETA) == "conversation.item.created"
    assert server_event_name(ServerEvent.ITEM_DONE, Dialect.BETA) is None
    assert server_event_name(ServerEvent.CONVERSATION_CREATED, Dialect.GA) is None


def test_content_type_names_parse_in_both_dialects():
    for content, wire in CONTENT_TYPE_NAMES.items():
        assert parse_content_type(wire.ga) is content
        assert parse_content_type(wire.beta) is content
    assert parse_content_type("item_reference") is None


# --- server events against the SDK models -------------------------------------------------------


def _assistant_item(status=ItemStatus.COMPLETED) -> Item:
    return Item("item_2", Role.ASSISTANT, [ContentPart(ContentType.OUTPUT_AUDIO, transcript="Hi.")], status)


def _all_server_events(b: ServerEvents) -> list[dict | None]:
    config = SessionConfig(instructions="sys", voice="Chelsie")
    manual_text = SessionConfig("sys", "Ethan", OutputModality.TEXT, AudioFormat.PCMU, AudioFormat.PCMA, None, 64)
    user = Item("item_1", Role.USER, [ContentPart(ContentType.INPUT_AUDIO)])
    text = Item("item_3", Role.ASSISTANT, [ContentPart(ContentType.OUTPUT_TEXT, text="t")], ItemStatus.INCOMPLETE)
    system = Item("item_4", Role.SYSTEM, [ContentPart(ContentType.INPUT_TEXT, text="s")])
    ref = ContentRef("resp_1", "item_2")
    summary = ResponseSummary(
        "resp_1", "conv_1", ResponseWireStatus.IN_PROGRESS, OutputModality.AUDIO, "Chelsie", AudioFormat.PCM, None
    )
    done = ResponseSummary(
        "resp_1",
        "conv_1",
        ResponseWireStatus.CANCELLED,
        OutputModality.TEXT,
        "Ethan",
        AudioFormat.PCMU,
        12,
        (_assistant_item(ItemStatus.INCOMPLETE),),
        StatusReason.TURN_DETECTED,
        None,
        Usage(input_text_tokens=1, input_audio_tokens=2, cached_tokens=3, output_text_tokens=4, output_audio_tokens=5),
        {"k": "v"},
    )
    failed = ResponseSummary(
        "resp_2",
        "conv_1",
        ResponseWireStatus.FAILED,
        OutputModality.AUDIO,
        "Chelsie",
        AudioFormat.PCM,
        None,
        error={"type": "server_error", "code": "engine_failure", "message": "boom"},
        usage=Usage(),
    )
    return [
        b.error({"type": "invalid_request_error", "code": "x", "message": "m", "param": "p", "event_id": "e"}),
        b.session_created(config, session_id="sess_1", model="qwen2.5-omni"),
        b.session_updated(manual_text, session_id="sess_1", model="qwen2.5-omni"),
        b.conversation_created("conv_1"),
        b.item_added(user, None),
        b.item_done(system, "item_1"),
        b.item_added(text, "item_2"),
        b.item_retrieved(_assistant_item()),
        b.item_truncated("item_2", 0, 640),
        b.item_deleted("item_1"),
        b.input_audio_buffer_committed("item_1", None),
        b.input_audio_buffer_cleared(),
        b.speech_started(100, "item_1"),
        b.speech_stopped(900, "item_1"),
        b.timeout_triggered(1200, 6200, "item_2"),
        b.response_created(summary),
        b.response_done(done),
        b.response_done(failed),
        b.output_item_added("resp_1", 0, Item("item_2", Role.ASSISTANT, [], ItemStatus.IN_PROGRESS)),
        b.output_item_done("resp_1", 0, _assistant_item()),
        b.content_part_added(ref, ContentPart(ContentType.OUTPUT_AUDIO, transcript="")),
        b.content_part_done(ref, ContentPart(ContentType.OUTPUT_TEXT, text="t")),
        b.audio_delta(ref, b64(b"\0\0")),
        b.audio_done(ref),
        b.transcript_delta(ref, "H"),
        b.transcript_done(ref, "Hi."),
        b.text_delta(ref, "t"),
        b.text_done(ref, "t"),
        b.output_audio_buffer_started("resp_1"),
        b.output_audio_buffer_stopped("resp_1"),
        b.output_audio_buffer_cleared("resp_1"),
        b.session_updated(
            dataclasses.replace(config, transcription=TranscriptionSettings("whisper-1", "en", "Paris")),
            session_id="sess_1",
            model="qwen2.5-omni",
        ),
        b.input_transcription_delta("item_1", 0, "Hel"),
        b.input_transcription_completed(
            "item_1",
            0,
            "Hello.",
            Usage(
                input_text_tokens=1, input_audio_tokens=2, cached_tokens=0, output_text_tokens=3, output_audio_tokens=0
            ),
        ),
        b.input_transcription_failed(
            "item_1", 0, {"type": "server_error", "code": "engine_failure", "message": "boom", "param": None}
        ),
        *_function_call_events(b),
    ]


def _function_call_events(b: ServerEvents) -> list[dict | None]:
    """Tools in the session, a call streamed as an output item, a client's call output, a response of calls."""
    weather = Tool("get_weather", "The weather.", '{"type": "object", "properties": {"city": {"type": "string"}}}')
    tools = SessionConfig("sys", "Chelsie", tools=(weather, Tool("noop")), tool_choice=ToolChoice(ToolMode.REQUIRED))
    named = SessionConfig("sys", "Chelsie", tools=(weather,), tool_choice=ToolChoice(ToolMode.REQUIRED, "get_weather"))
    started = Item("item_5", Role.ASSISTANT, [], ItemStatus.IN_PROGRESS, ItemType.FUNCTION_CALL, "call_1", "f", "")
    call = Item("item_5", Role.ASSISTANT, [], ItemStatus.COMPLETED, ItemType.FUNCTION_CALL, "call_1", "f", '{"a": 1}')
    output = Item("item_6", Role.USER, type=ItemType.FUNCTION_CALL_OUTPUT, call_id="call_1", output="sunny")
    done = ResponseSummary(
        "resp_3",
        "conv_1",
        ResponseWireStatus.COMPLETED,
        OutputModality.AUDIO,
        "Chelsie",
        AudioFormat.PCM,
        None,
        (_assistant_item(), call),
        usage=Usage(
            input_text_tokens=1, input_audio_tokens=2, cached_tokens=3, output_text_tokens=4, output_audio_tokens=5
        ),
    )
    return [
        b.session_updated(tools, session_id="sess_1", model="qwen2.5-omni"),
        b.session_updated(named, session_id="sess_1", model="qwen2.5-omni"),
        b.output_item_added("resp_3", 1, started),
        b.item_added(started, "item_2"),
        b.function_call_arguments_delta("resp_3", 1, started, '{"a"'),
        b.function_call_arguments_done("resp_3", 1, call),
        b.output_item_done("resp_3", 1, call),
        b.item_done(call, "item_2"),
        b.item_added(output, "item_5"),
        b.item_retrieved(output),
        b.response_done(done),
    ]


def _extra_fields(model, path="") -> list[str]:
    """Fields the SDK model does not declare (it allows extras, so validation alone misses typos)."""
    out = []
    if isinstance(model, pydantic.BaseModel):
        out += [f"{path}.{k}" for k in (model.model_extra or {})]
        for name in type(model).model_fields:
            out += _extra_fields(getattr(model, name), f"{path}.{name}")
    elif isinstance(model, list):
        for i, value in enumerate(model):
            out += _extra_fields(value, f"{path}[{i}]")
    return out


# The session object carries its id and object type, as the OpenAI server's does; the SDK's
# session request model does not declare them.
_ALLOWED_EXTRAS = {".session.id", ".session.object"}


@pytest.mark.parametrize(("dialect", "adapter"), [(Dialect.GA, GA_SERVER), (Dialect.BETA, BETA_SERVER)])
def test_every_server_event_validates_with_the_sdk_models(dialect, adapter):
    events = [e for e in _all_server_events(ServerEvents(dialect, SequentialIds())) if e is not None]
    assert len({e["type"] for e in events}) == sum(server_event_name(k, dialect) is not None for k in ServerEvent)
    for event in events:
        model = adapter.validate_python(json.loads(json.dumps(event)))
        assert model.type == event["type"]
        assert set(_extra_fields(model)) <= _ALLOWED_EXTRAS, event["type"]


def test_event_ids_are_fresh():
    events = [e for e in _all_server_events(ServerEvents(Dialect.GA, SequentialIds())) if e is not None]
    ids = [e["event_id"] for e in events]
    assert len(set(ids)) == len(ids)


def test_dialect_shapes_of_objects():
    ga, beta = ServerEvents(Dialect.GA, SequentialIds()), ServerEvents(Dialect.BETA, SequentialIds())
    item = _assistant_item()
    assert ga.item_added(item, None)["item"]["content"][0]["type"] == "output_audio"
    assert beta.item_added(item, None)["item"]["content"][0]["type"] == "audio"
    config = SessionConfig("sys", "Ethan", input_format=AudioFormat.PCMU, max_output_tokens=5)
    ga_session = session_object(config, session_id="s", model="m", dialect=Dialect.GA)
    beta_session = session_object(config, session_id="s", model="m", dialect=Dialect.BETA)
    assert ga_session["audio"]["input"]["format"] == {"type": "audio/pcmu"}
    assert ga_session["audio"]["output"]["format"] == {"type": "audio/pcm", "rate": 24000}
    assert ga_session["output_modalities"] == ["audio"] and ga_session["max_output_tokens"] == 5
    assert beta_session["input_audio_format"] == "g711_ulaw" and beta_session["output_audio_format"] == "pcm16"
    assert beta_session["modalities"] == ["text", "audio"] and beta_session["max_response_output_tokens"] == 5
    assert "model" not in beta_session


@pytest.mark.parametrize("dialect", list(Dialect))
@pytest.mark.parametrize(
    "config",
    [
        SessionConfig("sys", "Chelsie"),
        SessionConfig("", "Ethan", OutputModality.TEXT, AudioFormat.PCMA, AudioFormat.PCMU, None, 4096),
        SessionConfig("x", "Ethan", turn_detection=ServerVadParams(0.2, 0, 1200, False, True), max_output_tokens=1),
    ],
)
def test_a_session_object_sent_back_as_an_update_gives_the_same_config(dialect, config):
    """Clients echo the session they got (minus its id) into session.update."""
    body = session_object(config, session_id="s", model="m", dialect=dialect)
    del body["id"], body["object"]
    patch = parse({"type": "session.update", "session": body}).patch
    assert (
        SessionConfig("other", "Chelsie", OutputModality.AUDIO, turn_detection=ServerVadParams()).apply(patch) == config
    )


def test_engine_errors_map_to_protocol_errors_without_internals():
    from pipeline.errors import EngineDeadError, EngineProcessError, InvalidAudioError
    from realtime.errors import to_error_payload

    bad = to_error_payload(InvalidAudioError("audio must be mono", param="audio"))
    assert (bad["type"], bad["code"], bad["param"]) == ("invalid_request_error", "invalid_audio", "audio")
    dead = to_error_payload(EngineDeadError("the engine process died (killed by signal SIGKILL)"))
    assert dead["type"] == "server_error" and dead["code"] == "engine_dead"
    # an unexpected exception inside the engine's child process names internal types: clients see none of it
    crash = to_error_payload(EngineProcessError("KeyError: 'conv_7' in core.add_text", remote_type="KeyError"))
    assert crash == {
        "type": "server_error",
        "code": "server_error",
        "message": "internal server error",
        "param": None,
        "event_id": None,
    }
