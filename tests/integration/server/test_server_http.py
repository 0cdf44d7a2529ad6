"""The HTTP side of the server on loopback: /healthz, /metrics (sessions, responses, TTFA, errors),
POST /v1/realtime/calls delegation, the static web demo, the lifespan that owns an engine, and
``omni-realtime serve`` itself."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import os
import re
import signal
import subprocess
import sys
from collections.abc import AsyncIterator

import httpx2
import pytest
import websockets
from prometheus_client.metrics import MetricWrapperBase
from prometheus_client.parser import text_string_to_metric_families

from realtime.cli.main import build_parser, server_config
from realtime.config import ServerConfig
from realtime.errors import LimitExceeded
from realtime.observe.first_audio import FirstAudioTrace, Hop
from realtime.observe.metrics import EngineWorkCollector, ServerMetrics
from realtime.protocol.names import Dialect
from realtime.server.app import create_app, serve_in_background
from tests.fakes import FakeEngine
from tests.helpers.paths import REPO
from tests.helpers.server import StatsEngine

KEY = "http-key"


class SilentVad:
    frame_samples = 512

    def __call__(self, frame) -> float:
        return 0.0

    def reset(self) -> None:
        pass


class FakeCalls:
    """A WebRTC endpoint that answers every offer with a fixed SDP (or raises ``fail``)."""

    def __init__(self, fail: Exception | None = None) -> None:
        self.offers: list[tuple[str, Dialect, dict | None]] = []
        self.closed = False
        self.fail = fail
        self.live_calls = 0

    async def create_call(self, offer_sdp: str, *, dialect: Dialect, session_overrides: dict | None) -> str:
        self.offers.append((offer_sdp, dialect, session_overrides))
        if self.fail is not None:
            raise self.fail
        return "v=0\r\ns=answer\r\n"

    async def start(self) -> None:
        pass

    async def close(self) -> None:
        self.closed = True


@contextlib.asynccontextmanager
async def served(engine=None, *, webrtc=None, **config) -> AsyncIterator[tuple[httpx2.AsyncClient, object]]:
    cfg = ServerConfig(port=0, **config)
    app = create_app(cfg, engine=engine, vad_factory=SilentVad, webrtc_factory=(lambda ctx: webrtc) if webrtc else None)
    async with serve_in_background(app, cfg) as url, httpx2.AsyncClient(base_url=url) as http:
        yield http, app


def ws_url(http: httpx2.AsyncClient) -> str:
    return str(http.base_url).rstrip("/").replace("http://", "ws://") + "/v1/realtime"


def sample(metrics: str, name: str, **labels: str) -> float:
    """The value of one Prometheus sample in a text exposition (0 when absent)."""
    label_text = ",".join(f'{k}="{v}"' for k, v in labels.items())
    pattern = re.escape(name + (f"{{{label_text}}}" if labels else "")) + r" ([0-9.e+-]+)"
    found = re.search(r"^" + pattern + r"$", metrics, re.MULTILINE)
    return float(found.group(1)) if found else 0.0


async def until(ws, event_type: str) -> dict:
    async with asyncio.timeout(10):
        while True:
            event = json.loads(await ws.recv())
            if event["type"] == event_type:
                return event


# --- plain HTTP on the WebSocket endpoint ---------------------------------------------------------


@pytest.mark.parametrize("web_demo", [True, False])
async def test_plain_http_on_the_websocket_endpoint_says_how_to_connect(tmp_path, web_demo):
    """Not a bare 404 (with or without the web demo mounted at /): GET answers 426 Upgrade Required, other
    methods 405, each with a JSON error naming the ws:// URL and the WebRTC endpoint."""
    (tmp_path / "index.html").write_text("<html></html>" if web_demo else "")
    async with served(FakeEngine(), web_demo_dir=tmp_path if web_demo else tmp_path / "none") as (http, _):
        ws = ws_url(http)
        got = await http.get("/v1/realtime", params={"model": "gpt-realtime"})
        assert got.status_code == 426
        assert got.headers["upgrade"] == "websocket"
        error = got.json()["error"]
        assert (error["type"], error["code"]) == ("invalid_request_error", "websocket_required")
        assert "over WebSocket" in error["message"] and f"connect with {ws}" in error["message"]
        assert "client.realtime.connect()" in error["message"] and "/v1/realtime/calls" in error["message"]
        posted = await http.post("/v1/realtime", content=b"v=0", headers={"content-type": "application/sdp"})
        assert posted.status_code == 405 and posted.headers["allow"] == "GET"
        assert posted.json()["error"]["code"] == "websocket_required"
        assert "POST their SDP offer to /v1/realtime/calls" in posted.json()["error"]["message"]
        async with websockets.connect(ws) as client:  # the WebSocket endpoint itself is unchanged
            await until(client, "session.created")


# --- health and metrics -------------------------------------------------------------------------


async def test_healthz_reports_model_weights_and_sessions():
    async with served(FakeEngine(), webrtc=None) as (http, _):
        body = (await http.get("/healthz")).json()
        assert body == {
            "ok": True,
            "model": "fake-omni",
            "random_weights": True,
            "sessions": 0,
            "max_sessions": 16,
            "webrtc": False,
            "calls": 0,
            "engine_responsive": True,
            "engines": [
                {"engine": 0, "device": None, "state": "serving", "responsive": True, "sessions": 0, "max_sessions": 16}
            ],
        }
        async with websockets.connect(ws_url(http)) as ws:
            await until(ws, "session.created")
            health = (await http.get("/healthz")).json()
            assert (health["sessions"], health["engines"][0]["sessions"]) == (1, 1)


class SizedEngine(StatsEngine):
    """A fake engine that reports KV pools as an engine resolves them at load."""

    async def stats(self):
        held = await super().stats()
        return dataclasses.replace(
            held, kv_slots=8, talker_kv_slots=8, kv_capacity_tokens=8 * 8192, talker_kv_capacity_tokens=8 * 10256
        )


async def test_healthz_and_metrics_show_the_kv_pools_size():
    async with served(SizedEngine(), webrtc=None) as (http, _):
        engine = (await http.get("/healthz")).json()["engines"][0]
        assert engine["kv"] == {"slots": 8, "talker_slots": 8, "positions_per_slot": 8192}
        metrics = (await http.get("/metrics")).text
        assert sample(metrics, "omni_realtime_engine_kv_slots", stage="thinker") == 8
        assert sample(metrics, "omni_realtime_engine_kv_slots", stage="talker") == 8
        assert sample(metrics, "omni_realtime_engine_kv_capacity_positions", stage="thinker") == 8 * 8192
        assert sample(metrics, "omni_realtime_engine_kv_capacity_positions", stage="talker") == 8 * 10256


class StuckEngine(FakeEngine):
    """An engine stuck inside a step: it never answers a stats request."""

    def __init__(self) -> None:
        super().__init__()
        self.stats_requests = 0

    async def stats(self):
        self.stats_requests += 1
        await asyncio.Event().wait()


async def test_healthz_and_metrics_do_not_wait_on_an_engine_stuck_inside_a_step(caplog):
    engine = StuckEngine()
    async with served(engine, engine_probe_timeout_s=0.2) as (http, _):
        async with asyncio.timeout(10):  # neither route hangs with the engine
            health = await http.get("/healthz")
            metrics = await http.get("/metrics")
        assert health.status_code == 503
        assert health.json()["ok"] is False and health.json()["engine_responsive"] is False
        assert metrics.status_code == 200 and "omni_realtime_sessions" in metrics.text
        assert engine.stats_requests == 2
    assert "stuck inside a step" in caplog.text


async def test_metrics_count_sessions_responses_ttfa_and_errors():
    async with served(FakeEngine()) as (http, _):
        before = await http.get("/metrics")
        assert before.headers["content-type"].startswith("text/plain")
        assert sample(before.text, "omni_realtime_time_to_first_audio_seconds_count") == 0
        async with websockets.connect(ws_url(http)) as ws:
            await until(ws, "session.created")
            live = (await http.get("/metrics")).text
            assert sample(live, "omni_realtime_sessions_active", transport="websocket") == 1
            await ws.send(json.dumps({"type": "response.create"}))  # audio reply
            await until(ws, "response.done")
            await ws.send(json.dumps({"type": "response.cancel"}))
            await until(ws, "error")
            await ws.send("{broken")
            await until(ws, "error")
        async with asyncio.timeout(5):
            while sample((await http.get("/metrics")).text, "omni_realtime_sessions_active", transport="websocket"):
                await asyncio.sleep(0.02)
        text = (await http.get("/metrics")).text
        assert sample(text, "omni_realtime_sessions_total", transport="websocket") == 1
        assert sample(text, "omni_realtime_responses_total", status="completed") == 1
        assert sample(text, "omni_realtime_time_to_first_audio_seconds_count") == 1
        assert 0 < sample(text, "omni_realtime_time_to_first_audio_seconds_sum") < 5
        assert sample(text, "omni_realtime_errors_total", code="response_cancel_not_active") == 1
        assert sample(text, "omni_realtime_errors_total", code="invalid_json") == 1
        for segment in ("requested->received", "received->sent"):  # a response to no spoken turn
            assert sample(text, "omni_realtime_first_audio_path_seconds_count", segment=segment) == 1
        assert sample(text, "omni_realtime_first_audio_path_seconds_count", segment="turn_end->committed") == 0


async def test_error_events_are_logged_with_the_session_and_the_client_event(caplog):
    """What an operator sees at the default level (INFO) when a client's setup fails: one line per error event,
    also for a message the transport's gate refuses before the session sees it."""
    caplog.set_level(logging.INFO, logger="realtime.observe.error_log")
    async with served(FakeEngine()) as (http, _), websockets.connect(ws_url(http)) as ws:
        session_id = (await until(ws, "session.created"))["session"]["id"]
        bad = {"type": "session.update", "event_id": "setup_1", "session": {"prompt": {"id": "p"}}}
        await ws.send(json.dumps(bad))
        error = (await until(ws, "error"))["error"]
        await ws.send(b"\x00binary")
        refused = (await until(ws, "error"))["error"]
    lines = [r.getMessage() for r in caplog.records if r.name == "realtime.observe.error_log"]
    assert lines == [
        f"session {session_id}: error unsupported_value answering session.update (event_id setup_1, "
        f"param session.prompt): {error['message']}",
        f"session {session_id}: error invalid_event answering - (event_id -, param -): {refused['message']}",
    ]


def defined_families(metrics: ServerMetrics) -> set[str]:
    """The names of every metric family a ServerMetrics defines (its collectors' descriptions)."""
    collectors = [v for v in vars(metrics).values() if isinstance(v, (MetricWrapperBase, EngineWorkCollector))]
    assert any(isinstance(c, EngineWorkCollector) for c in collectors)
    return {family.name for collector in collectors for family in collector.describe()}


async def test_a_fresh_server_shows_every_metric_family_with_samples():
    """Before any session, every family of realtime/observe/metrics.py has at least one sample: zero sessions,
    zero responses of each status, zero errors of each known code are samples, not missing series."""
    async with served(StatsEngine()) as (http, app):
        text = (await http.get("/metrics")).text
    scraped = {family.name: family.samples for family in text_string_to_metric_families(text)}
    defined = defined_families(app.state.realtime.metrics)
    assert len(defined) > 20
    assert not [name for name in defined if not scraped.get(name)], text
    for transport in ("websocket", "webrtc"):
        assert f'omni_realtime_sessions_active{{transport="{transport}"}} 0.0' in text
    for status in ("completed", "cancelled", "failed", "incomplete"):
        assert f'omni_realtime_responses_total{{status="{status}"}} 0.0' in text
    for code in ("invalid_value", "unsupported_value", "rate_limit_exceeded"):
        assert f'omni_realtime_errors_total{{code="{code}"}} 0.0' in text
    assert 'omni_realtime_sessions_refused_total{reason="invalid_api_key"} 0.0' in text


def test_metrics_of_two_apps_are_independent():
    first, second = ServerMetrics(), ServerMetrics()
    observer = first.session("websocket")
    observer({"type": "error", "error": {"code": "invalid_json"}})
    assert sample(first.render().decode(), "omni_realtime_errors_total", code="invalid_json") == 1
    assert sample(second.render().decode(), "omni_realtime_errors_total", code="invalid_json") == 0


def test_ttfa_runs_from_response_created_to_the_first_audio_only():
    now = [10.0]
    metrics = ServerMetrics()
    observer = metrics.session("webrtc", clock=lambda: now[0])
    observer({"type": "response.created", "response": {"id": "r1"}})
    now[0] = 10.25
    observer({"type": "output_audio_buffer.started", "response_id": "r1"})  # WebRTC's first audio
    now[0] = 11.0
    observer({"type": "response.output_audio.delta", "response_id": "r1", "delta": ""})  # not the first
    observer({"type": "response.done", "response": {"id": "r1", "status": "completed"}})
    observer({"type": "response.created", "response": {"id": "r2"}})
    observer({"type": "response.done", "response": {"id": "r2", "status": "cancelled"}})  # no audio: no sample
    observer.close()
    observer.close()
    text = metrics.render().decode()
    assert sample(text, "omni_realtime_time_to_first_audio_seconds_count") == 1
    assert sample(text, "omni_realtime_time_to_first_audio_seconds_sum") == 0.25
    assert sample(text, "omni_realtime_responses_total", status="cancelled") == 1
    assert sample(text, "omni_realtime_sessions_active", transport="webrtc") == 0


def test_preemptive_replies_are_counted_by_outcome_and_withdrawn_ones_add_no_hops():
    metrics = ServerMetrics()
    shown, withdrawn, plain = (FirstAudioTrace(rid) for rid in ("r1", "r2", "r3"))
    shown.preemptive = withdrawn.preemptive = withdrawn.withdrawn = True
    for trace, at in ((shown, 1.0), (withdrawn, 2.0), (plain, 3.0)):
        trace.mark(Hop.REQUESTED, at)
        trace.mark(Hop.SENT, at + 0.1)
        metrics.first_audio_path(trace)
    text = metrics.render().decode()
    assert sample(text, "omni_realtime_preemptive_replies_total", outcome="shown") == 1
    assert sample(text, "omni_realtime_preemptive_replies_total", outcome="withdrawn") == 1
    assert sample(text, "omni_realtime_first_audio_path_seconds_count", segment="requested->sent") == 2


# --- WebRTC calls -------------------------------------------------------------------------------


async def test_calls_without_webrtc_answer_501():
    async with served(FakeEngine()) as (http, app):
        response = await http.post("/v1/realtime/calls", content="v=0", headers={"content-type": "application/sdp"})
        assert response.status_code == 501
        error = response.json()["error"]
        assert error["code"] == "webrtc_unavailable" and "/v1/realtime" in error["message"]
        assert app.state.webrtc is None


async def test_calls_are_delegated_to_the_webrtc_endpoint():
    calls = FakeCalls()
    async with served(FakeEngine(), webrtc=calls, api_key=KEY) as (http, app):
        assert app.state.webrtc is calls and (await http.get("/healthz")).json()["webrtc"]
        sdp = {"content-type": "application/sdp"}
        assert (await http.post("/v1/realtime/calls", content="v=0", headers=sdp)).status_code == 401
        auth = sdp | {"authorization": f"Bearer {KEY}"}
        answer = await http.post("/v1/realtime/calls", content="v=0 offer", headers=auth)
        assert answer.status_code == 201
        assert answer.headers["content-type"].startswith("application/sdp") and answer.text == "v=0\r\ns=answer\r\n"
        beta = await http.post("/v1/realtime/calls", content="v=0 beta", headers=auth | {"openai-beta": "realtime=v1"})
        assert beta.status_code == 201
        assert calls.offers == [("v=0 offer", Dialect.GA, None), ("v=0 beta", Dialect.BETA, None)]
        wrong_type = await http.post(
            "/v1/realtime/calls",
            content="{}",
            headers={"content-type": "application/json", "authorization": f"Bearer {KEY}"},
        )
        assert wrong_type.status_code == 415 and wrong_type.json()["error"]["code"] == "unsupported_media_type"
        empty = await http.post("/v1/realtime/calls", content="  ", headers=auth)
        assert empty.status_code == 400 and len(calls.offers) == 2
    assert calls.closed, "shutdown closes the WebRTC endpoint"


@pytest.mark.parametrize("media_workers", [0, 1])
async def test_the_default_webrtc_endpoint_is_the_aiortc_transport(media_workers):
    from realtime.transports.webrtc import WebRTCCalls
    from realtime.transports.webrtc.worker_media import WorkerCalls

    config = ServerConfig(port=0, ice_host_addresses=("127.0.0.1",), max_sessions=3, media_workers=media_workers)
    app = create_app(config, engine=FakeEngine(), vad_factory=SilentVad)
    async with serve_in_background(app, config) as url, httpx2.AsyncClient(base_url=url) as http:
        calls = app.state.webrtc
        if media_workers:  # the calls' media in worker processes, configured as the in-process endpoint
            assert isinstance(calls, WorkerCalls) and calls.pool.size == media_workers
            calls = calls.local
        assert isinstance(calls, WebRTCCalls) and calls.max_calls == 3 and calls.live_calls == 0
        assert [(a.bind, a.announce) for a in calls.ice_host_addresses] == [("127.0.0.1", "127.0.0.1")]
        health = (await http.get("/healthz")).json()
        assert health["webrtc"] is True and health["calls"] == 0
        bad = await http.post("/v1/realtime/calls", content="not sdp", headers={"content-type": "application/sdp"})
        assert bad.status_code == 400 and bad.json()["error"]["param"] == "sdp"


@pytest.mark.parametrize(
    ("failure", "status", "code"),
    [
        (LimitExceeded("too many calls"), 429, "limit_exceeded"),
        (RuntimeError("secret internals"), 500, "server_error"),
    ],
)
async def test_call_setup_failures_map_to_http_errors(failure, status, code):
    async with served(FakeEngine(), webrtc=FakeCalls(fail=failure)) as (http, _):
        response = await http.post("/v1/realtime/calls", content="v=0", headers={"content-type": "application/sdp"})
        assert response.status_code == status
        assert response.json()["error"]["code"] == code and "secret" not in response.text


# --- static web demo ----------------------------------------------------------------------------


async def test_web_demo_is_served_without_path_traversal(tmp_path):
    demo = tmp_path / "demo"
    demo.mkdir()
    (demo / "index.html").write_text("<h1>voice chat</h1>")
    (demo / "app.js").write_text("console.log(1)")
    (tmp_path / "secret.txt").write_text("do not serve")
    async with served(FakeEngine(), web_demo_dir=demo) as (http, _):
        assert (await http.get("/")).text == "<h1>voice chat</h1>"
        assert (await http.get("/app.js")).text == "console.log(1)"
        for path in ("/../secret.txt", "/%2e%2e/secret.txt", "/..%2fsecret.txt"):
            response = await http.get(path)
            assert response.status_code == 404 and "do not serve" not in response.text, path
        assert (await http.get("/healthz")).json()["ok"], "routes win over the static mount"


async def test_no_index_html_no_static_mount(tmp_path):
    async with served(FakeEngine(), web_demo_dir=tmp_path) as (http, _):
        assert (await http.get("/")).status_code == 404


# --- engine ownership and the CLI ---------------------------------------------------------------


@pytest.mark.timeout(120)
async def test_the_lifespan_loads_and_closes_its_own_engine(tiny_model_dir):
    config = ServerConfig(port=0, webrtc=False, model=str(tiny_model_dir))
    app = create_app(config, vad_factory=SilentVad)
    async with serve_in_background(app, config) as url, httpx2.AsyncClient(base_url=url) as http:
        health = (await http.get("/healthz")).json()
        assert health["random_weights"] is True and health["model"] == str(tiny_model_dir)
        engine = app.state.realtime.engine
    assert engine.closed


def test_serve_flags_become_the_server_config(tmp_path):
    key_file = tmp_path / "key"
    key_file.write_text("from-file\n")
    args = build_parser().parse_args(
        [
            "serve",
            "--port",
            "0",
            "--api-key-file",
            str(key_file),
            "--max-sessions",
            "3",
            "--ice-host",
            "127.0.0.1",
            "--ice-host",
            "10.0.0.2",
            "--allowed-origin",
            "http://a.example",
            "--max-buffer-ms",
            "5000",
            "--events-per-second",
            "20",
            "--event-burst",
            "40",
            "--audio-bytes-per-second",
            "32000",
            "--audio-burst-bytes",
            "640000",
            "--threads",
            "2",
            "--no-webrtc",
        ]
    )
    config = server_config(args)
    assert (config.port, config.api_key, config.max_sessions) == (0, "from-file", 3)
    assert config.ice_host_addresses == ("127.0.0.1", "10.0.0.2")
    assert config.allowed_origins == ("http://a.example",)
    assert config.session_limits.max_buffer_ms == 5000
    assert (config.rate_limit.events_per_second, config.rate_limit.burst) == (20.0, 40)
    assert (config.rate_limit.audio_bytes_per_second, config.rate_limit.audio_burst_bytes) == (32000, 640000)
    assert config.torch_threads == 2 and config.webrtc is False and config.model is None
    assert config.preemptive_response_ms == ServerConfig().preemptive_response_ms == 200  # on by default
    for flag, value in (("off", None), ("OFF", None), ("150", 150)):
        assert (
            server_config(build_parser().parse_args(["serve", "--preemptive-response-ms", flag])).preemptive_response_ms
            == value
        )
    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve", "--preemptive-response-ms", "soon"])


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_omni_realtime_serve_starts_on_the_embedded_model_and_stops_on_sigint(tmp_path):
    env = os.environ | {"OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "realtime.cli.main",
            "serve",
            "--port",
            "0",
            "--cache-dir",
            str(tmp_path),
            "--no-webrtc",
        ],
        cwd=REPO,
        env=env,
        stderr=subprocess.PIPE,
        text=True,
    )
    log: list[str] = []
    try:
        for line in proc.stderr:
            log.append(line)
            running = re.search(r"Uvicorn running on (http://\S+)", line)
            if running:
                break
        assert running, "".join(log)
        health = httpx2.get(running.group(1) + "/healthz").json()
        assert health["random_weights"] is True and str(tmp_path) in health["model"]
        assert "RANDOM WEIGHTS" in "".join(log)
    finally:
        proc.send_signal(signal.SIGINT)
        _, rest = proc.communicate(timeout=60)
    assert proc.returncode == 0, "".join(log) + rest
