"""What voice-agent frameworks send by default, over a real WebSocket server (fake engine): a refused setting
refuses only itself, OpenAI voice names and semantic_vad apply, and errors answer the client event that caused them.
Every event read is validated with the openai SDK's models."""

from __future__ import annotations

import logging

import pydantic
import pytest

from pipeline.errors import EngineFailure
from tests.fakes import FakeEngine
from tests.helpers.server import connect, served, user_text

openai = pytest.importorskip("openai")
from openai.types.realtime import RealtimeServerEvent  # noqa: E402

SERVER_EVENT = pydantic.TypeAdapter(RealtimeServerEvent)

INSTRUCTIONS = "You are a helpful voice AI assistant."
LIVEKIT_STYLE_UPDATE = {
    "type": "session.update",
    "event_id": "lk_setup",
    "session": {
        "type": "realtime",
        "model": "gpt-realtime",
        "instructions": INSTRUCTIONS,
        "output_modalities": ["audio"],
        "tool_choice": "auto",
        "tools": [],
        "tracing": "auto",
        "max_output_tokens": "inf",
        "audio": {
            "input": {
                "format": {"type": "audio/pcm", "rate": 24000},
                "transcription": {"model": "gpt-4o-mini-transcribe"},
                "noise_reduction": None,
                "turn_detection": {
                    "type": "semantic_vad",
                    "eagerness": "auto",
                    "create_response": True,
                    "interrupt_response": True,
                },
            },
            "output": {"format": {"type": "audio/pcm", "rate": 24000}, "voice": "marin", "speed": 1.0},
        },
    },
}


def checked(events: list[dict]) -> list[dict]:
    for event in events:
        SERVER_EVENT.validate_python(event)
    return events


async def test_a_framework_default_update_applies_in_full():
    engine = FakeEngine()
    async with served(engine) as (url, _), connect(url) as client:
        await client.send(LIVEKIT_STYLE_UPDATE)
        updated = (await client.until("session.updated"))["session"]
        assert client.of_type("error") == []
        assert updated["audio"]["input"]["transcription"]["model"] == "gpt-4o-mini-transcribe"
        assert updated["instructions"] == INSTRUCTIONS and updated["audio"]["output"]["voice"] == "marin"
        assert updated["audio"]["input"]["turn_detection"] == {
            "type": "semantic_vad",
            "eagerness": "auto",
            "create_response": True,
            "interrupt_response": True,
        }
        await client.send(user_text("Hello?"))
        await client.send({"type": "response.create", "event_id": "ask_1"})
        created = (await client.until("response.created"))["response"]
        assert created["audio"]["output"]["voice"] == "marin"
        await client.until("response.done")
        checked(client.events)
        assert client.of_type("error") == []
    calls = engine.conversations[0].calls
    assert ("set_instructions", INSTRUCTIONS) in calls
    (respond,) = [call for call in calls if call[0] == "respond"]
    assert respond[3] == "Chelsie"  # marin is spoken by the checkpoint's Chelsie


async def test_an_engine_failure_during_a_response_answers_its_response_create():
    engine = FakeEngine()
    engine.fail_next("respond", EngineFailure("the talker broke"))
    async with served(engine) as (url, _), connect(url) as client:
        await client.send(user_text("Hello?"))
        await client.send({"type": "response.create", "event_id": "ask_2"})
        done = (await client.until("response.done"))["response"]
        (error,) = [e["error"] for e in client.of_type("error")]
        assert (error["code"], error["event_id"]) == ("engine_failure", "ask_2")
        assert done["status"] == "failed"
        checked(client.events)


class ToyVoicesEngine(FakeEngine):
    voices = ("low", "high")
    default_voice = "low"


async def test_aliases_to_speakers_the_model_lacks_are_logged_at_startup_and_unknown(caplog):
    caplog.set_level(logging.WARNING, logger="realtime.server.app")
    async with served(ToyVoicesEngine(), voice_aliases=(("alloy", "Chelsie"), ("echo", "HIGH"))) as (url, _):
        async with connect(url) as client:
            await client.send({"type": "session.update", "session": {"voice": "alloy"}})
            assert (await client.until("error"))["error"]["code"] == "unknown_voice"
            await client.send({"type": "session.update", "session": {"voice": "echo"}})
            assert (await client.until("session.updated"))["session"]["audio"]["output"]["voice"] == "echo"
    (line,) = [r.getMessage() for r in caplog.records if "voice aliases" in r.getMessage()]
    assert "alloy=Chelsie" in line and "echo" not in line
