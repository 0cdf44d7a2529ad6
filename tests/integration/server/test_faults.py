"""Faults on a real server on loopback: an engine failure inside one session (the fake engine and the
tiny engine with one stage broken for one conversation), clients that vanish mid-response (WebSocket
close, TCP reset, a WebRTC peer process killed), a client that stops reading, and SIGTERM on
``omni-realtime serve``. After each fault the server holds nothing of the failed session: no task,
peer connection, engine conversation, response or KV position (``RealtimeServer.hygiene``)."""

from __future__ import annotations

import asyncio
import base64
import gc
import json
import logging
import signal
import subprocess
import sys

import pytest
import websockets

from realtime.server.limits import RateLimit
from tests.fakes import Script
from tests.helpers.server import REPO, RawClient, ServeProcess, StatsEngine, assert_clean, connect, served, user_text

pytestmark = pytest.mark.slow

# --- an engine failure in one session -----------------------------------------------------------


async def test_a_failing_response_gets_an_error_and_a_failed_done_and_others_carry_on():
    engine = StatsEngine()
    async with served(engine) as (url, app), connect(url) as victim, connect(url) as other:
        engine.script(Script(text=("a", "b", "c"), crash_after=1))  # the victim's stream breaks mid-way
        await victim.send(user_text("hello"))
        await victim.send({"type": "response.create", "event_id": "boom"})
        done = await victim.until("response.done")
        errors = victim.of_type("error")
        assert len(errors) == 1, victim.types()
        error = errors[0]["error"]
        assert set(error) == {"type", "code", "message", "param", "event_id"}
        assert (error["type"], error["code"]) == ("server_error", "server_error")
        assert error["message"] == "internal server error"
        assert victim.types().index("error") < victim.types().index("response.done")
        assert done["response"]["status"] == "failed"
        assert done["response"]["status_details"]["error"]["code"] == "server_error"
        # the other session never saw it, and both keep working
        for client in (other, victim):
            await client.send(user_text("again"))
            await client.send({"type": "response.create"})
            assert (await client.until("response.done"))["response"]["status"] == "completed"
        assert not other.of_type("error")
    await assert_clean(app)


@pytest.mark.timeout(120)
async def test_a_stage_that_fails_for_one_conversation_of_the_tiny_engine(tiny_engine, monkeypatch):
    """The talker breaks for one conversation only: that response fails (error + response.done
    failed, its cache dropped), a concurrent session's response completes, and the failed session
    answers its next turn normally."""
    core = tiny_engine.core
    talker_prefill = core.runner.talker_prefill
    broken = {"on": True}

    def flaky_talker(r, **kwargs):
        if broken["on"] and any(item.text == "FAIL ME" for item in r.conv.items):
            broken["on"] = False
            raise RuntimeError("injected talker fault")
        return talker_prefill(r, **kwargs)

    monkeypatch.setattr(core.runner, "talker_prefill", flaky_talker)
    async with served(tiny_engine) as (url, app), connect(url) as victim, connect(url) as other:
        for client, text in ((victim, "FAIL ME"), (other, "Hello there, how are you?")):
            await client.send({"type": "session.update", "session": {"type": "realtime", "max_output_tokens": 12}})
            await client.send(user_text(text))
            await client.send({"type": "response.create"})
        failed, completed = await asyncio.gather(victim.until("response.done"), other.until("response.done"))
        assert failed["response"]["status"] == "failed"
        (error,) = victim.of_type("error")
        assert (error["error"]["type"], error["error"]["code"]) == ("server_error", "engine_failure")
        assert "injected" not in json.dumps(victim.events), "the exception's text stays in the server log"
        assert completed["response"]["status"] in ("completed", "incomplete")
        assert not other.of_type("error")
        assert other.of_type("response.output_audio.delta")
        # the failed session carries on: its conversation is re-prefilled from scratch
        await victim.send(user_text("Are you still there?"))
        await victim.send({"type": "response.create"})
        again = await victim.until("response.done")
        assert again["response"]["status"] in ("completed", "incomplete")
        assert not broken["on"]
    await assert_clean(app)


# --- clients that vanish mid-response -----------------------------------------------------------


@pytest.mark.timeout(120)
@pytest.mark.parametrize("how", ["close", "reset"])
async def test_a_client_that_leaves_mid_response_frees_everything(tiny_engine, how):
    """A WebSocket close, or a TCP reset (no close frame, no FIN), while the tiny engine streams a
    reply: the response is cancelled and the conversation, its KV cache and every task are freed."""
    async with served(tiny_engine) as (url, app):
        client = await RawClient.open(url)
        await client.until("session.created")
        await client.send(user_text("Tell me a long story about the sea."))
        await client.send({"type": "response.create"})
        await client.until("response.output_audio.delta", timeout=60)
        live = await app.state.realtime.hygiene()
        assert live.engine.responses == app.state.idle.engine.responses + 1
        if how == "reset":
            client.reset()
        else:
            client.protocol.send_close(1000)
            await client.flush()
            client.close()
        await assert_clean(app, timeout=30)
        assert "response.done" not in [e["type"] for e in client.events]


class BrokenVad:
    """A speech detector with a bug: the session that feeds it audio fails."""

    frame_samples = 512

    def __call__(self, frame) -> float:
        raise ZeroDivisionError("vad bug")

    def reset(self) -> None:
        pass


async def test_a_bug_inside_one_session_closes_it_with_1011_and_the_others_carry_on(caplog):
    """(Every session gets the broken detector; only the one fed audio calls it.)"""
    async with served(StatsEngine(), vad_factory=BrokenVad) as (url, app), connect(url) as other:
        client = await RawClient.open(url)
        await client.until("session.created")
        await client.send({"type": "input_audio_buffer.append", "audio": base64.b64encode(bytes(4800)).decode()})
        assert await client.until_closed() == 1011
        assert client.close_reason == "internal server error"
        await other.send(user_text("still there?"))
        await other.send({"type": "response.create"})
        assert (await other.until("response.done"))["response"]["status"] == "completed"
        client.close()
        await other.ws.close()
        await assert_clean(app)
    (failure,) = [r for r in caplog.records if r.levelname == "ERROR"]
    assert failure.getMessage().endswith("failed") and "vad bug" in str(failure.exc_info[1])


# --- a client that stops reading ----------------------------------------------------------------


async def test_a_client_that_stops_reading_while_sending_hits_the_hard_limit_and_gets_1008():
    """The client floods requests and reads nothing: its outbound queue grows to the hard limit
    (never beyond), then the session ends; reading again, the client finds its events up to then
    and the close frame 1008."""
    engine = StatsEngine()
    async with served(engine, rate_limit=RateLimit(events_per_second=1e6, burst=10**6)) as (url, app):
        client = await RawClient.open(url, rcvbuf=1 << 16)
        await client.until("session.created")
        server = app.state.realtime
        ghost = "g" * 2000  # each request is answered with an error quoting this id: ~2 KB
        most_queued = 0
        for n in range(3 * 4096):
            if not await client.send({"type": "conversation.item.retrieve", "item_id": ghost}, timeout=2.0):
                break  # the server stopped reading: the session is over
            if n % 64 == 0:
                most_queued = max(most_queued, (await server.hygiene()).outbound_events)
        assert 1000 < most_queued <= 4096, most_queued
        assert await client.until_closed(timeout=30) == 1008
        assert client.close_reason == "the client is not reading its events"
        errors = [e for e in client.events if e["type"] == "error"]
        assert errors and all(e["error"]["code"] == "item_not_found" for e in errors)
        client.close()
        # (the server keeps reading while it closes: the flood behind the close frame is dropped)
        await assert_clean(app, timeout=5)
        assert engine.conversations[0].closed


async def test_a_client_that_stops_reading_mid_response_is_closed_after_the_send_timeout():
    """The client reads nothing while a long reply streams: buffers fill, the response pauses
    (bounded queue), and once one send makes no progress for ``send_timeout_s`` the session ends
    with 1008 and the engine's response is cancelled."""
    engine = StatsEngine(Script(text=("word ",) * 4000, audio_chunks=4000))
    async with served(engine, send_timeout_s=0.5) as (url, app):
        client = await RawClient.open(url, rcvbuf=1 << 16)
        await client.until("session.created")
        await client.send(user_text("talk"))
        await client.send({"type": "response.create"})
        async with asyncio.timeout(20):
            while not engine.conversations[0].closed:  # the session gave up on the client
                queued = (await app.state.realtime.hygiene()).outbound_events
                assert queued <= 4096
                await asyncio.sleep(0.05)
        response = engine.conversations[0].responses[0]
        assert response.cancel_reason == "client_disconnected"
        assert len(response.yielded) < 8000, "the engine was paused while the client did not read"
        assert await client.until_closed(timeout=30) == 1008
        client.close()
        await assert_clean(app, timeout=30)


# --- a WebRTC peer that vanishes ----------------------------------------------------------------

PEER_PROCESS = """
import asyncio, json, sys
import httpx2
from aiortc import RTCConfiguration, RTCPeerConnection, RTCSessionDescription
from realtime.transports.webrtc import IceHostAddress, announce_host_addresses

async def main(base_url, speak):
    pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
    pc.addTransceiver("audio", direction="sendrecv")
    channel = pc.createDataChannel("oai-events")
    seen = asyncio.Queue()
    channel.on("message", lambda m: seen.put_nowait(json.loads(m)["type"]))
    await announce_host_addresses(pc, [IceHostAddress.parse("127.0.0.1")])
    await pc.setLocalDescription(await pc.createOffer())
    async with httpx2.AsyncClient() as http:
        answer = await http.post(base_url + "/v1/realtime/calls", content=pc.localDescription.sdp,
                                 headers={"content-type": "application/sdp"})
    await pc.setRemoteDescription(RTCSessionDescription(sdp=answer.text, type="answer"))
    while await seen.get() != "session.created":
        pass
    if not speak:
        print("READY", flush=True)
        await asyncio.sleep(3600)
    content = [{"type": "input_text", "text": "hi"}]
    channel.send(json.dumps({"type": "conversation.item.create",
                             "item": {"type": "message", "role": "user", "content": content}}))
    channel.send(json.dumps({"type": "response.create"}))
    while await seen.get() != "output_audio_buffer.started":
        pass
    print("READY", flush=True)
    await asyncio.sleep(3600)

asyncio.run(main(sys.argv[1], sys.argv[2] == "speak"))
"""


@pytest.mark.timeout(60)
@pytest.mark.parametrize("speaking", [True, False], ids=["mid-response", "idle"])
async def test_a_webrtc_peer_that_vanishes_is_torn_down(monkeypatch, caplog, speaking):
    """The client process is killed (no DTLS close, no SCTP abort, no ICE goodbye), while its
    reply plays or while idle: ICE consent checks fail (RFC 7675; every 5 s, 6 misses: ~30 s by
    default, shortened here), and the call is torn down: peer connection closed, response
    cancelled, nothing left, and no background task of the teardown fails unobserved."""
    import aioice.ice

    monkeypatch.setattr(aioice.ice, "CONSENT_INTERVAL", 0.2)
    engine = StatsEngine(Script(text=("word ",) * 2000, audio_chunks=2000, delay_s=0.02))
    # media in the server's process: the shortened consent interval is patched here, not in media workers
    async with served(engine, webrtc=True, ice_host_addresses=("127.0.0.1",), media_workers=0) as (_, app):
        peer = await asyncio.create_subprocess_exec(
            sys.executable,
            "-c",
            PEER_PROCESS,
            app.state.base_url,
            "speak" if speaking else "idle",
            cwd=REPO,
            stdout=subprocess.PIPE,
        )
        try:
            assert await asyncio.wait_for(peer.stdout.readline(), 30) == b"READY\n"
            live = await app.state.realtime.hygiene()
            assert (live.sessions, live.webrtc_peers, live.engine.responses) == (1, 1, int(speaking))
            assert live.session_tasks >= 4  # the call, its runner's loops (+ the pump), the microphone
        finally:
            peer.kill()
            await peer.wait()
        calls = app.state.webrtc
        await assert_clean(app, timeout=20)
        assert calls.live_calls == 0 and calls.calls_ended == 1
        assert engine.conversations[0].closed
        if speaking:
            response = engine.conversations[0].responses[0]
            assert response.cancel_reason is not None and len(response.yielded) < 4000
        gc.collect()  # a failed task nobody awaited is reported when it is collected
        assert not [r for r in caplog.records if r.name == "asyncio" and r.levelno >= logging.ERROR], caplog.text


# --- SIGTERM ------------------------------------------------------------------------------------


@pytest.mark.timeout(120)
def test_sigterm_ends_sessions_with_a_close_code_and_exits_0(family_model_dir, tmp_path):
    """``omni-realtime serve --model DIR`` (a tiny checkpoint of each family) with two sessions, one in the middle of
    a reply: SIGTERM closes both with a close code (1012 from uvicorn, or 1001 from our lifespan), the process exits
    0, and its log has no traceback."""
    # a seeded reply: an unseeded one of a tiny random model may end before it has any audio
    server = ServeProcess(family_model_dir, tmp_path, "--seed", "1")
    try:

        async def sessions() -> list[int]:
            async with connect(server.ws_url) as busy, connect(server.ws_url) as idle:
                await busy.send(user_text("Tell me a story."))
                await busy.send({"type": "response.create"})
                await busy.until("response.output_audio.delta", timeout=60)
                server.process.send_signal(signal.SIGTERM)
                return [await closed_with(client) for client in (busy, idle)]

        codes = asyncio.run(sessions())
    finally:
        log = server.stop()
    assert all(code in (1001, 1012) for code in codes), codes
    assert server.process.returncode == 0, log
    assert "Traceback" not in log and "Application shutdown complete" in log
    assert "session" in log and "ended" in log


async def closed_with(client) -> int:
    """Read until the server closes; its close code."""
    with pytest.raises(websockets.ConnectionClosed) as info:
        while True:
            await client.next(timeout=30)
    assert info.value.rcvd is not None, "closed without a close frame"
    return info.value.rcvd.code
