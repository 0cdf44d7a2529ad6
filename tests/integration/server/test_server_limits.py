"""Limits and access control: the pure pieces (token bucket, message gate, session slots, API key,
config validation) and, on a real server on loopback, what a client sees when it hits them."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
from collections.abc import AsyncIterator

import numpy as np
import pytest
import websockets
from websockets.exceptions import InvalidStatus

from realtime.config import ServerConfig
from realtime.errors import ErrorType
from realtime.protocol.names import Dialect
from realtime.server.app import create_app, serve_in_background
from realtime.server.auth import AccessPolicy, ApiKeyAuth, presented_key
from realtime.server.limits import LimitCode, MessageGate, RateLimit, SessionSlots, TokenBucket
from realtime.session import SessionLimits
from realtime.transports.websocket import negotiate
from tests.fakes import FakeEngine

KEY = "s3cret-key_1"


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class SilentVad:
    """A speech detector that hears nothing; counts how many were made (one per session)."""

    frame_samples = 512
    made = 0

    def __init__(self) -> None:
        SilentVad.made += 1

    def __call__(self, frame) -> float:
        return 0.0

    def reset(self) -> None:
        pass


# --- pure pieces --------------------------------------------------------------------------------


def test_token_bucket_allows_a_burst_then_the_rate():
    clock = FakeClock()
    bucket = TokenBucket(rate=4.0, burst=3, clock=clock)
    assert [bucket.take() for _ in range(4)] == [True, True, True, False]
    clock.now += 0.125  # half a token (binary-exact steps)
    assert not bucket.take()
    clock.now += 0.125
    assert bucket.take() and not bucket.take()
    clock.now += 60  # refills up to the burst, not beyond
    assert sum(bucket.take() for _ in range(10)) == 3


def test_message_gate_checks_kind_size_and_rate():
    clock = FakeClock()
    gate = MessageGate(max_message_bytes=1024, rate=RateLimit(events_per_second=1.0, burst=4), clock=clock)
    assert gate.check("x" * 1024) is None
    binary = gate.check(b"{}")
    assert binary is not None and binary.code == "invalid_event"
    # 400 three-byte characters: 400 characters but 1200 bytes
    large = gate.check("\u20ac" * 400)
    assert large is not None and large.code == LimitCode.MESSAGE_TOO_LARGE and large.type is ErrorType.RATE_LIMIT
    assert "1200 bytes" in large.message
    assert gate.check("{}") is None  # the 4th event of the burst
    limited = gate.check("{}")  # rejected messages spent tokens too
    assert limited is not None and limited.code == LimitCode.RATE_LIMIT_EXCEEDED
    clock.now += 1.0
    assert gate.check("{}") is None


def append_event(ms: int) -> str:
    """An ``input_audio_buffer.append`` of ``ms`` of pcm16 at 24 kHz (noise: only its delivery matters)."""
    pcm = np.random.default_rng(ms).integers(-3000, 3000, 24 * ms, dtype=np.int16).tobytes()
    return json.dumps({"type": "input_audio_buffer.append", "audio": base64.b64encode(pcm).decode()})


def test_the_gate_charges_audio_by_size_and_other_events_by_count():
    clock = FakeClock()
    append = append_event(20)  # 1280 base64 characters + the event's JSON
    rate = RateLimit(
        events_per_second=1.0, burst=2, audio_bytes_per_second=len(append), audio_burst_bytes=3 * len(append)
    )
    gate = MessageGate(max_message_bytes=1 << 20, rate=rate, clock=clock)
    assert [gate.check(append) for _ in range(3)] == [None] * 3
    over = gate.check(append)
    assert over is not None and over.code == LimitCode.RATE_LIMIT_EXCEEDED and "bytes per second" in over.message
    # the audio bucket is empty; the control events behind the audio still pass, from their own bucket
    assert gate.check('{"type": "input_audio_buffer.commit"}') is None
    assert gate.check('{"type":"response.create"}') is None
    flooded = gate.check('{"type":"response.create"}')
    assert (
        flooded is not None and flooded.code == LimitCode.RATE_LIMIT_EXCEEDED and "events per second" in flooded.message
    )
    clock.now += 1.0  # one more append and one more event a second
    assert gate.check(append) is None and gate.check(append) is not None
    assert gate.check('{"type":"session.update","session":{}}') is None


def test_a_flood_of_control_events_is_limited_and_audio_still_flows():
    clock = FakeClock()
    gate = MessageGate(max_message_bytes=1 << 20, rate=RateLimit(events_per_second=10.0, burst=20), clock=clock)
    results = [gate.check('{"type":"response.cancel"}') for _ in range(1000)]
    assert sum(r is None for r in results) == 20
    assert gate.check(append_event(20)) is None, "audio has its own bucket"
    clock.now += 0.5
    assert sum(gate.check('{"type":"response.cancel"}') is None for _ in range(100)) == 5


def test_an_append_larger_than_the_audio_burst_passes_when_the_bucket_is_full_then_the_rest_waits():
    clock = FakeClock()
    gate = MessageGate(
        max_message_bytes=1 << 20, rate=RateLimit(audio_bytes_per_second=1000, audio_burst_bytes=2000), clock=clock
    )
    big = append_event(100)  # ~6.4 kB: never refused for good
    assert gate.check(big) is None and gate.check(append_event(1)) is not None
    clock.now += len(big) / 1000  # the debt repaid, the bucket full again
    assert gate.check(append_event(1)) is None


def test_the_default_rates_take_a_recorded_30_second_utterance_at_once():
    gate = MessageGate(max_message_bytes=ServerConfig().max_message_bytes, rate=RateLimit(), clock=FakeClock())
    append = append_event(20)
    assert all(gate.check(append) is None for _ in range(1500))
    assert (
        gate.check('{"type":"input_audio_buffer.commit"}') is None and gate.check('{"type":"response.create"}') is None
    )


@pytest.mark.parametrize("field", ["burst", "audio_bytes_per_second", "audio_burst_bytes"])
def test_rate_limit_fields_are_validated(field):
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match=field):
            RateLimit(**{field: bad})


def test_session_slots_cap_live_sessions_and_release_once():
    slots = SessionSlots(2)
    first, second = slots.try_acquire(), slots.try_acquire()
    assert first is not None and second is not None and slots.try_acquire() is None
    first.release()
    first.release()  # idempotent: does not free a second slot
    assert slots.active == 1
    with slots.try_acquire():
        assert slots.active == 2
    assert slots.active == 1
    assert slots.refusal().code == LimitCode.SESSION_LIMIT_REACHED


@pytest.mark.parametrize(
    ("headers", "subprotocols", "key"),
    [
        ({"authorization": f"Bearer {KEY}"}, [], KEY),
        ({"authorization": f"bearer  {KEY} "}, [], KEY),
        ({}, ["realtime", f"openai-insecure-api-key.{KEY}"], KEY),
        ({"authorization": "Bearer header-wins"}, [f"openai-insecure-api-key.{KEY}"], "header-wins"),
        ({"authorization": f"Basic {KEY}"}, [], None),
        ({}, ["realtime", "openai-insecure-api-key."], None),
        ({}, [], None),
    ],
)
def test_presented_key_forms(headers, subprotocols, key):
    assert presented_key(headers, subprotocols) == key


def test_api_key_auth_and_origin_policy():
    auth = ApiKeyAuth(KEY)
    assert auth.check({"authorization": f"Bearer {KEY}"}) is None
    wrong = auth.check({"authorization": "Bearer nope"})
    missing = auth.check({})
    assert wrong is not None and wrong.code == "invalid_api_key" and wrong.type is ErrorType.AUTHENTICATION
    assert missing is not None and "missing" in missing.message
    assert KEY not in repr(auth) and ApiKeyAuth(None).check({}) is None
    policy = AccessPolicy(KEY, allowed_origins=("https://good.example",))
    foreign = policy.check({"origin": "https://evil.example", "authorization": f"Bearer {KEY}"})
    assert foreign is not None and foreign.status == 403 and foreign.error.code == "origin_not_allowed"
    assert policy.check({"origin": "https://good.example", "authorization": f"Bearer {KEY}"}) is None
    assert policy.check({"authorization": f"Bearer {KEY}"}) is None  # not a browser: no Origin
    refused = policy.check({"origin": "https://good.example"})
    assert refused is not None and refused.status == 401


def test_negotiate_reads_the_beta_header_among_others():
    assert negotiate({"openai-beta": "assistants=v2, realtime=v1"}, []).dialect is Dialect.BETA
    assert negotiate({"openai-beta": "assistants=v2"}, ["realtime"]).dialect is Dialect.GA
    assert negotiate({}, [f"openai-insecure-api-key.{KEY}"]).subprotocol is None


@pytest.mark.parametrize(
    "bad",
    [
        {"port": 70000},
        {"api_key": "has space"},
        {"api_key": ""},
        {"max_sessions": 0},
        {"max_message_bytes": 10},
        {"log_level": "loud"},
        {"ws_implementation": "wsproto"},
        {"allowed_origins": "https://x"},
    ],
)
def test_server_config_rejects_bad_values(bad):
    with pytest.raises(ValueError):
        ServerConfig(**bad)


def test_server_config_hides_the_key():
    assert KEY not in repr(ServerConfig(api_key=KEY))


# --- on a real server ---------------------------------------------------------------------------


@contextlib.asynccontextmanager
async def served(engine, **config) -> AsyncIterator[tuple[str, object]]:
    cfg = ServerConfig(port=0, webrtc=False, **config)
    app = create_app(cfg, engine=engine, vad_factory=SilentVad)
    async with serve_in_background(app, cfg) as url:
        yield url.replace("http://", "ws://") + "/v1/realtime", app


async def until(ws, event_type: str, timeout: float = 10.0) -> dict:
    async with asyncio.timeout(timeout):
        while True:
            event = json.loads(await ws.recv())
            if event["type"] == event_type:
                return event


def user_text(text: str) -> str:
    return json.dumps(
        {
            "type": "conversation.item.create",
            "item": {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]},
        }
    )


@pytest.mark.parametrize(
    ("headers", "subprotocols"),
    [({}, None), ({"Authorization": "Bearer wrong"}, None), ({}, ["realtime", "openai-insecure-api-key.wrong"])],
)
async def test_a_wrong_or_missing_key_is_refused_before_any_model_work(headers, subprotocols):
    engine, vads = FakeEngine(), SilentVad.made
    async with served(engine, api_key=KEY) as (url, app):
        with pytest.raises(InvalidStatus) as info:
            await websockets.connect(url, additional_headers=headers, subprotocols=subprotocols)
        response = info.value.response
        assert response.status_code == 401
        assert json.loads(response.body)["error"]["code"] == "invalid_api_key"
        assert b"wrong" not in response.body
        assert engine.conversations == [] and SilentVad.made == vads
        metrics = app.state.realtime.metrics.render().decode()
        assert 'omni_realtime_sessions_refused_total{reason="invalid_api_key"} 1.0' in metrics


@pytest.mark.parametrize(
    ("headers", "subprotocols", "echoed"),
    [
        ({"Authorization": f"Bearer {KEY}"}, None, None),
        ({}, ["realtime", f"openai-insecure-api-key.{KEY}"], "realtime"),
    ],
)
async def test_bearer_and_subprotocol_keys_are_accepted(headers, subprotocols, echoed):
    async with served(FakeEngine(), api_key=KEY) as (url, _):
        async with websockets.connect(url, additional_headers=headers, subprotocols=subprotocols) as ws:
            assert ws.subprotocol == echoed
            assert (await until(ws, "session.created"))["type"] == "session.created"


async def test_a_foreign_origin_is_refused():
    async with served(FakeEngine(), allowed_origins=("http://good.example",)) as (url, _):
        with pytest.raises(InvalidStatus) as info:
            await websockets.connect(url, origin="http://evil.example")
        assert info.value.response.status_code == 403
        async with websockets.connect(url, origin="http://good.example") as ws:
            await until(ws, "session.created")


async def test_too_many_sessions_are_refused_with_a_reason_and_retry_works():
    engine = FakeEngine()
    async with served(engine, max_sessions=1) as (url, app):
        async with websockets.connect(url) as first:
            await until(first, "session.created")
            async with websockets.connect(url) as second:
                error = json.loads(await second.recv())
                assert error["type"] == "error"
                assert error["error"]["code"] == "session_limit_reached"
                assert error["error"]["type"] == "rate_limit_error" and "try again later" in error["error"]["message"]
                with pytest.raises(websockets.ConnectionClosed) as info:
                    await second.recv()
                assert (info.value.rcvd.code, info.value.rcvd.reason) == (1013, "try again later")
            assert len(engine.conversations) == 1
        async with asyncio.timeout(5):
            while app.state.realtime.health()["sessions"]:
                await asyncio.sleep(0.02)
        async with websockets.connect(url) as third:
            await until(third, "session.created")


async def test_an_oversized_message_gets_an_error_and_the_connection_stays():
    async with served(FakeEngine(), max_message_bytes=4096) as (url, _):
        async with websockets.connect(url, max_size=None) as ws:
            await until(ws, "session.created")
            await ws.send(user_text("x" * 5000))
            error = (await until(ws, "error"))["error"]
            assert error["code"] == "message_too_large" and "4096" in error["message"]
            await ws.send(user_text("small"))
            assert (await until(ws, "conversation.item.added"))["item"]["content"][0]["text"] == "small"
            # beyond the transport's hard cap (twice the limit) the connection closes: 1009
            await ws.send(user_text("x" * 9000))
            with pytest.raises(websockets.ConnectionClosed) as info:
                await until(ws, "never")
            assert info.value.rcvd.code == 1009


async def test_the_input_audio_buffer_limit_is_enforced():
    limits = SessionLimits(max_buffer_ms=1000)
    async with served(FakeEngine(), session_limits=limits) as (url, _):
        async with websockets.connect(url) as ws:
            await until(ws, "session.created")
            await ws.send(
                json.dumps(
                    {
                        "type": "session.update",
                        "session": {"type": "realtime", "audio": {"input": {"turn_detection": None}}},
                    }
                )
            )
            await until(ws, "session.updated")
            chunk = base64.b64encode(bytes(600 * 48)).decode()  # 600 ms of pcm16 at 24 kHz
            await ws.send(json.dumps({"type": "input_audio_buffer.append", "audio": chunk}))
            await ws.send(json.dumps({"type": "input_audio_buffer.append", "event_id": "over", "audio": chunk}))
            error = (await until(ws, "error"))["error"]
            assert (error["code"], error["event_id"]) == ("input_audio_buffer_full", "over")
            await ws.send(json.dumps({"type": "input_audio_buffer.commit"}))
            assert (await until(ws, "input_audio_buffer.committed"))["item_id"]


async def test_a_recorded_30_second_utterance_sent_at_full_speed_gets_its_response():
    """1500 appends of 20 ms as fast as the socket takes them, then commit and response.create: nothing is dropped."""
    async with served(FakeEngine()) as (url, _):
        async with websockets.connect(url) as ws:
            await until(ws, "session.created")
            manual = {
                "type": "session.update",
                "session": {"type": "realtime", "audio": {"input": {"turn_detection": None}}},
            }
            await ws.send(json.dumps(manual))
            await until(ws, "session.updated")
            append = append_event(20)
            for _ in range(1500):
                await ws.send(append)
            await ws.send(json.dumps({"type": "input_audio_buffer.commit"}))
            await ws.send(json.dumps({"type": "response.create"}))
            seen = []
            async with asyncio.timeout(30):
                while not seen or seen[-1]["type"] != "response.done":
                    event = json.loads(await ws.recv())
                    if event["type"] in ("error", "input_audio_buffer.committed", "response.done"):
                        seen.append(event)
            assert [e["type"] for e in seen] == ["input_audio_buffer.committed", "response.done"], seen[:3]
            assert seen[-1]["response"]["status"] == "completed"


async def test_the_event_rate_is_limited_per_session():
    async with served(FakeEngine(), rate_limit=RateLimit(events_per_second=2.0, burst=3)) as (url, _):
        async with websockets.connect(url) as ws, websockets.connect(url) as other:
            await until(ws, "session.created")
            await until(other, "session.created")
            for i in range(5):
                await ws.send(user_text(f"m{i}"))
            codes = []
            async with asyncio.timeout(5):
                while len(codes) < 5:
                    event = json.loads(await ws.recv())
                    if event["type"] in ("conversation.item.added", "error"):
                        codes.append(event["error"]["code"] if event["type"] == "error" else "ok")
            assert codes.count("ok") == 3 and codes.count("rate_limit_exceeded") == 2
            # the other session has its own bucket; this one refills
            await other.send(user_text("fine"))
            await until(other, "conversation.item.added")
            await asyncio.sleep(0.6)
            await ws.send(user_text("later"))
            assert (await until(ws, "conversation.item.added"))["item"]["content"][0]["text"] == "later"
