"""Fuzzing the protocol layer (hypothesis): arbitrary bytes, arbitrary JSON and arbitrary event
sequences, into the sans-I/O session and over a real WebSocket, never raise out of a session; every
message the parser refuses gets exactly one ``error`` event with the five defined fields, every
event the session sends validates against the openai SDK's models of its dialect, and a session
ends with nothing left behind.

The suite runs short (``max_examples`` of a few dozen). For a long run, set ``OMNI_FUZZ_EXAMPLES``
(examples per test; RELIABILITY.md has the command and its last result)::

    OMNI_FUZZ_EXAMPLES=5000 python -m pytest tests/integration/server/test_fuzz_protocol.py -p no:cacheprovider
"""

from __future__ import annotations

import base64
import json
import os

import numpy as np
import pydantic
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipeline.errors import EngineFailure
from pipeline.response_events import OUTPUT_SAMPLE_RATE, AudioChunk, ResponseDone, ResponseStatus, TextDelta, Usage
from realtime.config import ServerConfig
from realtime.errors import ErrorType, RealtimeError
from realtime.ids import SequentialIds
from realtime.protocol.client import SessionUpdate, parse_client_event
from realtime.protocol.codes import ErrorCode
from realtime.protocol.names import ClientEventType, Dialect
from realtime.server.auth import AccessCode
from realtime.server.limits import LimitCode, RateLimit
from realtime.session import AudioTransport, Send, Session, SessionLimits, SessionSettings
from realtime.turns.server_vad import SpeechStarted, SpeechStopped

openai = pytest.importorskip("openai")
from openai.types.beta.realtime import RealtimeServerEvent as BetaServerEvent  # noqa: E402
from openai.types.realtime import RealtimeServerEvent  # noqa: E402

from tests.helpers.server import RawClient, StatsEngine, assert_clean, connect, served  # noqa: E402

pytestmark = pytest.mark.slow

ADAPTERS = {Dialect.GA: pydantic.TypeAdapter(RealtimeServerEvent), Dialect.BETA: pydantic.TypeAdapter(BetaServerEvent)}
LONG_RUN = int(os.environ.get("OMNI_FUZZ_EXAMPLES", "0"))
"""Examples per test for a long run; 0: the suite's short runs."""


def budget(short: int) -> settings:
    return settings(
        max_examples=LONG_RUN or short,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.function_scoped_fixture],
    )


ERROR_CODES = (
    {c.value for c in ErrorCode} | {c.value for c in LimitCode} | {c.value for c in AccessCode} | {EngineFailure.code}
)
ERROR_TYPES = {t.value for t in ErrorType}


def check_error(event: dict) -> dict:
    """``event`` is a well-formed ``error`` event; returns its ``error`` object."""
    assert event["type"] == "error"
    error = event["error"]
    assert set(error) == {"type", "code", "message", "param", "event_id"}, error
    assert error["type"] in ERROR_TYPES and error["code"] in ERROR_CODES, error
    assert isinstance(error["message"], str) and error["message"]
    assert error["param"] is None or isinstance(error["param"], str)
    assert error["event_id"] is None or isinstance(error["event_id"], str)
    return error


def refusal(message: str | bytes) -> tuple[bool, list[RealtimeError]]:
    """The parser's verdict on ``message``: whether it refuses the whole event (the session must answer with that
    one error), and its errors (for a ``session.update``, one per refused field: the session's first answers)."""
    try:
        event = parse_client_event(message)
    except RealtimeError as exc:
        return True, [exc]
    return False, list(event.refused) if isinstance(event, SessionUpdate) else []


# --- strategies ---------------------------------------------------------------------------------

_scalars = st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats(allow_nan=True) | st.text(max_size=24)
JSON = st.recursive(
    _scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=4),
    max_leaves=16,
)


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


_audio = st.one_of(st.binary(max_size=480).map(_b64), st.text(max_size=16), JSON)
_ints = st.integers(-5, 10**6) | st.integers(-(2**70), 2**70) | JSON
_voice = st.sampled_from(["Chelsie", "ethan", "Nobody", ""]) | st.text(max_size=8)
_modalities = st.lists(st.sampled_from(["text", "audio", "video"]), max_size=3) | JSON
_max_tokens = st.sampled_from(["inf", "INF"]) | st.integers(-3, 5000) | JSON
_format_ga = (
    st.fixed_dictionaries(
        {},
        optional={
            "type": st.sampled_from(["audio/pcm", "audio/pcmu", "audio/pcma", "audio/ogg"]),
            "rate": st.sampled_from([24000, 16000, 0]),
        },
    )
    | JSON
)
_format_beta = st.sampled_from(["pcm16", "g711_ulaw", "g711_alaw", "opus"]) | JSON
_turn_detection = (
    st.none()
    | st.fixed_dictionaries(
        {},
        optional={
            "type": st.sampled_from(["server_vad", "semantic_vad"]),
            "threshold": st.floats(allow_nan=True) | JSON,
            "prefix_padding_ms": _ints,
            "silence_duration_ms": _ints,
            "create_response": st.booleans() | JSON,
            "interrupt_response": st.booleans() | JSON,
            "idle_timeout_ms": _ints,
        },
    )
    | JSON
)
_session = (
    st.fixed_dictionaries(
        {},
        optional={
            "type": st.sampled_from(["realtime", "transcription"]),
            "instructions": st.text(max_size=40) | JSON,
            "voice": _voice,
            "output_modalities": _modalities,
            "modalities": _modalities,
            "max_output_tokens": _max_tokens,
            "max_response_output_tokens": _max_tokens,
            "turn_detection": _turn_detection,
            "input_audio_format": _format_beta,
            "output_audio_format": _format_beta,
            "audio": st.fixed_dictionaries(
                {},
                optional={
                    "input": st.fixed_dictionaries(
                        {}, optional={"format": _format_ga, "turn_detection": _turn_detection}
                    )
                    | JSON,
                    "output": st.fixed_dictionaries({}, optional={"format": _format_ga, "voice": _voice, "speed": JSON})
                    | JSON,
                },
            )
            | JSON,
            "tools": st.just([]) | JSON,
            "temperature": JSON,
        },
    )
    | JSON
)
_content = st.fixed_dictionaries(
    {},
    optional={
        "type": st.sampled_from(["input_text", "input_audio", "output_text", "text", "audio", "image"]),
        "text": st.text(max_size=24) | JSON,
        "audio": _audio,
        "transcript": st.text(max_size=12) | JSON,
    },
)
_item = (
    st.fixed_dictionaries(
        {},
        optional={
            "id": st.text(max_size=40) | JSON,
            "type": st.sampled_from(["message", "function_call"]),
            "role": st.sampled_from(["user", "assistant", "system", "tool"]),
            "content": st.lists(_content, max_size=3) | JSON,
            "status": st.sampled_from(["completed", "in_progress", "nonsense"]),
        },
    )
    | JSON
)
_response = (
    st.fixed_dictionaries(
        {},
        optional={
            "output_modalities": _modalities,
            "modalities": _modalities,
            "max_output_tokens": _max_tokens,
            "instructions": st.text(max_size=24) | JSON,
            "voice": _voice,
            "metadata": st.dictionaries(st.text(max_size=8), st.text(max_size=8), max_size=20) | JSON,
            "conversation": st.sampled_from(["auto", "none"]) | JSON,
            "audio": st.fixed_dictionaries(
                {},
                optional={"output": st.fixed_dictionaries({}, optional={"format": _format_ga, "voice": _voice}) | JSON},
            )
            | JSON,
            "output_audio_format": _format_beta,
        },
    )
    | st.none()
    | JSON
)
_item_id = st.sampled_from(["root", "item_1", "item_2", "item_3", ""]) | st.text(max_size=12) | JSON
EVENT_TYPES = [t.value for t in ClientEventType] + ["session.nonsense", "", "RESPONSE.CREATE"]
_event = st.fixed_dictionaries(
    {"type": st.sampled_from(EVENT_TYPES) | JSON},
    optional={
        "event_id": st.text(max_size=16) | JSON,
        "session": _session,
        "audio": _audio,
        "item": _item,
        "previous_item_id": _item_id | st.none(),
        "item_id": _item_id,
        "content_index": _ints,
        "audio_end_ms": _ints,
        "response": _response,
        "response_id": st.text(max_size=12) | st.none() | JSON,
        "extra": JSON,
    },
)


def _nested(depth: int, opener: str, closer: str, inside: str) -> str:
    return opener * depth + inside + closer * depth


RAW_BYTES = st.binary(max_size=300)
RAW_TEXT = st.text(max_size=300)
JSON_TEXT = JSON.map(json.dumps)
EVENT_TEXT = _event.map(json.dumps)
DEEP_JSON = st.builds(
    _nested,
    st.integers(1, 200_000),
    st.sampled_from(["[", '{"a":', '{"type": "session.update", "session": {"tracing": [']),
    st.sampled_from(["]", "}", "]}}"]),
    st.sampled_from(["", "1", "{}", "[]"]),
)
"""Nesting as deep as a message may hold (the JSON decoder recurses)."""
MESSAGES = st.one_of(RAW_BYTES, RAW_TEXT, JSON_TEXT, DEEP_JSON, EVENT_TEXT, EVENT_TEXT, EVENT_TEXT)
"""Client messages, structured events weighted up (they reach deeper than the parser)."""


# --- the sans-I/O session -----------------------------------------------------------------------


class Checked:
    """A session whose every sent event must validate against the SDK models of its dialect."""

    def __init__(self, dialect: Dialect, transport: AudioTransport) -> None:
        settings = SessionSettings(
            model="fake-omni",
            voices=("Chelsie", "Ethan"),
            default_voice="Chelsie",
            default_instructions="You are helpful.",
            dialect=dialect,
            audio_transport=transport,
            limits=SessionLimits(max_buffer_ms=2000),
        )
        self.session = Session(settings, ids=SequentialIds())
        self.adapter = ADAPTERS[dialect]
        self.sent: list[dict] = []
        self.record(self.session.start())

    def record(self, actions: list) -> list[dict]:
        events = [a.event for a in actions if isinstance(a, Send)]
        for event in events:
            json.dumps(event, allow_nan=False)  # what goes on the wire is strict JSON
            self.adapter.validate_python(event)
            if event["type"] == "error":
                check_error(event)
        self.sent.extend(events)
        return events

    def receive(self, message: str | bytes) -> list[dict]:
        events = self.record(self.session.receive(message))
        whole, expected = refusal(message)
        if whole:
            assert [e["type"] for e in events] == ["error"], events
        errors = [e.get("error", {}) for e in events[: len(expected)]]
        answers = [(e.get("code"), e.get("param"), e.get("event_id")) for e in errors]
        assert answers == [(str(x.code), x.param, x.event_id) for x in expected], events
        return events


@budget(150)
@given(message=MESSAGES)
def test_any_single_message_gets_a_defined_answer(message):
    Checked(Dialect.GA, AudioTransport.EVENTS).receive(message)


_ENGINE_OPS = st.sampled_from(["text", "audio", "done", "failed", "incomplete", "cancelled"])
_TURN_OPS = st.sampled_from(["speech_started", "speech_stopped"])
OPS = st.one_of(
    MESSAGES.map(lambda m: ("client", m)),
    _ENGINE_OPS.map(lambda op: ("engine", op)),
    _TURN_OPS.map(lambda op: ("turn", op)),
)


def _engine_event(op: str, start: int):
    if op == "text":
        return TextDelta("w", (1,))
    if op == "audio":
        return AudioChunk(np.full(OUTPUT_SAMPLE_RATE // 50, 0.1, dtype=np.float32), start)
    status = {
        "done": ResponseStatus.COMPLETED,
        "failed": ResponseStatus.FAILED,
        "incomplete": ResponseStatus.INCOMPLETE,
        "cancelled": ResponseStatus.CANCELLED,
    }[op]
    error = EngineFailure("stage broke") if op == "failed" else None
    reason = {"incomplete": "max_output_tokens", "cancelled": "client_cancelled"}.get(op)
    return ResponseDone(
        status,
        Usage(input_text_tokens=1, input_audio_tokens=2, cached_tokens=0, output_text_tokens=3, output_audio_tokens=4),
        reason=reason,
        error=error,
    )


@budget(60)
@given(
    dialect=st.sampled_from(list(Dialect)),
    transport=st.sampled_from(list(AudioTransport)),
    ops=st.lists(OPS, max_size=30),
)
def test_any_sequence_of_messages_engine_output_and_turns_keeps_the_session_sound(dialect, transport, ops):
    checked = Checked(dialect, transport)
    session = checked.session
    for kind, op in ops:
        if kind == "client":
            checked.receive(op)
        elif kind == "engine" and session.active_response_id is not None:
            checked.record(session.response_event(session.active_response_id, _engine_event(op, 0)))
        elif kind == "turn":
            clock = int(session.audio_clock_ms)
            turn = SpeechStarted(max(0, clock - 300), clock) if op == "speech_started" else SpeechStopped(clock, clock)
            checked.record(session.turn_event(turn))
        assert session.input_buffer_ms <= 2000
    created = [e["response"]["id"] for e in checked.sent if e["type"] == "response.created"]
    done = [e["response"]["id"] for e in checked.sent if e["type"] == "response.done"]
    assert done == created[: len(done)] and len(created) - len(done) in (0, 1)


# --- over a real WebSocket ----------------------------------------------------------------------

PROBE = "conversation.item.retrieve"


@pytest.fixture
async def fuzz_server():
    engine = StatsEngine()
    async with served(engine, rate_limit=RateLimit(events_per_second=1e6, burst=10**6)) as (url, app):
        yield url, app


@budget(25)
@given(messages=st.lists(st.one_of(MESSAGES, RAW_BYTES.map(bytearray)), min_size=1, max_size=6))
async def test_any_messages_over_a_websocket_get_their_errors_and_the_session_survives(fuzz_server, messages):
    """Each message is followed by a probe (a request that always fails with its own event id):
    everything the server answers before the probe's error is the message's answer. A binary
    frame (``bytearray`` here) is refused by the transport, the rest by the session. After each
    example's session the server holds nothing of it."""
    url, app = fuzz_server
    async with connect(url) as client:
        for n, message in enumerate(messages):
            frame = bytes(message) if isinstance(message, bytearray) else message
            await client.send(frame if isinstance(message, bytearray) else _as_text(frame))
            await client.send({"type": PROBE, "item_id": "__probe__", "event_id": f"probe{n}"})
            start = len(client.events)
            while True:
                event = await client.next(timeout=10)
                if event["type"] == "error" and event["error"]["event_id"] == f"probe{n}":
                    break
            answer = client.events[start:-1]
            errors = [check_error(e) for e in answer if e["type"] == "error"]
            whole, expected = (True, ["invalid_event"]) if isinstance(message, bytearray) else _verdict(frame)
            codes = [e["code"] for e in errors]
            assert (codes if whole else codes[: len(expected)]) == expected, (message, answer)
    await assert_clean(app)


def _as_text(message: str | bytes) -> str:
    """Text frames carry UTF-8: bytes that are not become the replacement character's text."""
    return message if isinstance(message, str) else message.decode("utf-8", errors="replace")


def _verdict(message: str | bytes) -> tuple[bool, list[str]]:
    """Whether a text frame is refused whole, and the error codes its answer must start with: the transport's size
    limit first, then the parser's (a session.update's refused fields, one error each)."""
    text = _as_text(message)
    if len(text.encode()) > ServerConfig().max_message_bytes:
        return True, [str(LimitCode.MESSAGE_TOO_LARGE)]
    whole, errors = refusal(text)
    return whole, [str(error.code) for error in errors]


async def test_a_text_frame_that_is_not_utf8_closes_with_1007_and_frees_the_session(fuzz_server):
    """Below the protocol: the WebSocket library refuses the frame (RFC 6455, section 8.1) and closes."""
    url, app = fuzz_server
    client = await RawClient.open(url)
    await client.until("session.created")
    await client.send(b'{"type": "\xff\xfe"}')
    assert await client.until_closed() == 1007
    client.close()
    await assert_clean(app)
