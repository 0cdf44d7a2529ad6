"""Resource hygiene: what the server holds (``RealtimeServer.hygiene``: session tasks, event-loop
tasks, WebRTC peer connections, engine conversations/responses/KV positions, process memory) while
sessions live and after they end, as tests see it and as ``/metrics`` shows it (the server harness
and :func:`~tests.helpers.server.assert_clean` are in ``tests/helpers/server.py``)."""

from __future__ import annotations

import asyncio
import re

import httpx2
import pytest

from pipeline.response_events import EngineStats
from realtime.errors import RealtimeError
from realtime.observe.metrics import Hygiene, ServerMetrics
from realtime.runner import live_session_tasks, session_task_name
from realtime.server.limits import SessionSlots
from realtime.transports.webrtc import WebRTCCalls
from tests.fakes import FakeEngine, Script
from tests.helpers.server import StatsEngine, assert_clean, connect, served, user_text


def sample(metrics: str, name: str, **labels: str) -> float | None:
    """One sample of a Prometheus text exposition (``None`` when absent)."""
    label_text = ",".join(f'{k}="{v}"' for k, v in labels.items())
    pattern = re.escape(name + (f"{{{label_text}}}" if labels else "")) + r" ([0-9.e+-]+)"
    found = re.search(r"^" + pattern + r"$", metrics, re.MULTILINE)
    return float(found.group(1)) if found else None


# --- the hygiene snapshot and its gauges ----------------------------------------------------------


async def scrape(app) -> str:
    async with httpx2.AsyncClient(base_url=app.state.base_url) as http:
        return (await http.get("/metrics")).text


async def test_a_live_session_is_counted_and_everything_returns_to_idle():
    # (not a manual script: a cancelled manual FakeResponse leaves a Semaphore.acquire task behind)
    engine = StatsEngine(Script(text=("x",) * 200, delay_s=0.05))
    async with served(engine) as (url, app):
        idle = app.state.idle
        assert (idle.sessions, idle.session_tasks, idle.webrtc_peers) == (0, 0, 0)
        assert idle.engine == EngineStats(0, 0, 0, 0, 0, 0)
        assert idle.memory is not None and idle.memory.rss_bytes > 10 << 20 and idle.memory.open_fds > 3
        async with connect(url) as client:
            await client.send(
                {
                    "type": "session.update",
                    "session": {"type": "realtime", "audio": {"input": {"turn_detection": None}}},
                }
            )
            await client.send(user_text("hi"))
            await client.send({"type": "input_audio_buffer.append", "audio": "AAAAAA=="})
            await client.send({"type": "response.create"})
            await client.until("response.created")
            await asyncio.sleep(0.05)  # the worker starts the response
            live = await app.state.realtime.hygiene()
            assert live.sessions == 1
            # supervisor, reader, writer, worker and the response's pump
            assert live.session_tasks == 5 == live_session_tasks()
            assert live.engine.conversations == live.engine.responses == live.engine.open_audio_messages == 1
            assert live.leaks().keys() >= {"session_tasks", "engine_conversations", "engine_responses"}
            text = await scrape(app)
            assert sample(text, "omni_realtime_session_tasks") == 5
            assert sample(text, "omni_realtime_engine_conversations") == 1
            assert sample(text, "omni_realtime_engine_responses") == 1
            assert sample(text, "omni_realtime_engine_kv_positions", stage="thinker") == live.engine.cached_tokens
            assert sample(text, "omni_realtime_webrtc_peers") == 0
        after = await assert_clean(app)
        assert after.leaks() == {}
        text = await scrape(app)
        for name in (
            "omni_realtime_session_tasks",
            "omni_realtime_engine_conversations",
            "omni_realtime_engine_responses",
            "omni_realtime_engine_open_audio_messages",
        ):
            assert sample(text, name) == 0, name
        assert sample(text, "omni_realtime_engine_kv_positions", stage="talker") == 0
        assert sample(text, "omni_realtime_process_resident_memory_bytes") > 10 << 20
        assert sample(text, "omni_realtime_process_open_fds") > 3
        assert 0 < sample(text, "omni_realtime_event_loop_tasks") <= idle.loop_tasks + 1  # + the scrape's own


async def test_a_task_that_outlives_its_session_is_counted():
    """The counter finds stray tasks by name, not through the objects that own them."""
    stray = asyncio.create_task(asyncio.sleep(10), name=session_task_name("sess_gone", "pump resp_1"))
    other = asyncio.create_task(asyncio.sleep(10), name="not a session task")
    try:
        await asyncio.sleep(0)
        assert live_session_tasks() == 1
    finally:
        stray.cancel()
        other.cancel()
        await asyncio.gather(stray, other, return_exceptions=True)
    assert live_session_tasks() == 0


async def test_engines_without_stats_leave_the_engine_gauges_out_of_the_snapshot():
    async with served(FakeEngine()) as (_, app):
        hygiene = await app.state.realtime.hygiene()
        assert hygiene.engine is None and hygiene.leaks() == {}
        assert sample(await scrape(app), "omni_realtime_engine_conversations") == 0


def test_hygiene_gauges_keep_their_last_engine_value_without_a_new_one():
    metrics = ServerMetrics()
    engine = EngineStats(2, 1, 0, 30, 10, 4)
    metrics.observe_hygiene(Hygiene(2, 9, 1, 40, 7, engine, None))
    metrics.observe_hygiene(Hygiene(0, 0, 0, 30, 0, None, None))
    text = metrics.render().decode()
    assert sample(text, "omni_realtime_session_tasks") == 0
    assert sample(text, "omni_realtime_engine_conversations") == 2
    assert sample(text, "omni_realtime_engine_kv_positions", stage="talker") == 10
    assert sample(text, "omni_realtime_engine_pending_commands") == 4


async def test_a_refused_offer_leaves_no_peer_connection_and_frees_its_slot():
    slots = SessionSlots(2)
    calls = WebRTCCalls(FakeEngine(), ice_host_addresses=("127.0.0.1",), slots=slots)
    try:
        for offer in ("not sdp", "v=0\r\nm=audio 9 UDP/TLS/RTP/SAVPF 111\r\n"):
            with pytest.raises(RealtimeError):
                await calls.create_call(offer)
        assert calls.open_peers == 0 and calls.live_calls == 0 and slots.active == 0
    finally:
        await calls.close()
