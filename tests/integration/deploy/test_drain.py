"""The drain of one server (realtime/deploy/drain.py), without Ray: new sessions are refused with
``server_draining`` and 1013, a running one goes on for the grace period, then is closed with 1001."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time

import pytest
import websockets

from realtime.config import ServerConfig
from realtime.deploy.drain import Drain, DrainCode, draining_refusal
from realtime.engines.placement import EngineSlots
from realtime.server.app import create_app, serve_in_background
from realtime.server.limits import LimitCode
from tests.fakes import FakeEngine
from tests.helpers.server import SilentVad, connect

GRACE_S = 1.0


@contextlib.asynccontextmanager
async def draining_server(grace_s: float = GRACE_S):
    config = ServerConfig(port=0, webrtc=False, max_sessions=4)
    app = create_app(config, engine=FakeEngine(), vad_factory=SilentVad)
    server = app.state.realtime
    async with serve_in_background(app, config) as url:
        yield url.replace("http://", "ws://") + "/v1/realtime", Drain(server, grace_s)


def test_closed_admission_refuses_every_new_session_and_keeps_live_ones():
    slots = EngineSlots([object()], max_sessions=2, capacity=2)
    live = slots.try_acquire()
    slots.try_acquire()
    assert slots.try_acquire() is None and slots.refusal().code == LimitCode.SESSION_LIMIT_REACHED
    slots.close_admission(draining_refusal())
    assert slots.admission_closed and slots.active == 2
    live.release()
    assert slots.try_acquire() is None and slots.active == 1
    assert slots.refusal().code == DrainCode.SERVER_DRAINING
    with pytest.raises(ValueError, match="grace"):
        Drain(object(), -1.0)


@pytest.mark.timeout(60)
async def test_a_draining_server_refuses_new_sessions_and_closes_running_ones_after_the_grace_period():
    async with draining_server() as (url, drain), connect(url) as running:
        started = time.monotonic()
        task = drain.start()
        assert drain.start() is task  # once
        async with websockets.connect(url) as refused:
            event = json.loads(await refused.recv())
            with pytest.raises(websockets.ConnectionClosed):
                await refused.recv()
        assert event["type"] == "error" and event["error"]["code"] == "server_draining", event
        assert refused.close_code == 1013
        # the running session still works during the grace period
        await running.send({"type": "session.update", "session": {"type": "realtime", "instructions": "Be brief."}})
        await running.until("session.updated")
        await asyncio.wait_for(task, GRACE_S + 10)
        with pytest.raises(websockets.ConnectionClosed):
            await running.ws.recv()
        assert time.monotonic() - started >= GRACE_S
        assert (running.ws.close_code, running.ws.close_reason) == (1001, "server shutting down")


@pytest.mark.timeout(60)
async def test_a_drain_without_sessions_ends_at_once():
    async with draining_server(grace_s=30.0) as (_, drain):
        started = time.monotonic()
        await asyncio.wait_for(drain.wait(), 10)
        assert time.monotonic() - started < 5
