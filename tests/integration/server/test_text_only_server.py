"""A WebSocket session on an engine without audio output (the tiny Qwen3-Omni checkpoint saved without its talker):
the session's default output is text, asking for audio is an ``unsupported_value`` error that leaves the session
working, and text replies, to text and to speech, complete."""

from __future__ import annotations

import pytest

from conftest import greedy_stage_config
from pipeline.engine import OmniEngine
from tests.helpers.server import assert_clean, connect, of_response, served, user_text
from tests.helpers.speech import FRAME_BYTES, b64, wav_pcm


@pytest.fixture(scope="module")
def text_engine(qwen3_text_model_dir):
    engine = OmniEngine.from_pretrained(qwen3_text_model_dir, greedy_stage_config(family="qwen3_omni"), seed=1234)
    yield engine
    engine.close()


async def text_reply(client, event_id: str) -> str:
    """Ask for a reply with the session's defaults; returns its text once ``response.done`` shows it complete."""
    await client.send({"type": "response.create", "event_id": event_id, "response": {"max_output_tokens": 6}})
    response_id = (await client.until("response.created"))["response"]["id"]
    done = (await client.until("response.done"))["response"]
    assert done["status"] in ("completed", "incomplete") and done["output_modalities"] == ["text"]
    (message,) = done["output"]
    (part,) = message["content"]
    deltas = "".join(e["delta"] for e in of_response(client.events, "response.output_text.delta", response_id))
    assert part["type"] == "output_text" and part["text"] == deltas != ""
    assert not [e for e in client.events if e["type"].startswith("response.output_audio")]
    return deltas


@pytest.mark.timeout(120)
async def test_a_session_on_an_engine_without_audio_output(text_engine):
    async with served(text_engine) as (url, app):
        async with connect(url) as client:
            session = client.events[0]["session"]
            assert session["output_modalities"] == ["text"] and session["audio"]["output"]["voice"] is None
            await client.send({"type": "session.update", "session": {"type": "realtime", "turn_detection": None}})
            await client.until("session.updated")

            await client.send(user_text("Hello, who are you?"))
            await client.until("conversation.item.done")
            await client.send(
                {"type": "response.create", "event_id": "spoken", "response": {"output_modalities": ["audio"]}}
            )
            error = (await client.until("error"))["error"]
            assert (error["code"], error["param"], error["event_id"]) == (
                "unsupported_value",
                "response.output_modalities",
                "spoken",
            )
            assert "text only" in error["message"]
            await text_reply(client, "first")
            assert len(client.of_type("response.created")) == 1  # the refused request made no response

            pcm = wav_pcm("capital_of_france.wav", end_ms=1500)
            for i in range(0, len(pcm), FRAME_BYTES):
                await client.send({"type": "input_audio_buffer.append", "audio": b64(pcm[i : i + FRAME_BYTES])})
            await client.send({"type": "input_audio_buffer.commit"})
            await client.until("input_audio_buffer.committed")
            await text_reply(client, "second")
            assert [e["error"]["code"] for e in client.of_type("error")] == ["unsupported_value"]
        await assert_clean(app)
