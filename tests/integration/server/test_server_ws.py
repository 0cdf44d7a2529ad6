"""The WebSocket endpoint against a real server on loopback: barge-in on the tiny engines, every bad
input answered with its error while the session keeps working, session isolation, dialect and
subprotocol negotiation, cleanup when a client vanishes."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
from collections.abc import AsyncIterator

import numpy as np
import pytest
import websockets

from realtime.config import ServerConfig
from realtime.server.app import create_app, serve_in_background
from tests.fakes import FakeEngine, Script
from tests.helpers.server import of_response, user_text
from tests.helpers.speech import FRAME_BYTES, SPEECH_DIR, b64, wav_pcm

MANIFEST = json.loads((SPEECH_DIR / "manifest.json").read_text())


@contextlib.asynccontextmanager
async def served(engine, **config) -> AsyncIterator[tuple[str, object]]:
    """A real server on a free loopback port; yields its ws:// URL of /v1/realtime and the app."""
    cfg = ServerConfig(port=0, webrtc=False, **config)
    app = create_app(cfg, engine=engine)
    async with serve_in_background(app, cfg) as url:
        yield url.replace("http://", "ws://") + "/v1/realtime", app


class Client:
    """A raw WebSocket client that records every event it reads, in order."""

    def __init__(self, ws) -> None:
        self.ws = ws
        self.events: list[dict] = []

    async def send(self, event: dict | str | bytes) -> None:
        await self.ws.send(event if isinstance(event, (str, bytes)) else json.dumps(event))

    async def until(self, event_type: str, timeout: float = 30.0) -> dict:
        async with asyncio.timeout(timeout):
            while True:
                event = json.loads(await self.ws.recv())
                self.events.append(event)
                if event["type"] == event_type:
                    return event

    async def append(self, pcm: bytes) -> None:
        for i in range(0, len(pcm), FRAME_BYTES):
            await self.send({"type": "input_audio_buffer.append", "audio": b64(pcm[i : i + FRAME_BYTES])})


@contextlib.asynccontextmanager
async def connect(url: str, **kwargs) -> AsyncIterator[Client]:
    async with websockets.connect(url, max_size=None, **kwargs) as ws:
        client = Client(ws)
        await client.until("session.created")
        yield client


def silence(ms: int) -> bytes:
    return bytes(ms * 48)


# --- barge-in on the real engine ----------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.timeout(120)
async def test_barge_in_cancels_the_response_and_truncate_works(family_engine):
    async with served(family_engine) as (url, _), connect(url) as client:
        await client.send({"type": "session.update", "session": {"type": "realtime", "max_output_tokens": 200}})
        await client.until("session.updated")
        await client.append(wav_pcm("capital_of_france.wav"))
        created = await client.until("response.created")
        rid = created["response"]["id"]
        await client.until("response.output_audio.delta")

        # the user talks over the reply (speech only: the turn stays open)
        joke = MANIFEST["short_joke.wav"]
        await client.append(wav_pcm("short_joke.wav", 0, joke["speech_end_ms"]))
        started = await client.until("input_audio_buffer.speech_started")
        cut = len(client.events)
        done = await client.until("response.done")
        assert done["response"]["id"] == rid, "the reply ended before the user's speech was detected"
        assert done["response"]["status"] == "cancelled"
        assert done["response"]["status_details"]["reason"] == "turn_detected"
        assert not of_response(client.events[cut:], "response.output_audio.delta", rid)
        assert started["audio_start_ms"] > 0

        heard = of_response(client.events, "response.output_audio.delta", rid)
        heard_ms = sum(len(base64.b64decode(e["delta"])) for e in heard) // 48
        item_id = done["response"]["output"][0]["id"]
        await client.send(
            {
                "type": "conversation.item.truncate",
                "item_id": item_id,
                "content_index": 0,
                "audio_end_ms": heard_ms // 2,
            }
        )
        truncated = await client.until("conversation.item.truncated")
        assert (truncated["item_id"], truncated["audio_end_ms"]) == (item_id, heard_ms // 2)

        # the interrupting turn ends and gets its own reply
        await client.append(silence(800))
        await client.until("input_audio_buffer.committed")
        second = await client.until("response.done")
        assert second["response"]["id"] != rid
        assert second["response"]["status"] in ("completed", "incomplete")
        assert not [e for e in client.events if e["type"] == "error"]


async def test_a_truncate_of_an_earlier_reply_while_a_later_response_runs_reaches_the_engine_when_it_ends():
    """pipecat's truncate on speech_started, arriving after that turn's reply began: answered at once, applied in the
    engine (which refuses edits while a response runs) only once the running response has ended."""
    engine = FakeEngine()
    engine.script(Script(), Script(manual=True))
    async with served(engine) as (url, _), connect(url) as client:
        await client.send({"type": "session.update", "session": {"audio": {"input": {"turn_detection": None}}}})
        await client.until("session.updated")
        await client.send(user_text("Hello?"))
        await client.send({"type": "response.create"})
        first = (await client.until("response.done"))["response"]["output"][0]["id"]
        await client.send(user_text("And then?"))
        await client.send({"type": "response.create"})
        await client.until("response.created")
        truncate = {"type": "conversation.item.truncate", "item_id": first, "content_index": 0, "audio_end_ms": 40}
        await client.send(truncate)
        truncated = await client.until("conversation.item.truncated")
        assert (truncated["item_id"], truncated["audio_end_ms"]) == (first, 40)
        (conversation,) = engine.conversations
        running = conversation.responses[-1]
        assert running.done is None and ("truncate", first, 40) not in conversation.calls
        running.release(10)
        await client.until("response.done")
        async with asyncio.timeout(5):
            while ("truncate", first, 40) not in conversation.calls:
                await asyncio.sleep(0.01)
        assert not [e for e in client.events if e["type"] == "error"]


async def test_a_preemptive_reply_withdrawn_mid_sentence_then_shown_with_the_real_vad():
    from realtime.bench.speech import DEFAULT_FOLDER, load_speech_folder, with_pause

    (speech,) = [s for s in load_speech_folder(DEFAULT_FOLDER) if s.name == "capital_of_france.wav"]
    paused = with_pause(speech, 300)  # the user stops 300 ms mid-sentence, then goes on
    pcm = (np.clip(paused.pcm, -1, 1) * 32767).astype("<i2").tobytes() + silence(1000)
    engine = FakeEngine(Script(text=("Paris.",), audio_chunks=2, delay_s=0.02))
    async with served(engine, preemptive_response_ms=200) as (url, app), connect(url) as client:
        await client.append(pcm)
        done = await client.until("response.done")
        assert done["response"]["status"] == "completed"
        types = [e["type"] for e in client.events]
        assert types.count("input_audio_buffer.speech_stopped") == types.count("response.created") == 1
        assert "error" not in types
        conversation = engine.conversations[0]
        first, answer = conversation.responses
        assert first.cancel_reason == "turn_detected" and answer.cancel_reason is None
        commits = [c for c in conversation.calls if c[0] == "commit"]
        assert len(commits) == 2 and commits[0][1] == commits[1][1]  # one message, committed again whole
        metrics = app.state.realtime.metrics.render().decode()
        assert 'omni_realtime_preemptive_replies_total{outcome="withdrawn"} 1.0' in metrics
        assert 'omni_realtime_preemptive_replies_total{outcome="shown"} 1.0' in metrics


@pytest.mark.slow
@pytest.mark.timeout(120)
async def test_a_withdrawn_reply_on_the_real_engine_leaves_one_message_and_one_answer(tiny_engine):
    from realtime.bench.speech import DEFAULT_FOLDER, load_speech_folder, with_pause

    (speech,) = [s for s in load_speech_folder(DEFAULT_FOLDER) if s.name == "short_joke.wav"]
    pcm = (np.clip(with_pause(speech, 300).pcm, -1, 1) * 32767).astype("<i2").tobytes() + silence(1000)
    async with served(tiny_engine, preemptive_response_ms=200) as (url, app), connect(url) as client:
        await client.append(pcm)
        done = await client.until("response.done")
        assert done["response"]["status"] in ("completed", "incomplete")
        types = [e["type"] for e in client.events]
        assert types.count("response.created") == types.count("input_audio_buffer.committed") == 1
        assert "error" not in types and "response.output_audio.delta" in types
        metrics = app.state.realtime.metrics.render().decode()
        assert 'omni_realtime_preemptive_replies_total{outcome="withdrawn"} 1.0' in metrics
        stats = await tiny_engine.stats()  # a round trip through the engine's loop: it is idle after it
        assert (stats.responses, stats.open_audio_messages) == (0, 0)
        committed = next(e for e in client.events if e["type"] == "input_audio_buffer.committed")
        user, reply = committed["item_id"], done["response"]["output"][0]["id"]
        core = tiny_engine._backend.core  # the engine's own state (a thread on the CPU): what the model will hear
        (conv,) = [c for c in core.scheduler.conversations.values() if any(i.id == user for i in c.items)]
        spoken = [(i.id, i.role) for i in conv.items if i.role in ("user", "assistant")]
        assert spoken == [(user, "user"), (reply, "assistant")]  # the withdrawn reply and first commit are gone
        # the conversation goes on: a second turn is answered after the first
        await client.append(wav_pcm("weather_today.wav") + silence(1000))
        second = await client.until("response.done")
        assert second["response"]["id"] != done["response"]["id"]
        assert not [e for e in client.events if e["type"] == "error"]


# --- bad input: an error each, and the session carries on ---------------------------------------

BAD_INPUTS = [
    # (what, message, expected code, expected param, expected event_id)
    ("invalid JSON", "{not json", "invalid_json", None, None),
    ("not an object", "[1, 2]", "invalid_event", None, None),
    ("unknown event type", {"type": "conversation.nonsense", "event_id": "c2"}, "unknown_event_type", "type", "c2"),
    (
        "missing field",
        {"type": "conversation.item.retrieve", "event_id": "c3"},
        "missing_required_parameter",
        "item_id",
        "c3",
    ),
    (
        "invalid field type",
        {
            "type": "conversation.item.truncate",
            "event_id": "c4",
            "item_id": "x",
            "content_index": "zero",
            "audio_end_ms": 0,
        },
        "invalid_type",
        "content_index",
        "c4",
    ),
    (
        "invalid field value",
        {
            "type": "session.update",
            "event_id": "c5",
            "session": {
                "type": "realtime",
                "audio": {"input": {"turn_detection": {"type": "server_vad", "threshold": 7}}},
            },
        },
        "invalid_value",
        "session.audio.input.turn_detection.threshold",
        "c5",
    ),
    (
        "unknown voice",
        {
            "type": "session.update",
            "event_id": "c5b",
            "session": {"type": "realtime", "audio": {"output": {"voice": "Nobody"}}},
        },
        "unknown_voice",
        "session.audio.output.voice",
        "c5b",
    ),
    (
        "undecodable base64",
        {"type": "input_audio_buffer.append", "event_id": "c6", "audio": "%%%not base64%%%"},
        "invalid_base64",
        "audio",
        "c6",
    ),
    (
        "odd-length pcm16",
        {"type": "input_audio_buffer.append", "event_id": "c7", "audio": b64(b"\x01\x02\x03")},
        "invalid_audio",
        "audio",
        "c7",
    ),
    (
        "commit of an empty buffer",
        {"type": "input_audio_buffer.commit", "event_id": "c8"},
        "input_audio_buffer_commit_empty",
        None,
        "c8",
    ),
    (
        "cancel with nothing running",
        {"type": "response.cancel", "event_id": "c9"},
        "response_cancel_not_active",
        None,
        "c9",
    ),
    (
        "unknown item",
        {"type": "conversation.item.delete", "event_id": "c10", "item_id": "nope"},
        "item_not_found",
        "item_id",
        "c10",
    ),
    ("binary frame", b"\x00\x01binary", "invalid_event", None, None),
]


async def test_each_bad_input_gets_its_error_and_the_session_keeps_working():
    engine = FakeEngine()
    async with served(engine) as (url, _), connect(url) as client:
        for n, (what, message, code, param, event_id) in enumerate(BAD_INPUTS):
            await client.send(message)
            error = (await client.until("error"))["error"]
            assert set(error) == {"type", "code", "message", "param", "event_id"}, what
            assert (error["type"], error["code"], error["param"], error["event_id"]) == (
                "invalid_request_error",
                code,
                param,
                event_id,
            ), what
            assert error["message"], what
            # a valid event right after gets its normal answer
            await client.send(
                {
                    "type": "conversation.item.create",
                    "event_id": f"ok{n}",
                    "item": {
                        "type": "message",
                        "role": "user",
                        "content": [{"type": "input_text", "text": f"after {what}"}],
                    },
                }
            )
            added = await client.until("conversation.item.added")
            assert added["item"]["content"][0]["text"] == f"after {what}"
        await client.send({"type": "response.create", "response": {"output_modalities": ["text"]}})
        done = await client.until("response.done")
        assert done["response"]["status"] == "completed"
        assert done["response"]["output"][0]["content"][0]["text"] == "Hello there!"
    texts = [call[2] for call in engine.conversations[0].calls if call[0] == "add_text"]
    assert texts == [f"after {case[0]}" for case in BAD_INPUTS]


# --- isolation ----------------------------------------------------------------------------------


async def converse(client: Client, text: str) -> dict:
    """Create a user item with the same client-chosen id in any session, then get a reply."""
    await client.send(
        {
            "type": "conversation.item.create",
            "item": {
                "id": "item_same",
                "type": "message",
                "role": "user",
                "content": [{"type": "input_text", "text": text}],
            },
        }
    )
    await client.until("conversation.item.done")
    await client.send({"type": "response.create", "response": {"max_output_tokens": 8}})
    return await client.until("response.done")


@pytest.mark.slow
@pytest.mark.timeout(120)
async def test_two_concurrent_sessions_never_see_each_others_state(tiny_engine):
    async with served(tiny_engine) as (url, app), connect(url) as a, connect(url) as b:
        assert app.state.realtime.health()["sessions"] == 2
        done_a, done_b = await asyncio.gather(converse(a, "I am Alice."), converse(b, "I am Bob, from elsewhere."))
        # separate sessions, conversations, responses and reply items
        assert a.events[0]["session"]["id"] != b.events[0]["session"]["id"]
        assert done_a["response"]["conversation_id"] != done_b["response"]["conversation_id"]
        rid_a, rid_b = done_a["response"]["id"], done_b["response"]["id"]
        assert rid_a != rid_b
        for client, own in ((a, rid_a), (b, rid_b)):
            rids = {e["response_id"] for e in client.events if "response_id" in e}
            assert rids == {own}, "a session saw another session's response events"
            assert of_response(client.events, "response.output_audio.delta", own)
        # the same client-chosen item id holds each session's own text
        for client, text in ((a, "I am Alice."), (b, "I am Bob, from elsewhere.")):
            await client.send({"type": "conversation.item.retrieve", "item_id": "item_same"})
            item = (await client.until("conversation.item.retrieved"))["item"]
            assert item["content"][0]["text"] == text
        # an item of one session does not exist in the other
        await a.send({"type": "conversation.item.retrieve", "item_id": done_b["response"]["output"][0]["id"]})
        assert (await a.until("error"))["error"]["code"] == "item_not_found"
        # each reply was generated from its own session's prompt: Bob's longer text makes a longer one
        prompt_a, prompt_b = (prompt_tokens(done["response"]["usage"]) for done in (done_a, done_b))
        assert prompt_b > prompt_a


async def test_a_failure_inside_one_session_never_affects_another():
    engine = FakeEngine()
    async with served(engine) as (url, _), connect(url) as a, connect(url) as b:
        engine.script(Script(crash_after=1))  # the next response's stream breaks mid-way
        engine.fail_next("add_text", RuntimeError("engine bug"))
        await a.send({"type": "response.create"})
        failed = await a.until("response.done")
        assert failed["response"]["status"] == "failed"
        assert failed["response"]["status_details"]["error"]["code"] == "server_error"
        await a.send(
            {
                "type": "conversation.item.create",
                "item": {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]},
            }
        )
        error = (await a.until("error"))["error"]
        assert error["code"] == "server_error" and "engine bug" not in error["message"]
        # the other session, and the failed one, keep working
        for client in (b, a):
            await client.send({"type": "response.create"})
            assert (await client.until("response.done"))["response"]["status"] == "completed"


def prompt_tokens(usage: dict) -> int:
    """The whole prompt of a response: what it prefilled plus what was already cached."""
    return usage["input_tokens"] + usage["input_token_details"]["cached_tokens"]


# --- handshake ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("offered", "headers", "echoed", "beta"),
    [
        (None, {}, None, False),
        (["realtime"], {}, "realtime", False),
        (["realtime", "openai-beta.realtime-v1"], {}, "realtime", True),
        (["openai-beta.realtime-v1"], {}, "openai-beta.realtime-v1", True),
        (None, {"OpenAI-Beta": "realtime=v1"}, None, True),
    ],
)
async def test_dialect_and_subprotocol_negotiation(offered, headers, echoed, beta):
    async with served(FakeEngine()) as (url, _):
        async with connect(url, subprotocols=offered, additional_headers=headers) as client:
            assert client.ws.subprotocol == echoed
            await client.send({"type": "response.create", "response": {"output_modalities": ["text"]}})
            await client.until("response.done")
            names = {e["type"] for e in client.events}
            assert ("response.text.delta" in names) is beta
            assert ("response.output_text.delta" in names) is not beta


# --- lifecycle ----------------------------------------------------------------------------------


async def test_a_vanished_client_ends_its_session_and_frees_the_conversation():
    engine = FakeEngine(Script(text=("x",) * 50, delay_s=0.05))
    async with served(engine) as (url, app):
        async with connect(url) as client:
            await client.send({"type": "response.create"})
            await client.until("response.output_audio.delta")
        server = app.state.realtime
        async with asyncio.timeout(5):
            while server.health()["sessions"]:
                await asyncio.sleep(0.02)
        conversation = engine.conversations[0]
        assert conversation.closed and conversation.responses[0].cancel_reason is not None
        metrics = server.metrics.render().decode()
        assert 'omni_realtime_sessions_active{transport="websocket"} 0.0' in metrics


async def test_shutdown_closes_live_sessions():
    engine = FakeEngine()
    async with served(engine) as (url, _):
        ws = await websockets.connect(url)
        await ws.recv()
    with pytest.raises(websockets.ConnectionClosed) as info:
        await asyncio.wait_for(ws.recv(), 5)
    assert info.value.rcvd is not None and info.value.rcvd.code in (1001, 1012)
    assert engine.conversations[0].closed
