"""Data parallel in one server, on the CPU: two tiny-model engines, each in a child process of its own, loaded the way
``serve --data-parallel-size 2`` loads them (``realtime.server.app.load_engines``). Sessions spread over them and keep
their engine; admission refuses the session over capacity (WebSocket: an error event and 1013; calls endpoint: 503
with Retry-After) and ``/metrics`` counts it; one engine killed mid-response ends its sessions with an
``engine_failed`` error and a close while the other engine's sessions complete, new sessions go to the survivor, and
``/healthz`` shows it. A server that loaded its engines itself restarts a killed one, and new sessions go to it.

The two engine processes are started once for the module (a spawn imports torch: seconds); each test serves them
from an app of its own (the engines stay the module's). The kill test comes last: it leaves one engine dead."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
from collections.abc import AsyncIterator

import httpx2
import pytest
import websockets
from prometheus_client.parser import text_string_to_metric_families

from realtime.config import ServerConfig
from realtime.server.app import create_app, load_engines, serve_in_background
from tests.helpers.server import SilentVad, assert_clean

pytestmark = pytest.mark.slow

PACKAGED = os.path.join(os.path.dirname(__file__), "..", "..", "..", "pipeline", "stage_configs", "qwen2_5_omni.yaml")


FORCED_END = "incomplete"
"""How a reply of forced length ends (max_output_tokens reached): the whole reply was made."""


@pytest.fixture(scope="module")
def stages(tmp_path_factory):
    """The CPU stage config of these tests: replies forced to 6 text and 80 codec tokens (greedy)."""
    path = tmp_path_factory.mktemp("dp") / "stages.yaml"
    lm = "device: cpu, dtype: float32, sampling: {do_sample: false}"
    path.write_text(
        f"extends: {os.path.abspath(PACKAGED)}\n"
        "stages:\n"
        f"  thinker: {{{lm}, min_tokens: 6, max_tokens: 6}}\n"
        f"  talker: {{{lm}, min_tokens: 80, max_tokens: 80}}\n"
        "  token2wav: {device: cpu}\n"
    )
    return path


@pytest.fixture(scope="module")
def two_engines(tiny_model_dir, stages):
    """Two engines on the CPU, each in its own process."""
    config = ServerConfig(model=str(tiny_model_dir), stage_config=stages, data_parallel_size=2, seed=1234)
    engines = load_engines(config)
    assert [engine.uses_process for engine in engines] == [True, True]
    assert len({engine._backend.pid for engine in engines}) == 2
    yield engines
    for engine in engines:
        engine.close()


@contextlib.asynccontextmanager
async def serving(engines, **config) -> AsyncIterator[tuple[str, httpx2.AsyncClient, object]]:
    """A server over ``engines`` on a free loopback port: (its ws:// URL, an HTTP client on it, the app)."""
    cfg = ServerConfig(port=0, **({"webrtc": False} | config))
    app = create_app(cfg, engines=engines, vad_factory=SilentVad)
    async with serve_in_background(app, cfg) as url, httpx2.AsyncClient(base_url=url) as http:
        app.state.idle = await app.state.realtime.hygiene()
        yield url.replace("http://", "ws://") + "/v1/realtime", http, app


def sample(text: str, name: str, **labels: str) -> float:
    """The one sample ``name`` with exactly ``labels`` in a Prometheus exposition; fails when there is none."""
    found = [
        s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == name and s.labels == labels
    ]
    assert len(found) == 1, f"{name}{labels}: {found}"
    return found[0]


async def recv(ws, timeout: float = 60.0) -> dict:
    return json.loads(await asyncio.wait_for(ws.recv(), timeout))


async def until(ws, event_type: str, seen: list | None = None) -> dict:
    while True:
        event = await recv(ws)
        if seen is not None:
            seen.append(event)
        if event["type"] == event_type:
            return event


async def ask(ws, text: str = "Hello there.") -> None:
    item = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}
    await ws.send(json.dumps({"type": "conversation.item.create", "item": item}))
    await ws.send(json.dumps({"type": "response.create"}))


async def test_sessions_spread_over_two_engines_and_each_completes(two_engines):
    async with serving(two_engines) as (url, http, app):
        health = (await http.get("/healthz")).json()
        assert health["ok"] and [e["state"] for e in health["engines"]] == ["serving", "serving"]
        async with websockets.connect(url) as a, websockets.connect(url) as b:
            await until(a, "session.created")
            await until(b, "session.created")
            health = (await http.get("/healthz")).json()
            assert [e["sessions"] for e in health["engines"]] == [1, 1]
            text = (await http.get("/metrics")).text
            assert [sample(text, "omni_realtime_engine_sessions", engine=str(i)) for i in (0, 1)] == [1, 1]
            assert sample(text, "omni_realtime_engine_up", engine="0", device="cpu") == 1
            await ask(a)
            await ask(b)
            done = [await until(a, "response.done"), await until(b, "response.done")]
            assert [d["response"]["status"] for d in done] == [FORCED_END, FORCED_END]
            conversations = [(await engine.stats()).conversations for engine in two_engines]
            assert conversations == [1, 1], "each session's conversation lives in its own engine"
        await assert_clean(app, timeout=20)


async def test_the_session_over_capacity_is_refused_and_counted(two_engines):
    config = {"max_sessions_per_engine": 1, "webrtc": True, "ice_host_addresses": ("127.0.0.1",)}
    async with serving(two_engines, **config) as (url, http, app):
        async with websockets.connect(url) as a, websockets.connect(url) as b:
            await until(a, "session.created")
            await until(b, "session.created")
            async with websockets.connect(url) as third:
                error = await recv(third)
                assert error["type"] == "error" and error["error"]["code"] == "engine_capacity_reached"
                assert "try again later" in error["error"]["message"]
                with pytest.raises(websockets.ConnectionClosed) as closed:
                    await recv(third)
                assert closed.value.rcvd.code == 1013
            call = await http.post("/v1/realtime/calls", content="v=0\r\n", headers={"content-type": "application/sdp"})
            assert call.status_code == 503 and call.headers["retry-after"].isdigit()
            assert call.json()["error"]["code"] == "engine_capacity_reached"
            text = (await http.get("/metrics")).text
            assert sample(text, "omni_realtime_sessions_refused_total", reason="engine_capacity_reached") == 2
            assert sample(text, "omni_realtime_engine_session_capacity", engine="1") == 1
        async with asyncio.timeout(10):  # the server frees their slots once it sees them leave
            while (await http.get("/healthz")).json()["sessions"]:
                await asyncio.sleep(0.02)
        async with websockets.connect(url) as again:  # room again
            await until(again, "session.created")


async def test_a_killed_engine_ends_its_sessions_while_the_other_serves_on(two_engines):
    async with serving(two_engines) as (url, http, app):
        async with websockets.connect(url) as victim, websockets.connect(url) as other:
            await until(victim, "session.created")
            await until(other, "session.created")
            assert [e["sessions"] for e in (await http.get("/healthz")).json()["engines"]] == [1, 1]
            await ask(victim)
            await ask(other)
            seen: list[dict] = []
            await until(victim, "response.created", seen)
            os.kill(two_engines[0]._backend.pid, signal.SIGKILL)
            with pytest.raises(websockets.ConnectionClosed) as closed:
                while True:
                    seen.append(await recv(victim))
            assert closed.value.rcvd.code == 1011
            assert seen[-1]["type"] == "error" and seen[-1]["error"]["code"] == "engine_failed", seen[-3:]
            ends = [e["response"]["status"] for e in seen if e["type"] == "response.done"]
            assert ends in ([], ["failed"]), "the victim's reply did not finish"
            done = await until(other, "response.done")
            assert done["response"]["status"] == FORCED_END

            health = await http.get("/healthz")
            assert health.status_code == 200 and health.json()["ok"], "one engine still serves"
            engines = health.json()["engines"]
            assert [(e["state"], e["sessions"]) for e in engines] == [("failed", 0), ("serving", 1)]
            async with websockets.connect(url) as newcomer:  # placed on the survivor
                await until(newcomer, "session.created")
                assert [e["sessions"] for e in (await http.get("/healthz")).json()["engines"]] == [0, 2]
                await ask(newcomer)
                assert (await until(newcomer, "response.done"))["response"]["status"] == FORCED_END
            text = (await http.get("/metrics")).text
            assert sample(text, "omni_realtime_engine_up", engine="0", device="cpu") == 0
            assert sample(text, "omni_realtime_engine_failures_total", engine="0") == 1
            assert sample(text, "omni_realtime_errors_total", code="engine_failed") == 1


async def test_a_server_restarts_a_killed_engine_it_loaded(tiny_model_dir, stages):
    config = ServerConfig(
        port=0, webrtc=False, model=str(tiny_model_dir), stage_config=stages, data_parallel_size=2, seed=1234
    )
    app = create_app(config, vad_factory=SilentVad)  # no engines passed: the server loads and owns them
    async with serve_in_background(app, config) as base, httpx2.AsyncClient(base_url=base) as http:
        url = base.replace("http://", "ws://") + "/v1/realtime"
        pool = app.state.realtime.pool
        killed = pool.engines[0]
        async with websockets.connect(url) as victim, websockets.connect(url) as other:
            await until(victim, "session.created")
            await until(other, "session.created")
            os.kill(killed._backend.pid, signal.SIGKILL)
            with pytest.raises(websockets.ConnectionClosed) as closed:
                while True:
                    await recv(victim)
            assert closed.value.rcvd.code == 1011
            async with asyncio.timeout(120):  # a 1 s delay, then a new engine process loads
                while (await http.get("/healthz")).json()["engines"][0]["state"] != "serving":
                    await asyncio.sleep(0.1)
            assert pool.engines[0] is not killed and not pool.engines[0].closed
            async with websockets.connect(url) as newcomer:  # the restarted engine has the most room
                await until(newcomer, "session.created")
                assert [e["sessions"] for e in (await http.get("/healthz")).json()["engines"]] == [1, 1]
                await ask(newcomer)
                assert (await until(newcomer, "response.done"))["response"]["status"] == FORCED_END
            await ask(other)  # the other engine served on throughout
            assert (await until(other, "response.done"))["response"]["status"] == FORCED_END
        text = (await http.get("/metrics")).text
        assert sample(text, "omni_realtime_engine_up", engine="0", device="cpu") == 1
        assert sample(text, "omni_realtime_engine_failures_total", engine="0") == 1
        assert sample(text, "omni_realtime_engine_restarts_total", engine="0") == 1
    assert killed.closed and pool.engines[0].closed  # the server closed what it loaded
