"""realtime.session: the sans-I/O state machine driven through full turns (manual and server VAD),
barge-in, truncation and every error case. No engine, no sockets: actions are inspected directly,
and every event sent is validated with the openai SDK's models for the session's dialect."""

from __future__ import annotations

import base64
import json
import logging

import numpy as np
import pydantic
import pytest

from pipeline.errors import EngineFailure, UnknownItemError
from pipeline.response_events import (
    AudioChunk,
    FunctionCallDelta,
    FunctionCallDone,
    FunctionCallStarted,
    ResponseDone,
    ResponseStatus,
    TextDelta,
    Usage,
)
from pipeline.tools import MAX_CALLS_PER_RESPONSE, ToolChoice, ToolMode
from realtime.ids import SequentialIds
from realtime.protocol.audio_format import AudioFormat
from realtime.protocol.codes import ErrorCode, StatusReason
from realtime.protocol.model import ItemStatus, Role
from realtime.protocol.names import Dialect
from realtime.protocol.turn_detection import ServerVadParams
from realtime.session import (
    AddAudio,
    AddFunctionCall,
    AddFunctionOutput,
    AddText,
    AppendAudio,
    AudioTransport,
    CancelResponse,
    ClearAudio,
    ClearOutputAudio,
    CommitAudio,
    ConfigureTurnDetection,
    DeleteItem,
    DetectSpeech,
    DropQueuedAudio,
    PlayAudio,
    Preemption,
    PreemptiveReply,
    ResponsePhase,
    Send,
    Session,
    SessionLimits,
    SessionSettings,
    SetInstructions,
    SetTools,
    StartResponse,
    Transcribe,
    TruncateItem,
)
from realtime.turns.server_vad import SpeechPaused, SpeechResumed, SpeechStarted, SpeechStopped
from realtime.voices import DEFAULT_VOICE_ALIASES

openai = pytest.importorskip("openai")
from openai.types.beta.realtime import RealtimeServerEvent as BetaServerEvent  # noqa: E402
from openai.types.realtime import RealtimeServerEvent  # noqa: E402

ADAPTERS = {Dialect.GA: pydantic.TypeAdapter(RealtimeServerEvent), Dialect.BETA: pydantic.TypeAdapter(BetaServerEvent)}
RATE = 24_000


def pcm16(ms: int, amplitude: float = 0.0) -> bytes:
    n = RATE * ms // 1000
    tone = amplitude * np.sin(2 * np.pi * 300 * np.arange(n) / RATE)
    return (tone * 32767).astype("<i2").tobytes()


def chunk(ms: int, start: int = 0) -> AudioChunk:
    n = RATE * ms // 1000
    pcm = (0.1 * np.sin(2 * np.pi * 440 * (start + np.arange(n)) / RATE)).astype(np.float32)
    return AudioChunk(pcm, start)


class Driver:
    """Drives a Session; keeps every action, and checks every event against the SDK models."""

    def __init__(
        self,
        dialect=Dialect.GA,
        transport=AudioTransport.EVENTS,
        limits=SessionLimits(),
        manual=False,
        preemptive=False,
        max_output_tokens=None,
        voice_aliases=(),
        audio_output=True,
    ):
        settings = SessionSettings(
            model="fake-omni",
            voices=("Chelsie", "Ethan") if audio_output else (),
            default_voice="Chelsie" if audio_output else None,
            audio_output=audio_output,
            default_instructions="You are helpful.",
            max_output_tokens=max_output_tokens,
            dialect=dialect,
            audio_transport=transport,
            limits=limits,
            preemptive_replies=preemptive,
            voice_aliases=voice_aliases,
        )
        self.session = Session(settings, ids=SequentialIds())
        self.adapter = ADAPTERS[dialect]
        self.log: list = []
        self.start_actions = self._record(self.session.start())
        if manual:
            self.send({"type": "session.update", "session": {"turn_detection": None}})

    def _record(self, actions: list) -> list:
        for action in actions:
            if isinstance(action, Send):
                json.dumps(action.event)
                self.adapter.validate_python(action.event)
        self.log.extend(actions)
        return actions

    def send(self, event: dict) -> list:
        return self._record(self.session.receive(json.dumps(event)))

    def append(self, ms: int, amplitude: float = 0.0) -> list:
        return self.send(
            {"type": "input_audio_buffer.append", "audio": base64.b64encode(pcm16(ms, amplitude)).decode()}
        )

    def turn(self, event) -> list:
        return self._record(self.session.turn_event(event))

    def engine(self, event, response_id: str | None = None) -> list:
        return self._record(self.session.response_event(response_id or self.session.active_response_id, event))

    def respond(self) -> list:
        return self.send({"type": "response.create"})

    def done(
        self,
        status=ResponseStatus.COMPLETED,
        reason=None,
        error=None,
        usage=Usage(
            input_text_tokens=1, input_audio_tokens=2, cached_tokens=0, output_text_tokens=3, output_audio_tokens=4
        ),
    ) -> list:
        return self.engine(ResponseDone(status, usage, reason=reason, error=error))


def events(actions: list) -> list[dict]:
    return [a.event for a in actions if isinstance(a, Send)]


def types(actions: list) -> list[str]:
    return [e["type"] for e in events(actions)]


def of(actions: list, cls) -> list:
    return [a for a in actions if isinstance(a, cls)]


def error_of(actions: list) -> dict:
    (event,) = events(actions)
    assert event["type"] == "error"
    return event["error"]


def commit_turn(d: Driver, ms: int = 200) -> str:
    """Manual mode: append and commit a user turn; returns the user item id."""
    d.append(ms)
    (commit,) = of(d.send({"type": "input_audio_buffer.commit"}), CommitAudio)
    return commit.item_id


# --- start and session.update -------------------------------------------------------------------


def test_start_announces_the_session_and_starts_vad():
    d = Driver()
    assert types(d.start_actions) == ["session.created"]
    session = events(d.start_actions)[0]["session"]
    assert session["instructions"] == "You are helpful."
    assert session["audio"]["input"]["turn_detection"]["type"] == "server_vad"
    assert session["audio"]["output"]["voice"] == "Chelsie"
    assert of(d.start_actions, ConfigureTurnDetection) == [ConfigureTurnDetection(ServerVadParams(), 0)]


def test_beta_start_also_announces_the_conversation():
    d = Driver(Dialect.BETA)
    assert types(d.start_actions) == ["session.created", "conversation.created"]
    assert events(d.start_actions)[0]["session"]["input_audio_format"] == "pcm16"


def test_session_update_applies_and_reports_the_full_config():
    d = Driver()
    acts = d.send(
        {
            "type": "session.update",
            "session": {"type": "realtime", "instructions": "Be terse.", "audio": {"output": {"voice": "ethan"}}},
        }
    )
    assert of(acts, SetInstructions) == [SetInstructions("Be terse.")]
    (updated,) = events(acts)
    assert updated["type"] == "session.updated"
    assert updated["session"]["instructions"] == "Be terse."
    assert updated["session"]["audio"]["output"]["voice"] == "Ethan"  # the engine's spelling
    assert d.session.config.voice == "Ethan"


def test_session_update_with_an_unknown_voice_refuses_the_voice_only():
    d = Driver(voice_aliases=DEFAULT_VOICE_ALIASES)
    acts = d.send({"type": "session.update", "event_id": "u1", "session": {"instructions": "x", "voice": "nova"}})
    assert types(acts) == ["error", "session.updated"]
    err = events(acts)[0]["error"]
    assert (err["code"], err["param"], err["event_id"]) == (ErrorCode.UNKNOWN_VOICE, "session.voice", "u1")
    assert "Chelsie, Ethan" in err["message"] and "marin" in err["message"]
    assert d.session.config.instructions == "x" and d.session.config.voice == "Chelsie"
    assert of(acts, SetInstructions) == [SetInstructions("x")]


def test_an_update_whose_every_field_is_refused_gets_its_errors_only():
    d = Driver()
    acts = d.send({"type": "session.update", "event_id": "u2", "session": {"voice": "marin", "bogus": 1}})
    assert types(acts) == ["error", "error"]
    assert [(e["error"]["param"], e["error"]["event_id"]) for e in events(acts)] == [
        ("session.bogus", "u2"),
        ("session.voice", "u2"),
    ]
    assert d.session.config.voice == "Chelsie"


def test_openai_voice_names_map_to_speakers_and_the_session_shows_the_name_asked_for():
    d = Driver(manual=True, voice_aliases=DEFAULT_VOICE_ALIASES)
    acts = d.send({"type": "session.update", "session": {"audio": {"output": {"voice": "marin"}}}})
    assert events(acts)[0]["session"]["audio"]["output"]["voice"] == "marin"
    commit_turn(d)
    acts = d.respond()
    assert of(acts, StartResponse)[0].voice == "Chelsie"
    assert events(acts)[0]["response"]["audio"]["output"]["voice"] == "marin"
    d.done()
    acts = d.send({"type": "response.create", "response": {"audio": {"output": {"voice": "Cedar"}}}})
    assert of(acts, StartResponse)[0].voice == "Ethan"
    assert events(acts)[0]["response"]["audio"]["output"]["voice"] == "Cedar"  # the client's own spelling


def test_an_alias_to_a_speaker_the_model_lacks_is_an_unknown_voice():
    d = Driver(voice_aliases=(("alloy", "Nobody"), ("echo", "ethan")))
    err = error_of(d.send({"type": "session.update", "session": {"voice": "alloy"}}))
    assert err["code"] == ErrorCode.UNKNOWN_VOICE and "alloy" not in err["message"].split("alias:")[-1]
    d.send({"type": "session.update", "session": {"voice": "echo"}})
    assert d.session.config.voice == "echo"


def test_a_framework_default_update_applies_all_but_the_refused_fields():
    """Each refused field gets its own error with the client's event id and its own param; the rest applies."""
    d = Driver(voice_aliases=DEFAULT_VOICE_ALIASES)
    acts = d.send(
        {
            "type": "session.update",
            "event_id": "lk_1",
            "session": {
                "type": "realtime",
                "instructions": "Be brief.",
                "tracing": "auto",
                "include": ["item.input_audio_transcription.logprobs"],
                "audio": {
                    "input": {
                        "format": {"type": "audio/pcmu"},
                        "transcription": {"model": "gpt-4o-mini-transcribe"},
                        "noise_reduction": None,
                        "turn_detection": {"type": "semantic_vad", "eagerness": "high", "interrupt_response": False},
                    },
                    "output": {"voice": "marin", "speed": 1.5},
                },
                "vocie": "x",
            },
        }
    )
    assert types(acts) == ["error", "error", "session.updated"]
    errors = [e["error"] for e in events(acts)[:2]]
    assert {(e["code"], e["param"]) for e in errors} == {
        (ErrorCode.UNSUPPORTED_VALUE, "session.audio.output.speed"),
        (ErrorCode.UNKNOWN_PARAMETER, "session.vocie"),
    }
    assert all(e["event_id"] == "lk_1" for e in errors)
    session = events(acts)[2]["session"]
    assert session["instructions"] == "Be brief." and session["audio"]["output"]["voice"] == "marin"
    assert session["audio"]["input"]["format"] == {"type": "audio/pcmu"}
    assert session["audio"]["input"]["transcription"] == {
        "model": "gpt-4o-mini-transcribe",
        "language": None,
        "prompt": None,
    }
    assert session["audio"]["input"]["turn_detection"] == {
        "type": "semantic_vad",
        "eagerness": "high",
        "create_response": True,
        "interrupt_response": False,
    }
    assert of(acts, SetInstructions) == [SetInstructions("Be brief.")]
    (configure,) = of(acts, ConfigureTurnDetection)
    assert configure.params.eagerness == "high" and not configure.params.interrupt_response


@pytest.mark.parametrize("eagerness", ["low", "medium", "auto", "high"])
@pytest.mark.parametrize("dialect", [Dialect.GA, Dialect.BETA])
def test_semantic_vad_eagerness_reaches_the_detector_and_is_echoed(dialect, eagerness):
    d = Driver(dialect)
    detection = {"type": "semantic_vad", "eagerness": eagerness}
    session = (
        {"turn_detection": detection}
        if dialect is Dialect.BETA
        else {"audio": {"input": {"turn_detection": detection}}}
    )
    acts = d.send({"type": "session.update", "session": session})
    (configure,) = of(acts, ConfigureTurnDetection)
    assert configure.params.eagerness == eagerness  # the semantic detector reads it (realtime.turns.semantic)
    (updated,) = events(acts)
    echoed = (
        updated["session"]["turn_detection"]
        if dialect is Dialect.BETA
        else updated["session"]["audio"]["input"]["turn_detection"]
    )
    assert (echoed["type"], echoed["eagerness"]) == ("semantic_vad", eagerness)


def test_semantic_vad_without_eagerness_is_auto():
    d = Driver()
    acts = d.send(
        {"type": "session.update", "session": {"audio": {"input": {"turn_detection": {"type": "semantic_vad"}}}}}
    )
    assert of(acts, ConfigureTurnDetection)[0].params == ServerVadParams.semantic("auto")
    assert events(acts)[0]["session"]["audio"]["input"]["turn_detection"]["eagerness"] == "auto"


@pytest.mark.parametrize(
    "detection",
    [
        {"type": "semantic_vad", "silence_duration_ms": 300},
        {"type": "semantic_vad", "idle_timeout_ms": 5000},
        {"type": "server_vad", "eagerness": "low"},
        {"type": "semantic_vad", "eagerness": "eager"},
        {"type": "server_vad", "threshold": 2.0, "silence_duration_ms": 900},
    ],
)
def test_turn_detection_is_refused_as_a_whole_and_the_rest_applies(detection):
    d = Driver()
    acts = d.send(
        {
            "type": "session.update",
            "event_id": "t1",
            "session": {"instructions": "x", "audio": {"input": {"turn_detection": detection}}},
        }
    )
    assert types(acts) == ["error", "session.updated"]
    err = events(acts)[0]["error"]
    assert err["param"].startswith("session.audio.input.turn_detection") and err["event_id"] == "t1"
    assert err["code"] == ErrorCode.INVALID_VALUE
    assert d.session.config.turn_detection == ServerVadParams() and not of(acts, ConfigureTurnDetection)
    assert d.session.config.instructions == "x"


def test_turning_vad_off_reconfigures_detection_at_the_current_clock():
    d = Driver()
    d.append(100)
    acts = d.send({"type": "session.update", "session": {"audio": {"input": {"turn_detection": None}}}})
    assert of(acts, ConfigureTurnDetection) == [ConfigureTurnDetection(None, 100)]
    assert d.session.config.turn_detection is None


# --- manual turns -------------------------------------------------------------------------------


def test_manual_turn_with_audio_reply():
    d = Driver(manual=True)
    appended = d.append(200)
    assert of(appended, AppendAudio) == [AppendAudio("item_1", pcm16(200), AudioFormat.PCM)]
    assert events(appended) == [] and of(appended, DetectSpeech) == []

    acts = d.send({"type": "input_audio_buffer.commit"})
    assert of(acts, CommitAudio) == [CommitAudio("item_1")]
    assert types(acts) == ["input_audio_buffer.committed", "conversation.item.added", "conversation.item.done"]
    assert events(acts)[1]["item"]["content"] == [{"type": "input_audio", "transcript": None}]

    acts = d.respond()
    assert types(acts) == [
        "response.created",
        "response.output_item.added",
        "conversation.item.added",
        "response.content_part.added",
    ]
    (start,) = of(acts, StartResponse)
    assert start == StartResponse("resp_1", "item_2", frozenset({"text", "audio"}), "Chelsie", None)
    assert events(acts)[2]["previous_item_id"] == "item_1"

    streamed = d.engine(TextDelta("Hi", (1,))) + d.engine(chunk(40)) + d.engine(TextDelta(" you", (2,)))
    assert types(streamed) == [
        "response.output_audio_transcript.delta",
        "response.output_audio.delta",
        "response.output_audio_transcript.delta",
    ]
    audio = base64.b64decode(events(streamed)[1]["delta"])
    expected = np.clip(np.rint(chunk(40).pcm.astype(np.float64) * 32768), -32768, 32767).astype("<i2").tobytes()
    assert audio == expected

    acts = d.done()
    assert types(acts) == [
        "response.output_audio.done",
        "response.output_audio_transcript.done",
        "response.content_part.done",
        "response.output_item.done",
        "conversation.item.done",
        "response.done",
    ]
    by_type = {e["type"]: e for e in events(acts)}
    assert by_type["response.output_audio_transcript.done"]["transcript"] == "Hi you"
    response = by_type["response.done"]["response"]
    assert (response["status"], response["status_details"]) == ("completed", {"type": "completed"})
    assert response["output"][0]["content"] == [{"type": "output_audio", "transcript": "Hi you"}]
    assert response["usage"]["total_tokens"] == 10 and response["usage"]["output_token_details"]["audio_tokens"] == 4
    assert [(i.id, i.role, i.status) for i in d.session.items] == [
        ("item_1", Role.USER, ItemStatus.COMPLETED),
        ("item_2", Role.ASSISTANT, ItemStatus.COMPLETED),
    ]
    assert d.session.items[1].content[0].audio_ms == pytest.approx(40.0)
    assert d.session.active_response_id is None


def test_beta_names_for_the_same_turn():
    d = Driver(Dialect.BETA, manual=True)
    commit = d.send({"type": "input_audio_buffer.commit"})  # nothing appended yet
    assert error_of(commit)["code"] == ErrorCode.INPUT_AUDIO_BUFFER_COMMIT_EMPTY
    d.append(200)
    assert types(d.send({"type": "input_audio_buffer.commit"})) == [
        "input_audio_buffer.committed",
        "conversation.item.created",
    ]
    acts = d.respond() + d.engine(TextDelta("Hi", (1,))) + d.engine(chunk(20)) + d.done()
    assert types(acts) == [
        "response.created",
        "response.output_item.added",
        "conversation.item.created",
        "response.content_part.added",
        "response.audio_transcript.delta",
        "response.audio.delta",
        "response.audio.done",
        "response.audio_transcript.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.done",
    ]
    assert events(acts)[-1]["response"]["output"][0]["content"][0]["type"] == "audio"


def test_text_only_response():
    d = Driver(manual=True)
    commit_turn(d)
    acts = d.send({"type": "response.create", "response": {"output_modalities": ["text"], "max_output_tokens": 7}})
    assert of(acts, StartResponse)[0].modalities == frozenset({"text"})
    assert of(acts, StartResponse)[0].max_output_tokens == 7
    assert events(acts)[-1]["part"] == {"type": "text", "text": ""}
    acts = d.engine(TextDelta("Paris", (1,))) + d.engine(chunk(20)) + d.done()
    assert types(acts)[:2] == ["response.output_text.delta", "response.output_text.done"]
    assert events(acts)[1]["text"] == "Paris"
    assert "response.output_audio.delta" not in types(acts)


@pytest.mark.parametrize("dialect", [Dialect.GA, Dialect.BETA])
def test_an_engine_without_audio_output_makes_a_text_session_and_refuses_audio(dialect):
    """Text is the session's default (clients that keep the defaults get text replies); asking for audio, in the
    session or in one response, is an ``unsupported_value`` error at the client's path, and the session goes on."""
    beta = dialect is Dialect.BETA
    d = Driver(dialect, manual=True, audio_output=False)
    created = events(d.start_actions)[0]["session"]
    assert created["modalities" if beta else "output_modalities"] == ["text"]
    assert (created["voice"] if beta else created["audio"]["output"]["voice"]) is None

    modalities = {"modalities": ["text", "audio"]} if beta else {"output_modalities": ["audio"]}
    acts = d.send({"type": "session.update", "event_id": "s1", "session": {**modalities, "instructions": "Be brief."}})
    error, updated = events(acts)
    assert error["type"] == "error" and error["error"]["code"] == ErrorCode.UNSUPPORTED_VALUE
    assert (error["error"]["param"], error["error"]["event_id"]) == (f"session.{next(iter(modalities))}", "s1")
    assert "text only" in error["error"]["message"]
    assert updated["session"]["instructions"] == "Be brief."  # the other fields apply
    assert updated["session"]["modalities" if beta else "output_modalities"] == ["text"]
    acts = d.send({"type": "session.update", "session": {"voice": "Ethan"}})
    assert [e["error"]["code"] for e in events(acts)] == [ErrorCode.UNKNOWN_VOICE]

    commit_turn(d)
    acts = d.send({"type": "response.create", "event_id": "r1", "response": modalities})
    (error,) = events(acts)
    assert error["error"]["code"] == ErrorCode.UNSUPPORTED_VALUE and error["error"]["event_id"] == "r1"
    assert error["error"]["param"] == f"response.{next(iter(modalities))}"
    assert not of(acts, StartResponse) and d.session.active_response_id is None

    acts = d.respond()  # the defaults: a text reply
    (start,) = of(acts, StartResponse)
    assert (start.modalities, start.voice) == (frozenset({"text"}), None)
    acts = d.engine(TextDelta("Paris", (1,))) + d.done()
    assert (events(acts)[0]["type"], events(acts)[0]["delta"]) == (
        "response.text.delta" if beta else "response.output_text.delta",
        "Paris",
    )
    assert events(acts)[-1]["response"]["status"] == "completed"


def test_the_engine_cap_limits_a_reply_and_the_response_shows_it():
    d = Driver(manual=True, max_output_tokens=50)
    assert d.start_actions and events(d.start_actions)[0]["session"]["max_output_tokens"] == "inf"
    commit_turn(d)
    acts = d.respond()  # the session says "inf": the engine's cap applies and is shown
    assert of(acts, StartResponse)[0].max_output_tokens == 50
    assert events(acts)[0]["response"]["max_output_tokens"] == 50
    acts = d.done(ResponseStatus.INCOMPLETE, reason="max_output_tokens")
    response = events(acts)[-1]["response"]
    assert response["max_output_tokens"] == 50
    assert response["status_details"] == {"type": "incomplete", "reason": "max_output_tokens"}
    acts = d.send({"type": "response.create", "response": {"max_output_tokens": 7}})
    assert of(acts, StartResponse)[0].max_output_tokens == 7  # a lower limit asked for is kept
    d.done()
    acts = d.send({"type": "response.create", "response": {"max_output_tokens": 4096}})
    assert of(acts, StartResponse)[0].max_output_tokens == 50
    assert events(acts)[0]["response"]["max_output_tokens"] == 50


def test_g711_output_is_counted_in_wire_milliseconds():
    d = Driver(manual=True)
    d.send({"type": "session.update", "session": {"audio": {"output": {"format": {"type": "audio/pcmu"}}}}})
    commit_turn(d)
    d.respond()
    for i in range(5):
        d.engine(chunk(40, start=i * 960))
    d.done()
    sent = [base64.b64decode(e["delta"]) for e in events(d.log) if e["type"] == "response.output_audio.delta"]
    total = sum(len(s) for s in sent)
    assert total == 8000 * 200 // 1000  # every sample arrives, at 8 kHz, one byte each
    assert d.session.items[-1].content[0].audio_ms == pytest.approx(200.0)


def test_response_instructions_apply_to_that_response_only():
    d = Driver(manual=True)
    commit_turn(d)
    acts = d.send({"type": "response.create", "response": {"instructions": "Say bye."}})
    assert [type(a) for a in acts if not isinstance(a, Send)] == [SetInstructions, StartResponse]
    assert of(acts, SetInstructions) == [SetInstructions("Say bye.")]
    assert of(d.done(), SetInstructions) == [SetInstructions("You are helpful.")]


def test_failed_and_incomplete_responses():
    d = Driver(manual=True)
    commit_turn(d)
    d.respond()
    acts = d.done(ResponseStatus.FAILED, reason="error", error=EngineFailure("talker crashed"))
    response = events(acts)[-1]["response"]
    assert response["status"] == "failed"
    assert response["status_details"]["error"] == {
        "type": "server_error",
        "code": "engine_failure",
        "message": "talker crashed",
    }
    assert response["output"][0]["status"] == "incomplete"

    d.respond()
    acts = d.done(ResponseStatus.INCOMPLETE, reason="max_output_tokens")
    assert events(acts)[-1]["response"]["status_details"] == {"type": "incomplete", "reason": "max_output_tokens"}


def test_a_response_that_cannot_start_ends_as_failed():
    d = Driver(manual=True)
    commit_turn(d)
    (start,) = of(d.respond(), StartResponse)
    acts = d._record(d.session.command_failed(start, UnknownItemError("no such item", param="item_id")))
    response = events(acts)[-1]["response"]
    assert (response["status"], response["status_details"]["error"]["code"]) == ("failed", "item_not_found")
    assert d.session.active_response_id is None


def test_other_command_failures_become_error_events():
    d = Driver(manual=True)
    item_id = commit_turn(d)
    err = error_of(d._record(d.session.command_failed(CommitAudio(item_id), EngineFailure("prefill failed"))))
    assert (err["type"], err["code"]) == ("server_error", "engine_failure")


def test_errors_of_a_requested_response_carry_the_event_id_of_its_response_create():
    """A failure while the response runs (engine output, or its start) answers the response.create that asked."""
    d = Driver(manual=True)
    commit_turn(d)
    d.send({"type": "response.create", "event_id": "rc_1"})
    acts = d.done(ResponseStatus.FAILED, reason="error", error=EngineFailure("talker crashed"))
    assert types(acts)[-2:] == ["error", "response.done"]
    assert (events(acts)[-2]["error"]["event_id"], events(acts)[-2]["error"]["code"]) == ("rc_1", "engine_failure")
    (start,) = of(d.send({"type": "response.create", "event_id": "rc_2"}), StartResponse)
    assert start.event_id == "rc_2"
    acts = d._record(d.session.command_failed(start, UnknownItemError("no such item", param="item_id")))
    assert events(acts)[-2]["error"]["event_id"] == "rc_2"
    (start,) = of(d.respond(), StartResponse)  # no event_id sent: none to carry
    assert events(d._record(d.session.command_failed(start, EngineFailure("x"))))[-2]["error"]["event_id"] is None


def test_a_failed_command_answers_the_client_event_that_caused_it():
    d = Driver(manual=True)
    item = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]}
    (add,) = of(d.send({"type": "conversation.item.create", "event_id": "ic_1", "item": item}), AddText)
    assert add.event_id == "ic_1" and add == AddText(add.item_id, "hi", Role.USER)  # the id is not compared
    err = error_of(d._record(d.session.command_failed(add, EngineFailure("prefill failed"))))
    assert (err["code"], err["event_id"]) == ("engine_failure", "ic_1")
    (append,) = of(d.append(100), AppendAudio)
    assert append.event_id is None  # the append had no event_id


def test_a_failed_tool_command_answers_the_client_event_that_caused_it():
    """Every engine command carries its client event's id, function calling's too (a failure of one is an error
    event, not an AttributeError)."""
    d = Driver(manual=True)
    update = {"type": "session.update", "event_id": "su_1", "session": {"tools": [WEATHER]}}
    (set_tools,) = of(d.send(update), SetTools)
    assert set_tools.event_id == "su_1"
    err = error_of(d._record(d.session.command_failed(set_tools, EngineFailure("prompt too long"))))
    assert (err["code"], err["event_id"]) == ("engine_failure", "su_1")
    call = {"type": "function_call", "call_id": "c1", "name": "weather", "arguments": "{}"}
    (add,) = of(d.send({"type": "conversation.item.create", "event_id": "ic_2", "item": call}), AddFunctionCall)
    err = error_of(d._record(d.session.command_failed(add, EngineFailure("prefill failed"))))
    assert (err["code"], err["event_id"]) == ("engine_failure", "ic_2")


def test_a_response_started_by_turn_detection_fails_with_no_event_id():
    d = Driver()
    d.send({"type": "input_audio_buffer.append", "event_id": "a1", "audio": base64.b64encode(pcm16(600)).decode()})
    d.turn(SpeechStarted(0, 0))
    (start,) = of(d.turn(SpeechStopped(600, 100)), StartResponse)
    assert start.event_id is None
    acts = d.done(ResponseStatus.FAILED, reason="error", error=EngineFailure("talker crashed"))
    assert events(acts)[-2]["error"]["event_id"] is None


# --- server VAD turns ---------------------------------------------------------------------------


def test_vad_holds_silence_and_sends_speech_from_its_start():
    d = Driver()
    held = []
    for _ in range(10):  # 1 s of silence: detected on, nothing reaches the engine
        acts = d.append(100)
        assert of(acts, AppendAudio) == []
        assert of(acts, DetectSpeech) == [DetectSpeech(pcm16(100), AudioFormat.PCM)]
        held.append(acts)
    assert d.session.input_buffer_ms <= 300 + 500  # prefix padding + lookback

    acts = d.append(100, amplitude=0.5)  # speech in the 1000–1100 ms chunk
    assert of(acts, AppendAudio) == []
    acts = d.turn(SpeechStarted(audio_start_ms=700, speech_start_ms=1000))
    assert types(acts) == ["input_audio_buffer.speech_started"]
    assert events(acts)[0]["audio_start_ms"] == 700 and events(acts)[0]["item_id"] == "item_1"
    # the held chunks ending after 700 ms: 700–800, 800–900, 900–1000 and the speech chunk
    assert len(of(acts, AppendAudio)) == 4 and of(acts, AppendAudio)[-1].audio == pcm16(100, 0.5)

    assert len(of(d.append(100, amplitude=0.5), AppendAudio)) == 1  # speaking: streamed at once
    for _ in range(5):
        assert len(of(d.append(100), AppendAudio)) == 1
    acts = d.turn(SpeechStopped(audio_end_ms=1700, speech_end_ms=1200))
    assert types(acts) == [
        "input_audio_buffer.speech_stopped",
        "input_audio_buffer.committed",
        "conversation.item.added",
        "conversation.item.done",
        "response.created",
        "response.output_item.added",
        "conversation.item.added",
        "response.content_part.added",
    ]
    assert events(acts)[0]["audio_end_ms"] == 1700
    assert of(acts, CommitAudio) == [CommitAudio("item_1")]
    assert of(acts, StartResponse)[0].item_id == "item_2"
    # the next turn's audio belongs to a new item
    d.append(100)
    acts = d.turn(SpeechStarted(1800, 1800))
    assert events(acts)[0]["item_id"] == "item_3"


def test_vad_without_create_response_only_commits():
    d = Driver()
    d.send({"type": "session.update", "session": {"turn_detection": {"create_response": False}}})
    d.append(100, 0.5)
    d.turn(SpeechStarted(0, 0))
    d.append(600)
    acts = d.turn(SpeechStopped(700, 100))
    assert "input_audio_buffer.committed" in types(acts) and of(acts, StartResponse) == []


def test_stale_turn_events_after_vad_was_turned_off_are_ignored():
    d = Driver(manual=True)
    assert d.turn(SpeechStarted(0, 0)) == [] and d.turn(SpeechStopped(500, 0)) == []


def test_manual_commit_during_speech_restarts_detection():
    d = Driver()
    d.append(200, 0.5)
    d.turn(SpeechStarted(0, 0))
    acts = d.send({"type": "input_audio_buffer.commit"})
    assert of(acts, ConfigureTurnDetection) == [ConfigureTurnDetection(ServerVadParams(), 200)]
    assert "input_audio_buffer.committed" in types(acts)
    assert d.turn(SpeechStopped(700, 200)) == []  # no longer speaking: nothing to stop


def test_turning_vad_off_keeps_held_audio_for_the_manual_commit():
    d = Driver()
    d.append(200)
    acts = d.send({"type": "session.update", "session": {"turn_detection": None}})
    assert of(acts, AppendAudio) == [AppendAudio("item_1", pcm16(200), AudioFormat.PCM)]
    assert of(d.send({"type": "input_audio_buffer.commit"}), CommitAudio) == [CommitAudio("item_1")]


# --- barge-in -----------------------------------------------------------------------------------


def start_vad_response(d: Driver) -> str:
    d.append(300, 0.5)
    d.turn(SpeechStarted(0, 0))
    d.append(600)
    d.turn(SpeechStopped(900, 300))
    assert d.session.active_response_id is not None
    return d.session.active_response_id


def test_barge_in_cancels_and_no_audio_follows_the_decision():
    d = Driver()
    rid = start_vad_response(d)
    sent = d.engine(TextDelta("Once upon", (1,))) + d.engine(chunk(40)) + d.engine(chunk(40, 960))
    assert types(sent).count("response.output_audio.delta") == 2

    d.append(100, 0.5)
    acts = d.turn(SpeechStarted(1000, 1000))
    assert types(acts) == ["input_audio_buffer.speech_started"]
    assert of(acts, CancelResponse) == [CancelResponse(rid, StatusReason.TURN_DETECTED)]
    assert of(acts, DropQueuedAudio) == [DropQueuedAudio(rid)]
    assert d.session.response_phase is ResponsePhase.CANCELLING

    late = d.engine(chunk(40, 1920)) + d.engine(TextDelta(" a time", (2,)))  # the engine's last step
    assert late == []
    acts = d.done(ResponseStatus.COMPLETED)  # even if the engine managed to finish
    response = events(acts)[-1]["response"]
    assert (response["status"], response["status_details"]) == (
        "cancelled",
        {"type": "cancelled", "reason": "turn_detected"},
    )
    assert response["output"][0]["status"] == "incomplete"
    assert response["output"][0]["content"][0]["transcript"] == "Once upon"
    assert "response.output_audio.delta" not in types(acts)  # no flush of a cancelled response
    assert d.session.items[-1].content[0].audio_ms == pytest.approx(80.0)


def test_speech_stopping_while_the_cancel_winds_down_starts_the_next_response_after_it():
    d = Driver()
    first = start_vad_response(d)
    d.append(300, 0.5)
    d.turn(SpeechStarted(1000, 1000))
    d.append(600)
    acts = d.turn(SpeechStopped(1900, 1300))
    assert "input_audio_buffer.committed" in types(acts) and of(acts, StartResponse) == []
    acts = d.done(ResponseStatus.CANCELLED, reason="turn_detected")
    assert types(acts)[-5:] == [
        "response.done",
        "response.created",
        "response.output_item.added",
        "conversation.item.added",
        "response.content_part.added",
    ]
    (start,) = of(acts, StartResponse)
    assert start.response_id != first and d.session.active_response_id == start.response_id


# --- input audio transcription ---

TRANSCRIPTION_EVENTS = (
    "conversation.item.input_audio_transcription.delta",
    "conversation.item.input_audio_transcription.completed",
    "conversation.item.input_audio_transcription.failed",
)


def transcribing(d: Driver, **settings) -> Driver:
    """Turn input transcription on (GA or beta spelling, by the driver's dialect)."""
    body = {"model": "gpt-4o-transcribe", **settings}
    session = (
        {"audio": {"input": {"transcription": body}}}
        if d.session.dialect is Dialect.GA
        else {"input_audio_transcription": body}
    )
    (updated,) = events(d.send({"type": "session.update", "session": session}))
    assert updated["type"] == "session.updated"
    return d


def shown_transcription(session: dict, dialect: Dialect) -> dict | None:
    return session["audio"]["input"]["transcription"] if dialect is Dialect.GA else session["input_audio_transcription"]


@pytest.mark.parametrize("dialect", [Dialect.GA, Dialect.BETA])
def test_transcription_settings_are_applied_echoed_and_turned_off_with_null(dialect):
    d = transcribing(Driver(dialect), language="en", prompt="Paris")
    session = events(d.log[-1:])[0]["session"]
    assert shown_transcription(session, dialect) == {"model": "gpt-4o-transcribe", "language": "en", "prompt": "Paris"}
    off = (
        {"audio": {"input": {"transcription": None}}} if dialect is Dialect.GA else {"input_audio_transcription": None}
    )
    session = events(d.send({"type": "session.update", "session": off}))[0]["session"]
    assert d.session.config.transcription is None and shown_transcription(session, dialect) is None
    # an update that does not name transcription leaves it as it is
    transcribing(d)
    d.send({"type": "session.update", "session": {"instructions": "x"}})
    assert d.session.config.transcription is not None


def test_an_unknown_transcription_field_is_refused_by_name():
    d = Driver()
    body = {"audio": {"input": {"transcription": {"model": "whisper-1", "delay": "low"}}}}
    err = error_of(d.send({"type": "session.update", "event_id": "u1", "session": body}))
    assert (err["code"], err["param"]) == (ErrorCode.UNKNOWN_PARAMETER, "session.audio.input.transcription.delay")
    assert d.session.config.transcription is None


def test_a_manual_commit_asks_for_its_transcription_after_the_commit():
    d = transcribing(Driver(manual=True), language="fr", prompt="Paris")
    d.append(200)
    acts = d.send({"type": "input_audio_buffer.commit"})
    (commit,) = of(acts, CommitAudio)
    assert of(acts, Transcribe) == [Transcribe(commit.item_id, 0, "fr", "Paris")]
    assert acts.index(of(acts, Transcribe)[0]) > acts.index(commit)
    plain = Driver(manual=True)
    plain.append(200)
    assert of(plain.send({"type": "input_audio_buffer.commit"}), Transcribe) == []


def test_a_vad_turn_asks_for_its_transcription_after_starting_the_reply():
    d = transcribing(Driver())
    start_vad_response(d)
    (commit,) = of(d.log, CommitAudio)
    (start,) = of(d.log, StartResponse)
    (transcribe,) = of(d.log, Transcribe)
    assert d.log.index(commit) < d.log.index(start) < d.log.index(transcribe)
    assert transcribe.item_id == commit.item_id


def test_a_vad_turn_without_create_response_is_transcribed_too():
    d = transcribing(Driver())
    d.send({"type": "session.update", "session": {"turn_detection": {"create_response": False}}})
    d.append(100, 0.5)
    d.turn(SpeechStarted(0, 0))
    d.append(600)
    acts = d.turn(SpeechStopped(700, 100))
    assert of(acts, StartResponse) == [] and len(of(acts, Transcribe)) == 1


@pytest.mark.parametrize("dialect", [Dialect.GA, Dialect.BETA])
def test_transcription_results_become_sdk_valid_events_and_the_items_transcript(dialect):
    d = transcribing(Driver(dialect, manual=True))
    item = commit_turn(d)
    acts = d._record(d.session.transcription_delta(item, 0, "Hello"))
    acts += d._record(d.session.transcription_delta(item, 0, ""))  # nothing to say
    acts += d._record(d.session.transcription_delta(item, 0, " world."))
    usage = Usage(input_text_tokens=20, input_audio_tokens=50, output_text_tokens=4)
    acts += d._record(d.session.transcription_completed(item, 0, "Hello world.", usage))
    assert types(acts) == [TRANSCRIPTION_EVENTS[0], TRANSCRIPTION_EVENTS[0], TRANSCRIPTION_EVENTS[1]]
    delta, _, completed = events(acts)
    assert (delta["item_id"], delta["content_index"], delta["delta"]) == (item, 0, "Hello")
    assert (completed["item_id"], completed["content_index"], completed["transcript"]) == (item, 0, "Hello world.")
    assert completed["usage"] == {
        "type": "tokens",
        "input_tokens": 70,
        "output_tokens": 4,
        "total_tokens": 74,
        "input_token_details": {"text_tokens": 20, "audio_tokens": 50},
    }
    retrieved = events(d.send({"type": "conversation.item.retrieve", "item_id": item}))[0]
    assert retrieved["item"]["content"] == [{"type": "input_audio", "transcript": "Hello world."}]


def test_a_failed_transcription_reports_its_error_for_the_item(caplog):
    d = transcribing(Driver(manual=True))
    item = commit_turn(d)
    with caplog.at_level(logging.INFO, logger="realtime.observe.error_log"):
        acts = d._record(d.session.transcription_failed(item, 0, EngineFailure("engine fell over")))
    (failed,) = events(acts)
    assert failed["type"] == TRANSCRIPTION_EVENTS[2] and failed["item_id"] == item
    assert failed["error"]["code"] == EngineFailure("x").code and failed["error"]["message"] == "engine fell over"
    assert set(failed["error"]) == {"type", "code", "message", "param"}
    assert "engine fell over" in caplog.text
    unexpected = d._record(d.session.transcription_failed(item, 0, KeyError("internal")))
    assert events(unexpected)[0]["error"]["code"] == ErrorCode.SERVER_ERROR  # no internals reach the client


def test_results_for_a_deleted_item_are_dropped():
    d = transcribing(Driver(manual=True))
    item = commit_turn(d)
    d.send({"type": "conversation.item.delete", "item_id": item})
    assert d.session.transcription_delta(item, 0, "Hello") == []
    assert d.session.transcription_completed(item, 0, "Hello", Usage()) == []
    assert d.session.transcription_failed(item, 0, EngineFailure("x")) == []


def test_a_preemptive_replys_transcription_is_held_with_it():
    d = transcribing(Driver(preemptive=True))
    user, rid = paused_turn(d)
    assert of(d.log, Transcribe) == []  # held: the client has not seen the commit yet
    acts = d.turn(SpeechStopped(audio_end_ms=800, speech_end_ms=300))
    assert of(acts, Transcribe) == [Transcribe(user, 0)]
    # a withdrawn reply's transcription is never asked for; the message's next commit asks once
    w = transcribing(Driver(preemptive=True))
    user, rid = paused_turn(w)
    w.turn(SpeechResumed(speech_start_ms=600))
    w.append(200, 0.5)
    w.turn(SpeechStopped(audio_end_ms=1400, speech_end_ms=900))
    assert of(w.log, Transcribe) == [Transcribe(user, 0)]


# --- preemptive replies (SpeechPaused / SpeechResumed) ---


CLIENT_SIDE = (Send, PlayAudio, ClearOutputAudio, DropQueuedAudio)


def paused_turn(d: Driver) -> tuple[str, str]:
    """Speech, then a pause: the session commits and starts the reply, sending nothing to the client. Returns the
    (user item, response) ids."""
    d.append(300, 0.5)
    d.turn(SpeechStarted(0, 0))
    d.append(200)
    acts = d.turn(SpeechPaused(audio_end_ms=500, speech_end_ms=300))
    assert [a for a in acts if isinstance(a, CLIENT_SIDE)] == []
    (commit,) = of(acts, CommitAudio)
    (start,) = of(acts, StartResponse)
    assert d.session.active_response_id == start.response_id
    return commit.item_id, start.response_id


def test_a_reply_started_on_a_pause_is_shown_when_speech_stops():
    d, plain = Driver(preemptive=True), Driver()
    user, rid = paused_turn(d)
    held = d.engine(TextDelta("Hi", (1,))) + d.engine(chunk(40))
    assert [a for a in held if isinstance(a, CLIENT_SIDE)] == []
    tail = d.append(300)  # the rest of the silence window: detected on, not sent to the engine
    assert of(tail, AppendAudio) == [] and len(of(tail, DetectSpeech)) == 1
    acts = d.turn(SpeechStopped(audio_end_ms=800, speech_end_ms=300))
    # the same events, in the same order, as a turn that started its reply when speech stopped
    start_vad_response(plain)
    plain.engine(TextDelta("Hi", (1,))) + plain.engine(chunk(40))
    plain_types = types(plain.log)
    assert types(acts) == plain_types[plain_types.index("input_audio_buffer.speech_stopped") :]
    expected = [
        "input_audio_buffer.speech_stopped",
        "input_audio_buffer.committed",
        "conversation.item.added",
        "conversation.item.done",
        "response.created",
        "response.output_item.added",
        "conversation.item.added",
        "response.content_part.added",
        "response.output_audio_transcript.delta",
        "response.output_audio.delta",
    ]
    assert types(acts) == expected
    assert events(acts)[0]["audio_end_ms"] == 800 and events(acts)[0]["item_id"] == user
    assert of(acts, CommitAudio) == [] and of(acts, StartResponse) == []  # the engine had them at the pause
    # from now on the reply streams as any other
    assert types(d.engine(chunk(40, 960))) == ["response.output_audio.delta"]
    assert types(d.done())[-1] == "response.done"
    assert [item.id for item in d.session.items] == [user, d.session.items[1].id]


def test_a_reply_that_ends_before_speech_stops_is_shown_whole():
    d = Driver(preemptive=True)
    user, rid = paused_turn(d)
    assert [a for a in d.engine(TextDelta("Hi", (1,))) + d.done() if isinstance(a, CLIENT_SIDE)] == []
    assert d.session.active_response_id is None
    acts = d.turn(SpeechStopped(audio_end_ms=800, speech_end_ms=300))
    assert types(acts)[0] == "input_audio_buffer.speech_stopped" and types(acts)[-1] == "response.done"
    assert events(acts)[-1]["response"]["status"] == "completed"


def test_speech_after_a_pause_withdraws_the_reply_unseen():
    d = Driver(preemptive=True)
    user, rid = paused_turn(d)
    sent_before = [a.audio for a in of(d.log, AppendAudio)]
    d.engine(TextDelta("Hi", (1,)))
    after = d.append(100)  # silence after the pause, then speech again
    acts = d.turn(SpeechResumed(speech_start_ms=600))
    assert [a for a in acts if isinstance(a, CLIENT_SIDE)] == []
    assert of(acts, CancelResponse) == [CancelResponse(rid, StatusReason.TURN_DETECTED)]
    reply = of(d.log, StartResponse)[0].item_id
    assert of(acts, DeleteItem) == [DeleteItem(reply), DeleteItem(user)]
    # the message again, under its id: everything the engine had, then what came after the pause
    assert of(after, AppendAudio) == []
    streamed = of(acts, AppendAudio)
    assert {a.item_id for a in streamed} == {user}
    assert [a.audio for a in streamed] == sent_before + [pcm16(100)]
    assert d.session.active_response_id is None and d.session.items == ()
    # the withdrawn reply's last output and its end are dropped
    assert d.engine(chunk(40), rid) == [] and d.engine(ResponseDone(ResponseStatus.CANCELLED, Usage()), rid) == []
    # the turn goes on as one message: more speech streams into it, and speech stopping answers it
    assert of(d.append(200, 0.5), AppendAudio)[0].item_id == user
    acts = d.turn(SpeechStopped(audio_end_ms=1400, speech_end_ms=900))
    assert of(acts, CommitAudio) == [CommitAudio(user)] and len(of(acts, StartResponse)) == 1
    assert types(acts)[:2] == ["input_audio_buffer.speech_stopped", "input_audio_buffer.committed"]
    assert all(e.get("item_id") != reply for e in events(d.log))  # the client never heard of the withdrawn reply


def test_a_second_pause_after_a_withdrawal_starts_a_new_reply():
    d = Driver(preemptive=True)
    user, first = paused_turn(d)
    d.turn(SpeechResumed(speech_start_ms=600))
    d.append(200, 0.5)
    acts = d.turn(SpeechPaused(audio_end_ms=1000, speech_end_ms=800))
    (start,) = of(acts, StartResponse)
    assert of(acts, CommitAudio) == [CommitAudio(user)] and start.response_id != first
    acts = d.turn(SpeechStopped(audio_end_ms=1300, speech_end_ms=800))
    assert types(acts)[4] == "response.created" and events(acts)[4]["response"]["id"] == start.response_id


def test_a_client_event_during_a_pause_withdraws_the_reply_first():
    d = Driver(preemptive=True)
    user, rid = paused_turn(d)
    acts = d.send({"type": "input_audio_buffer.commit"})
    assert of(acts, CancelResponse) == [CancelResponse(rid, StatusReason.TURN_DETECTED)]
    assert of(acts, CommitAudio) == [CommitAudio(user)]  # the manual commit of the whole message
    assert types(acts) == ["input_audio_buffer.committed", "conversation.item.added", "conversation.item.done"]
    assert d.session.active_response_id is None
    # response.create is not refused because of the withdrawn reply
    acts = d.respond()
    assert types(acts)[0] == "response.created" and of(acts, StartResponse)[0].response_id != rid


def test_failures_of_a_withdrawn_reply_stay_unseen_and_a_tentative_ones_are_held():
    d = Driver(preemptive=True)
    user, rid = paused_turn(d)
    start = of(d.log, StartResponse)[-1]
    assert d._record(d.session.command_failed(start, EngineFailure("boom"))) == []  # held
    acts = d.turn(SpeechStopped(audio_end_ms=800, speech_end_ms=300))
    assert types(acts)[0] == "input_audio_buffer.speech_stopped" and "error" in types(acts)
    assert events(acts)[-1]["response"]["status"] == "failed"

    d2 = Driver(preemptive=True)
    user2, rid2 = paused_turn(d2)
    d2.turn(SpeechResumed(speech_start_ms=600))
    for command in of(d2.log, DeleteItem) + of(d2.log, StartResponse):
        assert d2._record(d2.session.command_failed(command, UnknownItemError("gone"))) == []


def test_no_reply_on_a_pause_without_create_response_or_while_one_runs():
    d = Driver(preemptive=True)
    d.send({"type": "session.update", "session": {"turn_detection": {"create_response": False}}})
    d.append(300, 0.5)
    d.turn(SpeechStarted(0, 0))
    assert d.turn(SpeechPaused(500, 300)) == []
    d = Driver(preemptive=True)
    start_vad_response(d)
    d.send({"type": "session.update", "session": {"turn_detection": {"interrupt_response": False}}})
    d.append(300, 0.5)
    d.turn(SpeechStarted(1000, 1000))
    assert of(d.turn(SpeechPaused(1500, 1300)), StartResponse) == []


def test_media_sessions_hold_the_tentative_replys_audio_too():
    d = Driver(transport=AudioTransport.MEDIA, preemptive=True)
    paused_turn(d)
    assert [a for a in d.engine(chunk(40)) if isinstance(a, CLIENT_SIDE)] == []
    acts = d.turn(SpeechStopped(audio_end_ms=800, speech_end_ms=300))
    assert len(of(acts, PlayAudio)) == 1 and "output_audio_buffer.started" in types(acts)


def test_each_preemptive_outcome_is_reported_once_before_the_held_events():
    d = Driver(preemptive=True)
    user, rid = paused_turn(d)
    assert of(d.log, PreemptiveReply) == [PreemptiveReply(rid, Preemption.STARTED)]
    d.engine(chunk(40))
    acts = d.turn(SpeechStopped(audio_end_ms=800, speech_end_ms=300))
    assert of(acts, PreemptiveReply) == [PreemptiveReply(rid, Preemption.SHOWN)]
    shown = acts.index(of(acts, PreemptiveReply)[0])
    assert shown < acts.index(of(acts, Send)[1])  # before the held events: the trace's "shown" precedes its "sent"

    d = Driver(preemptive=True)
    user, rid = paused_turn(d)
    acts = d.turn(SpeechResumed(speech_start_ms=600))
    assert of(acts, PreemptiveReply) == [PreemptiveReply(rid, Preemption.WITHDRAWN)]
    d.turn(SpeechStopped(audio_end_ms=1400, speech_end_ms=900))  # the reply started on stop is not preemptive
    outcomes = [PreemptiveReply(rid, Preemption.STARTED), PreemptiveReply(rid, Preemption.WITHDRAWN)]
    assert of(d.log, PreemptiveReply) == outcomes


def test_without_preemptive_replies_a_pause_starts_nothing_and_no_audio_is_kept():
    d = Driver()
    d.append(300, 0.5)
    d.turn(SpeechStarted(0, 0))
    d.append(200)
    assert d.turn(SpeechPaused(audio_end_ms=500, speech_end_ms=300)) == []
    assert d.session.input_kept == () and d.session.input_streamed_ms == 500
    acts = d.turn(SpeechStopped(audio_end_ms=800, speech_end_ms=300))
    assert len(of(acts, StartResponse)) == 1 and of(acts, PreemptiveReply) == []

    d = Driver(preemptive=True)
    d.append(300, 0.5)
    d.turn(SpeechStarted(0, 0))
    d.append(200)
    assert sum(c.duration_ms for c in d.session.input_kept) == 500  # what a withdrawal would stream again


def test_without_interrupt_response_speech_does_not_cancel():
    d = Driver()
    d.send({"type": "session.update", "session": {"turn_detection": {"interrupt_response": False}}})
    rid = start_vad_response(d)
    d.engine(chunk(40))
    d.append(100, 0.5)
    acts = d.turn(SpeechStarted(1000, 1000))
    assert of(acts, CancelResponse) == [] and of(acts, DropQueuedAudio) == []
    d.append(600)
    acts = d.turn(SpeechStopped(1700, 1100))
    assert of(acts, StartResponse) == []  # the running response keeps going; none is queued
    assert d.session.active_response_id == rid
    assert "response.output_audio.delta" in types(d.engine(chunk(40, 960)))


def test_barge_in_after_the_response_finished_drops_its_unsent_audio():
    d = Driver()
    rid = start_vad_response(d)
    d.engine(chunk(40))
    d.done()
    d.append(100, 0.5)
    acts = d.turn(SpeechStarted(1000, 1000))
    assert of(acts, CancelResponse) == [] and of(acts, DropQueuedAudio) == [DropQueuedAudio(rid)]


# --- truncation ---------------------------------------------------------------------------------


def cancelled_audio_response(d: Driver, chunks: int = 3) -> str:
    commit_turn(d)
    d.respond()
    for i in range(chunks):
        d.engine(chunk(40, i * 960))
    d.send({"type": "response.cancel"})
    return d.session.items[-1].id


def test_truncate_after_cancel():
    d = Driver(manual=True)
    item_id = cancelled_audio_response(d)
    acts = d.send({"type": "conversation.item.truncate", "item_id": item_id, "content_index": 0, "audio_end_ms": 50})
    assert of(acts, TruncateItem) == [TruncateItem(item_id, 50)]
    assert events(acts) == [
        {
            "type": "conversation.item.truncated",
            "event_id": events(acts)[0]["event_id"],
            "item_id": item_id,
            "content_index": 0,
            "audio_end_ms": 50,
        }
    ]
    part = d.session.items[-1].content[0]
    assert (part.audio_ms, part.transcript) == (50.0, None)
    acts = d.done(ResponseStatus.CANCELLED, reason="client_cancelled")
    assert events(acts)[-1]["response"]["status_details"]["reason"] == "client_cancelled"


@pytest.mark.parametrize(
    ("change", "code", "param"),
    [
        ({"audio_end_ms": 121}, ErrorCode.INVALID_VALUE, "audio_end_ms"),
        ({"content_index": 1}, ErrorCode.INVALID_VALUE, "content_index"),
        ({"item_id": "item_1"}, ErrorCode.INVALID_VALUE, "item_id"),  # the user's item
        ({"item_id": "nope"}, ErrorCode.ITEM_NOT_FOUND, "item_id"),
    ],
)
def test_truncate_is_validated_against_the_audio_sent(change, code, param):
    d = Driver(manual=True)
    item_id = cancelled_audio_response(d)  # 3 × 40 ms sent
    request = {"type": "conversation.item.truncate", "item_id": item_id, "content_index": 0, "audio_end_ms": 120}
    assert of(d.send(request), TruncateItem)  # exactly what was sent is fine
    err = error_of(d.send({**request, **change, "event_id": "t"}))
    assert (err["code"], err["param"], err["event_id"]) == (code, param, "t")


def test_truncate_of_a_finished_item_while_a_later_response_runs():
    """What pipecat sends on ``speech_started`` (a truncate of its last reply), arriving after that turn's own reply
    began: the client sees the truncation at once; the engine command is the one the executor runs once idle."""
    d = Driver(manual=True)
    commit_turn(d)
    d.respond()
    d.engine(chunk(40))
    d.engine(chunk(40, 960))
    first = d.session.items[-1].id
    d.done()
    commit_turn(d)
    d.respond()
    d.engine(chunk(40))
    request = {"type": "conversation.item.truncate", "item_id": first, "content_index": 0, "audio_end_ms": 60}
    acts = d.send({**request, "event_id": "t"})
    assert of(acts, TruncateItem) == [TruncateItem(first, 60)]
    assert types(acts) == ["conversation.item.truncated"]
    part = d.session.items[-3].content[0]
    assert (d.session.items[-3].id, part.audio_ms, part.transcript) == (first, 60.0, None)
    running = d.session.items[-1].id
    err = error_of(d.send({**request, "item_id": running, "audio_end_ms": 10}))
    assert err["code"] == ErrorCode.ITEM_IN_PROGRESS
    assert types(d.done())[-1] == "response.done"


def test_truncate_of_an_item_still_being_generated_is_refused():
    d = Driver(manual=True)
    commit_turn(d)
    d.respond()
    d.engine(chunk(40))
    item_id = d.session.items[-1].id
    err = error_of(
        d.send({"type": "conversation.item.truncate", "item_id": item_id, "content_index": 0, "audio_end_ms": 10})
    )
    assert err["code"] == ErrorCode.ITEM_IN_PROGRESS


# --- conversation items -------------------------------------------------------------------------


def test_item_create_retrieve_delete():
    d = Driver(manual=True)
    text = {"type": "message", "role": "system", "content": [{"type": "input_text", "text": "Rules."}]}
    acts = d.send({"type": "conversation.item.create", "item": {**text, "id": "sys1"}})
    assert of(acts, AddText) == [AddText("sys1", "Rules.", Role.SYSTEM)]
    assert types(acts) == ["conversation.item.added", "conversation.item.done"]

    audio = {
        "type": "message",
        "role": "user",
        "content": [{"type": "input_audio", "audio": base64.b64encode(pcm16(100)).decode()}],
    }
    acts = d.send({"type": "conversation.item.create", "previous_item_id": "sys1", "item": audio})
    assert of(acts, AddAudio) == [AddAudio("item_1", pcm16(100), AudioFormat.PCM)]
    assert events(acts)[0]["previous_item_id"] == "sys1"

    acts = d.send({"type": "conversation.item.retrieve", "item_id": "sys1"})
    assert events(acts)[0]["type"] == "conversation.item.retrieved"
    assert events(acts)[0]["item"]["content"] == [{"type": "input_text", "text": "Rules."}]

    acts = d.send({"type": "conversation.item.delete", "item_id": "sys1"})
    assert of(acts, DeleteItem) == [DeleteItem("sys1")] and types(acts) == ["conversation.item.deleted"]
    assert [i.id for i in d.session.items] == ["item_1"]


@pytest.mark.parametrize(
    ("event", "code", "param"),
    [
        ({"type": "conversation.item.retrieve", "item_id": "ghost"}, ErrorCode.ITEM_NOT_FOUND, "item_id"),
        ({"type": "conversation.item.delete", "item_id": "ghost"}, ErrorCode.ITEM_NOT_FOUND, "item_id"),
        (
            {
                "type": "conversation.item.create",
                "previous_item_id": "ghost",
                "item": {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "x"}]},
            },
            ErrorCode.ITEM_NOT_FOUND,
            "previous_item_id",
        ),
        (
            {
                "type": "conversation.item.create",
                "item": {
                    "id": "root",
                    "type": "message",
                    "role": "user",
                    "content": [{"type": "input_text", "text": "x"}],
                },
            },
            ErrorCode.INVALID_VALUE,
            "item.id",
        ),
        (
            {
                "type": "conversation.item.create",
                "item": {
                    "id": "first",
                    "type": "message",
                    "role": "user",
                    "content": [{"type": "input_text", "text": "x"}],
                },
            },
            ErrorCode.DUPLICATE_ITEM_ID,
            "item.id",
        ),
        (
            {
                "type": "conversation.item.create",
                "item": {"type": "message", "role": "user", "content": [{"type": "input_audio", "audio": "AAAA"}]},
            },
            ErrorCode.INVALID_AUDIO,
            "item.content.0.audio",  # 3 bytes of pcm16
        ),
    ],
)
def test_item_errors(event, code, param):
    d = Driver(manual=True)
    for item_id in ("first", "second"):
        item = {"id": item_id, "type": "message", "role": "user", "content": [{"type": "input_text", "text": "x"}]}
        d.send({"type": "conversation.item.create", "item": item})
    err = error_of(d.send(event))
    assert (err["code"], err["param"]) == (code, param)
    assert [i.id for i in d.session.items] == ["first", "second"]


def test_root_means_the_start_of_the_conversation():
    d = Driver(manual=True)
    item = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "x"}]}
    acts = d.send({"type": "conversation.item.create", "previous_item_id": "root", "item": item})
    assert types(acts) == ["conversation.item.added", "conversation.item.done"]
    assert of(acts, AddText)[0].previous_item_id is None, "the end of an empty conversation: an append"
    acts = d.send({"type": "conversation.item.create", "previous_item_id": "root", "item": item})
    assert of(acts, AddText)[0].previous_item_id == "root"
    assert events(acts)[0]["previous_item_id"] is None
    assert [i.id for i in d.session.items] == ["item_2", "item_1"]


def test_deleting_during_a_response():
    d = Driver(manual=True)
    user = commit_turn(d)
    d.respond()
    assistant = d.session.items[-1].id
    assert (
        error_of(d.send({"type": "conversation.item.delete", "item_id": user}))["code"] == ErrorCode.CONVERSATION_BUSY
    )
    d.send({"type": "response.cancel"})
    assert (
        error_of(d.send({"type": "conversation.item.delete", "item_id": assistant}))["code"]
        == ErrorCode.ITEM_IN_PROGRESS
    )
    assert of(d.send({"type": "conversation.item.delete", "item_id": user}), DeleteItem) == [DeleteItem(user)]


# --- input buffer and response errors -----------------------------------------------------------


def test_commit_needs_enough_audio_and_clear_discards_it():
    d = Driver(manual=True)
    d.append(50)
    err = error_of(d.send({"type": "input_audio_buffer.commit", "event_id": "c"}))
    assert (err["code"], err["event_id"]) == (ErrorCode.INPUT_AUDIO_BUFFER_COMMIT_EMPTY, "c")
    acts = d.send({"type": "input_audio_buffer.clear"})
    assert of(acts, ClearAudio) == [ClearAudio("item_1")] and types(acts) == ["input_audio_buffer.cleared"]
    assert d.session.input_buffer_ms == 0
    assert of(d.append(100), AppendAudio)[0].item_id == "item_2"


def test_buffer_limit_refuses_the_chunk_and_keeps_the_rest():
    d = Driver(manual=True, limits=SessionLimits(max_buffer_ms=300))
    d.append(200)
    err = error_of(d.append(200))
    assert (err["code"], err["param"]) == (ErrorCode.INPUT_AUDIO_BUFFER_FULL, "audio")
    assert d.session.input_buffer_ms == 200 and d.session.audio_clock_ms == 200
    assert of(d.send({"type": "input_audio_buffer.commit"}), CommitAudio)


def test_misaligned_pcm16_is_refused():
    d = Driver(manual=True)
    err = error_of(d.send({"type": "input_audio_buffer.append", "audio": base64.b64encode(b"\0\0\0").decode()}))
    assert (err["code"], err["param"]) == (ErrorCode.INVALID_AUDIO, "audio")
    d.send({"type": "session.update", "session": {"input_audio_format": "g711_ulaw"}})
    acts = d.send({"type": "input_audio_buffer.append", "audio": base64.b64encode(b"\xff" * 800).decode()})
    assert of(acts, AppendAudio)[0].format is AudioFormat.PCMU and d.session.input_buffer_ms == 100


def test_response_request_errors_and_the_session_keeps_working():
    d = Driver(manual=True)
    err = error_of(d.send({"type": "response.cancel", "event_id": "x"}))
    assert (err["code"], err["event_id"]) == (ErrorCode.RESPONSE_CANCEL_NOT_ACTIVE, "x")
    commit_turn(d)
    rid = of(d.respond(), StartResponse)[0].response_id
    assert error_of(d.respond())["code"] == ErrorCode.CONVERSATION_ALREADY_HAS_ACTIVE_RESPONSE
    err = error_of(d.send({"type": "response.cancel", "response_id": "resp_other"}))
    assert (err["code"], err["param"]) == (ErrorCode.RESPONSE_CANCEL_NOT_ACTIVE, "response_id")
    err = error_of(d.send({"type": "response.create", "response": {"voice": "alloy"}}))
    assert err["code"] == ErrorCode.CONVERSATION_ALREADY_HAS_ACTIVE_RESPONSE
    acts = d.send({"type": "response.cancel", "response_id": rid})
    assert of(acts, CancelResponse) == [CancelResponse(rid, StatusReason.CLIENT_CANCELLED)]
    assert error_of(d.send({"type": "response.cancel"}))["code"] == ErrorCode.RESPONSE_CANCEL_NOT_ACTIVE
    d.done(ResponseStatus.CANCELLED, reason="client_cancelled")
    err = error_of(d.send({"type": "response.create", "response": {"audio": {"output": {"voice": "alloy"}}}}))
    assert (err["code"], err["param"]) == (ErrorCode.UNKNOWN_VOICE, "response.audio.output.voice")
    assert of(d.respond(), StartResponse)  # and it still works


def test_malformed_messages_become_error_events():
    d = Driver()
    assert error_of(d._record(d.session.receive("{oops")))["code"] == ErrorCode.INVALID_JSON
    err = error_of(d.send({"type": "session.update", "event_id": "s", "session": {"bogus": 1}}))
    assert (err["code"], err["param"], err["event_id"]) == (ErrorCode.UNKNOWN_PARAMETER, "session.bogus", "s")


def _error_lines(caplog) -> list:
    return [r for r in caplog.records if r.name == "realtime.observe.error_log"]


def test_every_error_event_is_logged_once_with_session_code_client_event_and_message(caplog):
    """Client mistakes at INFO (the default level shows them), each naming the session, the code, the client
    event's type and event_id, the param and the message the client got."""
    caplog.set_level(logging.INFO, logger="realtime.observe.error_log")
    d = Driver()
    sid = d.session.session_id
    update = {"type": "session.update", "event_id": "evt_7", "session": {"tools": [{"type": "function"}]}}
    err = error_of(d.send(update))
    (line,) = _error_lines(caplog)
    assert line.levelno == logging.INFO
    text = line.getMessage()
    for part in (sid, err["code"], "session.update", "evt_7", "session.tools", err["message"]):
        assert part in text, (part, text)

    caplog.clear()
    error_of(d._record(d.session.receive("{oops")))  # no type, no event_id: both shown as '-'
    (line,) = _error_lines(caplog)
    assert f"session {sid}: error invalid_json answering - (event_id -, param -)" in line.getMessage()

    caplog.clear()
    error_of(d.send({"type": "response.cancel", "event_id": "c1"}))  # refused by the session's state
    (line,) = _error_lines(caplog)
    assert "response_cancel_not_active answering response.cancel (event_id c1" in line.getMessage()


def test_server_errors_are_logged_as_warnings(caplog):
    caplog.set_level(logging.INFO, logger="realtime.observe.error_log")
    d = Driver(manual=True)
    item_id = commit_turn(d)
    caplog.clear()
    err = error_of(d._record(d.session.command_failed(CommitAudio(item_id), EngineFailure("prefill failed"))))
    (line,) = _error_lines(caplog)
    assert line.levelno == logging.WARNING
    assert f"session {d.session.session_id}: error {err['code']}" in line.getMessage()
    assert "prefill failed" in line.getMessage()


def test_output_audio_buffer_clear_is_webrtc_only():
    d = Driver()
    err = error_of(d.send({"type": "output_audio_buffer.clear"}))
    assert err["code"] == ErrorCode.UNSUPPORTED_EVENT


def test_engine_output_for_another_response_is_a_bug():
    d = Driver(manual=True)
    with pytest.raises(ValueError):
        d.session.response_event("resp_9", TextDelta("x", ()))


# --- WebRTC (media) sessions --------------------------------------------------------------------


def test_media_sessions_play_audio_on_the_track():
    d = Driver(transport=AudioTransport.MEDIA, manual=True)
    commit_turn(d)
    rid = of(d.respond(), StartResponse)[0].response_id
    acts = d.engine(chunk(40)) + d.engine(chunk(40, 960))
    assert types(acts) == ["output_audio_buffer.started"]
    assert [a.response_id for a in of(acts, PlayAudio)] == [rid, rid]
    d.done()
    assert types(d._record(d.session.playback_stopped(rid))) == ["output_audio_buffer.stopped"]
    assert error_of(d.send({"type": "output_audio_buffer.clear"}))["code"] == ErrorCode.OUTPUT_AUDIO_BUFFER_EMPTY


def test_media_barge_in_and_clear():
    d = Driver(transport=AudioTransport.MEDIA)
    rid = start_vad_response(d)
    d.engine(chunk(40))
    d.append(300, 0.5)
    acts = d.turn(SpeechStarted(1000, 1000))
    assert of(acts, ClearOutputAudio) == [ClearOutputAudio(rid)]
    assert types(acts) == ["input_audio_buffer.speech_started", "output_audio_buffer.cleared"]
    assert of(d.engine(chunk(40, 960)), PlayAudio) == []
    d.done(ResponseStatus.CANCELLED, reason="turn_detected")

    d.append(600)
    d.turn(SpeechStopped(1800, 1300))
    rid2 = d.session.active_response_id
    d.engine(chunk(40))
    acts = d.send({"type": "output_audio_buffer.clear"})
    assert of(acts, ClearOutputAudio) == [ClearOutputAudio(rid2)] and types(acts) == ["output_audio_buffer.cleared"]


# --- random sequences ---------------------------------------------------------------------------

from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

_OPS = st.sampled_from(
    [
        "silence",
        "speech",
        "commit",
        "clear",
        "respond",
        "respond_text",
        "cancel",
        "create_item",
        "delete_first",
        "delete_ghost",
        "truncate_last",
        "vad_on",
        "vad_off",
        "g711_out",
        "engine_text",
        "engine_audio",
        "engine_done",
        "engine_cancelled",
        "speech_started",
        "speech_stopped",
    ]
)


def _step(d: Driver, op: str, data) -> list:
    s = d.session
    if op in ("silence", "speech"):
        return d.append(100, 0.5 if op == "speech" else 0.0)
    if op in ("commit", "clear"):
        return d.send({"type": f"input_audio_buffer.{op}"})
    if op == "respond":
        return d.respond()
    if op == "respond_text":
        return d.send({"type": "response.create", "response": {"output_modalities": ["text"]}})
    if op == "cancel":
        return d.send({"type": "response.cancel"})
    if op == "create_item":
        item = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]}
        return d.send({"type": "conversation.item.create", "item": item})
    if op in ("delete_first", "delete_ghost"):
        item_id = s.items[0].id if s.items and op == "delete_first" else "ghost"
        return d.send({"type": "conversation.item.delete", "item_id": item_id})
    if op == "truncate_last":
        item_id = s.items[-1].id if s.items else "ghost"
        ms = data.draw(st.integers(0, 200))
        return d.send(
            {"type": "conversation.item.truncate", "item_id": item_id, "content_index": 0, "audio_end_ms": ms}
        )
    if op in ("vad_on", "vad_off"):
        detection = {"type": "server_vad"} if op == "vad_on" else None
        return d.send({"type": "session.update", "session": {"turn_detection": detection}})
    if op == "g711_out":
        return d.send({"type": "session.update", "session": {"output_audio_format": "g711_ulaw"}})
    if op.startswith("engine_"):
        if s.active_response_id is None:
            return []
        if op == "engine_text":
            return d.engine(TextDelta("w", (1,)))
        if op == "engine_audio":
            return d.engine(chunk(40))
        status = ResponseStatus.COMPLETED if op == "engine_done" else ResponseStatus.CANCELLED
        return d.done(status, reason=None if op == "engine_done" else "client_cancelled")
    clock = int(s.audio_clock_ms)
    if op == "speech_started":
        return d.turn(SpeechStarted(max(0, clock - 300), clock))
    return d.turn(SpeechStopped(clock, clock))


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=st.lists(_OPS, max_size=40), data=st.data())
def test_random_sequences_keep_the_protocol_invariants(ops, data):
    d = Driver()
    cancelled: set[str] = set()
    created: list[str] = []
    done: list[str] = []
    for op in ops:
        active_before = d.session.response_phase
        for action in _step(d, op, data):
            if isinstance(action, CancelResponse):
                cancelled.add(action.response_id)
            if isinstance(action, (DeleteItem, TruncateItem)):
                assert active_before is not ResponsePhase.IN_PROGRESS
            if isinstance(action, StartResponse):
                assert len(created) == len(done) + 1  # one response at a time
            if not isinstance(action, Send):
                continue
            event = action.event
            if event["type"] == "response.created":
                created.append(event["response"]["id"])
            elif event["type"] == "response.done":
                done.append(event["response"]["id"])
                assert event["response"]["id"] == created[-1]
                if event["response"]["id"] in cancelled:  # (the engine may also end one as cancelled)
                    assert event["response"]["status"] == "cancelled"
            elif event["type"] == "response.output_audio.delta":
                assert event["response_id"] not in cancelled  # nothing after the cancel decision
        assert d.session.input_buffer_ms <= SessionLimits().max_buffer_ms
    assert len(set(done)) == len(done) and len(created) - len(done) in (0, 1)


# --- idle timeout (server_vad.idle_timeout_ms) ---------------------------------------------------


def idle_driver(timeout_ms=1000, transport=AudioTransport.EVENTS, dialect=Dialect.GA, **vad) -> Driver:
    d = Driver(dialect, transport=transport)
    detection = {"type": "server_vad", "idle_timeout_ms": timeout_ms, **vad}
    acts = d.send({"type": "session.update", "session": {"turn_detection": detection}})
    assert of(acts, ConfigureTurnDetection)[0].params.idle_timeout_ms == timeout_ms
    if dialect is Dialect.GA:
        assert events(acts)[0]["session"]["audio"]["input"]["turn_detection"]["idle_timeout_ms"] == timeout_ms
    return d


def silence_until_timeout(d: Driver, limit_ms: int = 5000) -> list:
    """Append 100 ms of silence at a time until something else than speech detection follows (or ``limit_ms``)."""
    for _ in range(limit_ms // 100):
        acts = d.append(100)
        if events(acts):
            return acts
    return []


def test_the_idle_timeout_commits_the_silence_and_asks_for_a_response():
    d = idle_driver(1000)
    d.send({"type": "session.update", "session": {"output_modalities": ["text"]}})
    d.append(300)
    d.respond()
    d.done()  # a text reply: idle from now (clock 300)
    acts = silence_until_timeout(d)
    assert d.session.audio_clock_ms == 1300
    assert types(acts)[:6] == [
        "input_audio_buffer.timeout_triggered",
        "input_audio_buffer.committed",
        "conversation.item.added",
        "conversation.item.done",
        "response.created",
        "response.output_item.added",
    ]
    triggered, committed = events(acts)[:2]
    assert (triggered["audio_start_ms"], triggered["audio_end_ms"]) == (300, 1300)
    assert triggered["item_id"] == committed["item_id"] == of(acts, CommitAudio)[0].item_id
    assert sum(len(a.audio) for a in of(acts, AppendAudio)) > 0  # the held silence is the user item
    assert of(acts, StartResponse) and isinstance(acts[-1], DetectSpeech)
    d.done()
    assert silence_until_timeout(d, 900) == []  # the next timeout runs from the new reply's end
    assert types(d.append(100))[0] == "input_audio_buffer.timeout_triggered"


def test_the_idle_timeout_runs_from_the_end_of_the_replys_playback():
    """Over a WebSocket the client plays the deltas as they come: idle from the first delta plus their duration."""
    d = idle_driver(1000)
    d.append(200)
    d.respond()
    d.engine(chunk(1000))  # a second of reply audio, sent at clock 200
    d.done()
    start = events(silence_until_timeout(d))[0]
    assert 1100 <= start["audio_start_ms"] <= 1200 and start["audio_end_ms"] - start["audio_start_ms"] >= 1000


def test_on_webrtc_the_idle_timeout_runs_from_the_end_of_playback():
    d = idle_driver(1000, transport=AudioTransport.MEDIA)
    d.append(100)
    rid = of(d.respond(), StartResponse)[0].response_id
    d.engine(chunk(500))
    d.done()
    assert silence_until_timeout(d, 2000) == []  # still playing: no timeout
    d._record(d.session.playback_stopped(rid))
    clock = int(d.session.audio_clock_ms)
    start = events(silence_until_timeout(d))[0]
    assert (start["type"], start["audio_start_ms"], start["audio_end_ms"]) == (
        "input_audio_buffer.timeout_triggered",
        clock,
        clock + 1000,
    )


def test_speech_or_no_reply_yet_means_no_idle_timeout():
    d = idle_driver(500)
    assert silence_until_timeout(d, 2000) == []  # nothing said yet by the assistant
    d.append(100)
    d.respond()
    d.turn(SpeechStarted(100, 100))  # the user talks over the reply
    d.done(ResponseStatus.CANCELLED, reason="turn_detected")
    assert [t for t in types(d.append(2000)) if "timeout" in t] == []


def test_without_create_response_the_idle_timeout_only_commits():
    d = idle_driver(500, create_response=False)
    d.append(100)
    d.respond()
    d.done()
    acts = silence_until_timeout(d)
    assert types(acts) == [
        "input_audio_buffer.timeout_triggered",
        "input_audio_buffer.committed",
        "conversation.item.added",
        "conversation.item.done",
    ]
    assert not of(acts, StartResponse) and d.session.active_response_id is None


def test_beta_clients_get_the_commit_and_response_without_the_ga_event():
    d = idle_driver(500, dialect=Dialect.BETA)
    d.append(100)
    d.respond()
    d.done()
    acts = silence_until_timeout(d)
    assert types(acts)[0] == "input_audio_buffer.committed" and of(acts, StartResponse)


# --- function calling ---------------------------------------------------------------------------------------

WEATHER = {
    "type": "function",
    "name": "get_weather",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
}


def _with_tools(**session) -> Driver:
    d = Driver(manual=True)
    actions = d.send({"type": "session.update", "session": {"tools": [WEATHER], **session}})
    (set_tools,) = of(actions, SetTools)
    assert [t.name for t in set_tools.tools] == ["get_weather"]
    (updated,) = events(actions)
    assert updated["session"]["tools"][0]["parameters"]["properties"] == {"city": {"type": "string"}}
    d.send({"type": "conversation.item.create", "item": _user("Weather?")})
    return d


def _user(text: str) -> dict:
    return {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}


def _call(d: Driver, start: StartResponse, index: int = 0, arguments: str = '{"city": "Paris"}') -> list:
    item_id = start.call_item_ids[index]
    actions = d.engine(FunctionCallStarted(index, item_id, "get_weather"))
    actions += d.engine(FunctionCallDelta(index, arguments[:5]))
    actions += d.engine(FunctionCallDelta(index, arguments[5:]))
    actions += d.engine(FunctionCallDone(index, item_id, "get_weather", arguments))
    return actions


def test_a_call_only_reply_is_one_function_call_output_item():
    d = _with_tools()
    actions = d.respond()
    (start,) = of(actions, StartResponse)
    assert start.tool_choice == ToolChoice() and len(start.call_item_ids) == MAX_CALLS_PER_RESPONSE
    assert types(actions) == ["response.created"]  # the message waits for text or audio
    actions = _call(d, start)
    assert types(actions) == [
        "response.output_item.added",
        "conversation.item.added",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done",
        "response.output_item.done",
        "conversation.item.done",
    ]
    added = events(actions)[0]
    assert (added["output_index"], added["item"]["status"], added["item"]["arguments"]) == (0, "in_progress", "")
    done = events(actions)[4]
    assert done["arguments"] == '{"city": "Paris"}' and done["call_id"] == added["item"]["call_id"]
    (response_done,) = events(d.done())
    assert response_done["response"]["status"] == "completed"
    (item,) = response_done["response"]["output"]
    assert (item["type"], item["id"], item["status"]) == ("function_call", start.call_item_ids[0], "completed")
    assert item["id"] in {i.id for i in d.session.items}


def test_text_then_a_call_lists_the_message_first():
    d = _with_tools()
    (start,) = of(d.respond(), StartResponse)
    actions = d.engine(TextDelta("Let me check.", ()))
    assert types(actions)[:3] == [
        "response.output_item.added",
        "conversation.item.added",
        "response.content_part.added",
    ]
    actions = _call(d, start)
    assert events(actions)[0]["output_index"] == 1
    (done,) = [e for e in events(d.done()) if e["type"] == "response.done"]
    assert [i["type"] for i in done["response"]["output"]] == ["message", "function_call"]


def test_a_call_cut_off_ends_incomplete_and_leaves_the_conversation():
    d = _with_tools()
    (start,) = of(d.respond(), StartResponse)
    d.engine(FunctionCallStarted(0, start.call_item_ids[0], "get_weather"))
    actions = d.done(ResponseStatus.CANCELLED, reason="client_cancelled")
    assert types(actions) == ["response.output_item.done", "conversation.item.deleted", "response.done"]
    assert events(actions)[0]["item"]["status"] == "incomplete"
    assert start.call_item_ids[0] not in {i.id for i in d.session.items}


def test_a_response_with_its_own_tools_sets_them_and_restores_the_sessions():
    d = _with_tools()
    other = {"type": "function", "name": "noop"}
    actions = d.send({"type": "response.create", "response": {"tools": [other], "tool_choice": "required"}})
    (set_tools,) = of(actions, SetTools)
    (start,) = of(actions, StartResponse)
    assert [t.name for t in set_tools.tools] == ["noop"] and start.tool_choice == ToolChoice(ToolMode.REQUIRED)
    assert actions.index(set_tools) < actions.index(start)
    (restore,) = of(d.done(), SetTools)
    assert [t.name for t in restore.tools] == ["get_weather"]


def test_tool_choice_none_or_no_tools_make_no_call_ids_and_announce_the_message_at_once():
    d = _with_tools(tool_choice="none")
    actions = d.respond()
    assert of(actions, StartResponse)[0].call_item_ids == ()
    assert "response.output_item.added" in types(actions)
    d.done()
    plain = Driver(manual=True)
    plain.send({"type": "conversation.item.create", "item": _user("Hi")})
    assert of(plain.respond(), StartResponse)[0].call_item_ids == ()


def test_a_required_choice_without_tools_and_an_unknown_named_function_are_refused():
    d = Driver(manual=True)
    d.send({"type": "conversation.item.create", "item": _user("Hi")})
    error = error_of(d.send({"type": "response.create", "response": {"tool_choice": "required"}}))
    assert (error["code"], error["param"]) == (ErrorCode.INVALID_VALUE, "response.tool_choice")
    d.send(
        {"type": "session.update", "session": {"tools": [WEATHER], "tool_choice": {"type": "function", "name": "x"}}}
    )
    error = error_of(d.respond())
    assert (error["code"], error["param"]) == (ErrorCode.INVALID_VALUE, "session.tool_choice")
    assert "'x'" in error["message"] and d.session.active_response_id is None


def test_bad_tools_are_refused_with_the_field_at_fault():
    d = Driver()
    cases = [
        ({"tools": [{"type": "function", "name": "bad name"}]}, "session.tools.0.name"),
        ({"tools": [WEATHER, WEATHER]}, "session.tools"),
        (
            {"tools": [{"type": "function", "name": "f", "parameters": {"type": "string"}}]},
            "session.tools.0.parameters",
        ),
        (
            {"tools": [{"type": "function", "name": "f", "parameters": {"properties": {}, "required": ["a"]}}]},
            "session.tools.0.parameters",
        ),
        ({"tool_choice": "sometimes"}, "session.tool_choice"),
    ]
    for session, param in cases:
        error = error_of(d.send({"type": "session.update", "session": session}))
        assert (error["code"], error["param"]) == (ErrorCode.INVALID_VALUE, param), (session, error)


def test_client_function_call_and_output_items():
    d = Driver(manual=True)
    item = {"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": '{"city": "Lima"}'}
    actions = d.send({"type": "conversation.item.create", "item": item})
    (add,) = of(actions, AddFunctionCall)
    assert (add.name, add.arguments) == ("get_weather", '{"city": "Lima"}')
    assert [e["item"]["type"] for e in events(actions)] == ["function_call", "function_call"]
    error = error_of(
        d.send(
            {
                "type": "conversation.item.create",
                "item": {"type": "function_call_output", "call_id": "c9", "output": "x"},
            }
        )
    )
    assert (error["code"], error["param"]) == (ErrorCode.UNKNOWN_CALL_ID, "item.call_id")
    actions = d.send(
        {"type": "conversation.item.create", "item": {"type": "function_call_output", "call_id": "c1", "output": "fog"}}
    )
    (out,) = of(actions, AddFunctionOutput)
    assert out.output == "fog"
    assert events(actions)[0]["item"] | {"id": None} == {
        "id": None,
        "object": "realtime.item",
        "type": "function_call_output",
        "status": "completed",
        "call_id": "c1",
        "output": "fog",
    }
