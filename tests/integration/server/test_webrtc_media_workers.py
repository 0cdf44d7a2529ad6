"""WebRTC calls whose media runs in worker processes (realtime.transports.media_workers), against an aiortc client.

Loopback only, as tests/integration/server/test_webrtc.py (which also runs its main call tests over two workers).
Each test starts its own workers (~1–2 s).
"""

from __future__ import annotations

import asyncio
import os
import signal

import pytest

from realtime.errors import RealtimeError
from realtime.runner import SessionEnd
from realtime.transports.webrtc import WebRTCCalls
from realtime.transports.webrtc import transport as calls_module
from realtime.transports.webrtc.worker_media import WorkerCalls
from tests.fakes import FakeEngine, Script
from tests.helpers.webrtc_peer import ClientPeer

pytestmark = [pytest.mark.timeout(60), pytest.mark.slow]


async def wait_until(predicate, timeout: float = 5.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not predicate():
        if loop.time() > deadline:
            raise AssertionError("condition not met in time")
        await asyncio.sleep(0.02)


def _candidates(sdp: str) -> list[list[str]]:
    return [line.split()[4:8] for line in sdp.splitlines() if line.startswith("a=candidate:")]


async def _worker_calls(engine, workers: int, **kwargs) -> WorkerCalls:
    calls = WorkerCalls(WebRTCCalls(engine, **({"ice_host_addresses": ("127.0.0.1",)} | kwargs)), workers)
    await calls.start()
    return calls


async def test_a_killed_worker_ends_its_calls_and_new_calls_still_connect():
    engine = FakeEngine()
    calls = await _worker_calls(engine, 2, max_calls=2)
    peers = [ClientPeer() for _ in range(3)]
    try:
        for peer in peers[:2]:
            await peer.call(calls)
            await peer.wait_for("session.created")
        first, second = calls.calls()
        assert first.worker is not second.worker  # spread over the two workers
        engine.script(Script(audio_chunks=100, chunk_ms=40, delay_s=0.02))
        peers[0].say("weather_today")
        await peers[0].wait_for("output_audio_buffer.started")
        victim = first.worker
        os.kill(victim.process.pid, signal.SIGKILL)  # mid-reply
        await wait_until(lambda: calls.live_calls == 1)  # its call ended and freed its slot
        assert first.runner.end is SessionEnd.FAILED and engine.conversations[0].closed
        assert calls.open_peers == 1 and calls.pool.deaths == 1
        (survivor,) = calls.calls()
        assert survivor is second
        await peers[2].call(calls)  # placed on the surviving worker (or the restarted one)
        await peers[2].wait_for("session.created")
        await wait_until(lambda: len([w for w in calls.pool.workers.values() if w.live]) == 2, timeout=20)
        restarted = calls.pool.workers[victim.index]
        assert restarted is not victim and restarted.process.pid != victim.process.pid
        peers[2].say("short_joke")  # the other calls carry on
        await peers[2].wait_for("response.done")
    finally:
        for peer in peers:
            await peer.close()
        await calls.close()
    assert calls.live_calls == 0 and calls.open_peers == 0


async def test_workers_announce_the_configured_host_and_bind_another():
    client = ClientPeer()
    calls = await _worker_calls(FakeEngine(), 1, ice_host_addresses=("127.0.0.1@0.0.0.0",))
    try:
        answer = await client.call(calls)
        assert {c[0] for c in _candidates(answer)} == {"127.0.0.1"}
        assert "a=end-of-candidates" in answer
        await client.wait_for("session.created")  # connected through the worker's wildcard-bound socket
    finally:
        await client.close()
        await calls.close()


async def test_bad_offers_are_refused_by_the_worker_and_free_the_slot():
    calls = await _worker_calls(FakeEngine(), 1, max_calls=1)
    client = ClientPeer()
    try:
        with pytest.raises(RealtimeError) as exc:
            await calls.create_call("v=0\r\nm=audio 9 UDP/TLS/RTP/SAVPF 111\r\n")
        assert exc.value.param == "sdp"
        assert calls.live_calls == 0 and calls.open_peers == 0
        await client.call(calls)  # the slot was released
        await client.wait_for("session.created")
    finally:
        await client.close()
        await calls.close()


async def test_a_session_too_far_behind_its_microphone_ends_with_an_error(monkeypatch):
    """The incoming queue is bounded: audio is never dropped silently, the call ends with an error instead."""
    monkeypatch.setattr(calls_module, "INCOMING_LIMIT", 5)
    engine = FakeEngine()
    calls = await _worker_calls(engine, 1)
    client = ClientPeer()
    try:
        await client.call(calls)
        await client.wait_for("session.created")
        (call,) = calls.calls()
        for _ in range(10):  # as if the session stalled while the microphone kept coming
            call.transport.push(b"\x00" * 960)
        _, error = await client.wait_for("error")
        assert error["error"]["code"] == "server_error" and "fell behind" in error["error"]["message"]
        await wait_until(lambda: calls.live_calls == 0)
        assert call.runner.end is SessionEnd.FAILED
    finally:
        await client.close()
        await calls.close()
