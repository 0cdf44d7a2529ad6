"""The bench's WebRTC users spread over two client worker processes (``run_sweep(client_processes=2)``) against a
real server (aiortc media path, silero VAD) with a fast fake engine: both users' turns come back, merged in user
order, with each worker's loop lag and CPU, and the server's loop-lag and input-delay metrics filled."""

from __future__ import annotations

import asyncio

import pytest

from realtime.bench.client import ClientOptions, ClientTransport
from realtime.bench.speech import load_speech_folder
from realtime.bench.sweep import SweepPlan, run_sweep
from realtime.config import ServerConfig
from realtime.server.app import create_app, serve_in_background
from tests.fakes import FakeEngine, Script
from tests.helpers.paths import TESTS

pytestmark = [pytest.mark.timeout(120), pytest.mark.slow]


def test_two_webrtc_users_in_two_client_processes():
    speeches = load_speech_folder(TESTS / "fixtures" / "speech", max_seconds=3.0)[:2]
    config = ServerConfig(
        host="127.0.0.1", port=0, max_sessions=3, webrtc=True, ice_host_addresses=("127.0.0.1",), log_level="warning"
    )
    app = create_app(config, engine=FakeEngine(Script(audio_chunks=25, chunk_ms=40, delay_s=0.01)))
    plan = SweepPlan((2,), turns=1, min_samples=0, ramp_s=0.2, warmup_turns=0)

    async def run():
        async with serve_in_background(app, config) as url:
            levels = await run_sweep(url, speeches, plan, ClientOptions(ClientTransport.WEBRTC), client_processes=2)
            metrics = app.state.realtime.metrics
            return levels, metrics.loop_lag.collect(), metrics.webrtc_input_delay.collect()

    (level,), lag, delay = asyncio.run(run())
    assert [(t.user, t.status) for t in level.turns] == [(0, "completed"), (1, "completed")]
    assert all(t.voice_to_voice_ms is not None and t.voice_to_voice_ms > 0 for t in level.turns), level.turns
    assert [p["users"] for p in level.client_processes] == [1, 1]
    assert all(p["loop_lag_ms"]["samples"] > 0 and p["cpu_s"] > 0 for p in level.client_processes)
    assert level.errors == []

    def count(families) -> float:
        return next(s.value for f in families for s in f.samples if s.name.endswith("_count"))

    assert count(lag) > 0  # the server's probe ran
    assert count(delay) > 2 * 50  # both calls' microphones: 50 frames a second each, for seconds


def test_the_warm_up_puts_one_user_on_each_engine_before_the_first_level():
    """With several engines (``--data-parallel-size``) one warm-up user would warm one engine only, and the first
    level's replies on the others would carry their cold first replies: the warm-up runs ``warmup_users`` users."""
    speeches = load_speech_folder(TESTS / "fixtures" / "speech", max_seconds=3.0)[:2]
    config = ServerConfig(host="127.0.0.1", port=0, max_sessions=4, log_level="warning")
    app = create_app(config, engine=FakeEngine(Script(audio_chunks=5, chunk_ms=40, delay_s=0.01)))
    plan = SweepPlan((1,), turns=1, min_samples=0, ramp_s=0.2, warmup_turns=1, warmup_users=3)

    def started() -> float:
        families = app.state.realtime.metrics.sessions_total.collect()
        return sum(s.value for f in families for s in f.samples if s.name.endswith("_total"))

    async def run():
        async with serve_in_background(app, config) as url:
            levels = await run_sweep(url, speeches, plan, ClientOptions(ClientTransport.WS), client_processes=1)
            return levels, started()

    (level,), sessions = asyncio.run(run())
    assert [t.status for t in level.turns] == ["completed"]
    assert sessions == 3 + 1  # three warm-up users, then the level's one


def test_warmup_users_must_be_positive():
    with pytest.raises(ValueError, match="warmup_users"):
        SweepPlan((1,), warmup_users=0)
