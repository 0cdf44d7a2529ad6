"""The official ``openai`` SDK's realtime clients (GA and beta), unmodified, against a real server on
loopback running the tiny engine of each model family: full spoken turns with server VAD, and a second
turn that builds on the first."""

from __future__ import annotations

import base64
import json
import wave
from collections.abc import AsyncIterator

import numpy as np
import pytest
from openai import AsyncOpenAI

from realtime.config import ServerConfig
from realtime.server.app import create_app, serve_in_background
from tests.helpers.paths import TESTS

pytestmark = pytest.mark.slow

SPEECH_DIR = TESTS / "fixtures" / "speech"
API_KEY = "sdk-test-key"
FRAME_MS = 20
TURN_TIMEOUT_S = 60.0


def speech_frames(name: str) -> list[str]:
    """The fixture WAV (pcm16 24 kHz mono) as base64 20 ms frames, the SDK's usual chunking."""
    with wave.open(str(SPEECH_DIR / name)) as wav:
        assert (wav.getframerate(), wav.getnchannels(), wav.getsampwidth()) == (24000, 1, 2)
        pcm = wav.readframes(wav.getnframes())
    step = 24000 * FRAME_MS // 1000 * 2
    return [base64.b64encode(pcm[i : i + step]).decode() for i in range(0, len(pcm), step)]


@pytest.fixture
async def base_url(family_engine) -> AsyncIterator[str]:
    config = ServerConfig(port=0, api_key=API_KEY, webrtc=False)
    async with serve_in_background(create_app(config, engine=family_engine), config) as url:
        yield url


async def until(connection, event_type: str, seen: list) -> object:
    """Read events (recorded in ``seen``) up to the first of ``event_type``; an error event fails."""
    async for event in connection:
        seen.append(event)
        assert event.type != "error", event
        if event.type == event_type:
            return event
    raise AssertionError(f"the connection closed before {event_type}")


async def spoken_turn(connection, wav: str) -> list:
    """Append ``wav`` faster than real time; return every event up to the turn's response.done."""
    for frame in speech_frames(wav):
        await connection.input_audio_buffer.append(audio=frame)
    seen: list = []
    await until(connection, "response.done", seen)
    return seen


def types(events: list) -> list[str]:
    return [e.type for e in events]


GA_SESSION = {
    "type": "realtime",
    "output_modalities": ["audio"],
    "max_output_tokens": 12,
    "audio": {
        "input": {
            "format": {"type": "audio/pcm", "rate": 24000},
            "turn_detection": {
                "type": "server_vad",
                "threshold": 0.5,
                "prefix_padding_ms": 300,
                "silence_duration_ms": 500,
            },
        },
        "output": {"format": {"type": "audio/pcm", "rate": 24000}},
    },
}


@pytest.mark.timeout(120)
async def test_ga_client_holds_a_two_turn_spoken_conversation(base_url, family):
    client = AsyncOpenAI(base_url=f"{base_url}/v1", api_key=API_KEY)
    async with client.realtime.connect(model="gpt-realtime") as connection:
        created = await connection.recv()
        assert created.type == "session.created"
        assert created.session.audio.output.voice == family.default_voice
        await connection.session.update(session=GA_SESSION)
        updated = await until(connection, "session.updated", [])
        assert updated.session.audio.input.turn_detection.type == "server_vad"

        first = await spoken_turn(connection, "pair_turn1_name.wav")
        order = types(first)
        for name in (
            "input_audio_buffer.speech_started",
            "input_audio_buffer.speech_stopped",
            "input_audio_buffer.committed",
            "response.created",
        ):
            assert name in order
        assert order.index("input_audio_buffer.speech_stopped") < order.index("input_audio_buffer.committed")
        assert order.index("input_audio_buffer.committed") < order.index("response.created")
        started = next(e for e in first if e.type == "input_audio_buffer.speech_started")
        stopped = next(e for e in first if e.type == "input_audio_buffer.speech_stopped")
        # the fixture's speech spans 300..2925 ms; VAD frames are 32 ms, the silence window 500 ms
        assert 0 <= started.audio_start_ms <= 300
        assert 2925 + 500 - 100 <= stopped.audio_end_ms <= 2925 + 500 + 200

        audio = b"".join(base64.b64decode(e.delta) for e in first if e.type == "response.output_audio.delta")
        assert len(audio) >= 2 * 480, "no audio in the reply"
        assert np.abs(np.frombuffer(audio, "<i2")).max() > 0
        # every talker token (a code, or a frame of codebooks) was spoken, for its family's length of audio
        codec_tokens = first[-1].response.usage.output_token_details.audio_tokens
        frames = family.frame_samples
        assert (codec_tokens - 1) * frames < len(audio) // 2 <= codec_tokens * frames, (codec_tokens, len(audio))
        transcript = "".join(e.delta for e in first if e.type == "response.output_audio_transcript.delta")
        assert transcript, "no transcript deltas"
        done = first[-1].response
        assert done.status in ("completed", "incomplete")
        assert done.output[0].content[0].transcript == transcript
        assert done.usage.input_token_details.audio_tokens > 0
        assert done.usage.output_token_details.text_tokens > 0

        second = await spoken_turn(connection, "pair_turn2_recall.wav")
        usage = second[-1].response.usage
        # the first turn (user audio + the reply) is in the context, prefilled once: cached now
        assert usage.input_token_details.cached_tokens > done.usage.input_tokens
        assert second[-1].response.status in ("completed", "incomplete")


@pytest.mark.timeout(120)
async def test_beta_client_gets_beta_event_names(base_url):
    # The beta client always derives wss:// from base_url; plain ws:// needs its websocket_base_url.
    ws_url = base_url.replace("http://", "ws://")
    client = AsyncOpenAI(base_url=f"{base_url}/v1", websocket_base_url=f"{ws_url}/v1", api_key=API_KEY)
    async with client.beta.realtime.connect(model="gpt-4o-realtime-preview") as connection:
        seen: list = []
        await until(connection, "session.created", seen)
        assert types(seen) == ["session.created"]
        await connection.session.update(
            session={
                "modalities": ["text", "audio"],
                "input_audio_format": "pcm16",
                "output_audio_format": "pcm16",
                "turn_detection": {"type": "server_vad", "silence_duration_ms": 500},
                "max_response_output_tokens": 8,
            }
        )
        await until(connection, "session.updated", seen)
        events = await spoken_turn(connection, "capital_of_france.wav")
        order = types(events)
        assert "conversation.item.created" in order and "conversation.item.added" not in order
        assert "response.audio.delta" in order and "response.output_audio.delta" not in order
        assert "response.audio_transcript.delta" in order
        assert events[-1].response.status in ("completed", "incomplete")


async def test_sdk_without_the_key_is_refused(base_url):
    from websockets.exceptions import InvalidStatus

    client = AsyncOpenAI(base_url=f"{base_url}/v1", api_key="wrong-key")
    with pytest.raises(InvalidStatus) as info:
        async with client.realtime.connect(model="gpt-realtime"):
            pass
    assert info.value.response.status_code == 401
    body = json.loads(info.value.response.body)
    assert body["error"]["code"] == "invalid_api_key" and "wrong-key" not in info.value.response.body.decode()
