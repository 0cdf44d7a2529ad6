"""Resource hygiene: what the server holds (``RealtimeServer.hygiene``: session tasks, event-loop
tasks, WebRTC peer connections, engine conversations/responses/KV positions, process memory) while
sessions live and after they end, as tests see it and as ``/metrics`` shows it.

Also the helpers of the other reliability tests (``test_faults``, ``test_security``,
``test_fuzz_protocol``): a server on loopback, a recording WebSocket client, an engine fake that
reports its stats, and :func:`assert_clean`, which waits until the server holds nothing of any
session and fails naming what is left."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import httpx2
import pytest
import websockets
from websockets.client import ClientProtocol
from websockets.frames import Close, Frame, Opcode
from websockets.protocol import State
from websockets.uri import parse_uri

from pipeline.outputs import EngineStats
from realtime.config import ServerConfig
from realtime.errors import RealtimeError
from realtime.limits import SessionSlots
from realtime.metrics import Hygiene, ServerMetrics
from realtime.runner import live_session_tasks, session_task_name
from realtime.server import create_app, serve_in_background
from realtime.transports.webrtc import WebRTCCalls
from tests.fakes import FakeEngine, Script

REPO = Path(__file__).resolve().parent.parent

# --- helpers shared by the reliability tests ----------------------------------------------------


class SilentVad:
    """A speech detector that hears nothing (no model to load)."""

    frame_samples = 512

    def __call__(self, frame) -> float:
        return 0.0

    def reset(self) -> None:
        pass


class StatsEngine(FakeEngine):
    """The fake engine, reporting what it holds as ``OmniEngine.stats`` does: open conversations,
    running responses, open audio inputs, and one "KV position" per item of an open conversation."""

    async def stats(self) -> EngineStats:
        live = [c for c in self.conversations if not c.closed]
        return EngineStats(
            conversations=len(live),
            responses=sum(c.active is not None for c in live),
            open_audio_messages=sum(h.state == "open" for c in live for h in c.inputs.values()),
            cached_tokens=sum(len(c.items) for c in live),
            talker_cached_tokens=0,
            pending_commands=0,
        )


@contextlib.asynccontextmanager
async def served(engine, *, vad_factory=SilentVad, **config) -> AsyncIterator[tuple[str, object]]:
    """A real server (no WebRTC unless asked) on a free loopback port; yields its ws:// URL of
    /v1/realtime and the app. ``app.state.idle`` is its hygiene before any session."""
    config = {"webrtc": False} | config
    cfg = ServerConfig(port=0, **config)
    app = create_app(cfg, engine=engine, vad_factory=vad_factory)
    async with serve_in_background(app, cfg) as url:
        app.state.idle = await app.state.realtime.hygiene()
        app.state.base_url = url
        yield url.replace("http://", "ws://") + "/v1/realtime", app


class Client:
    """A WebSocket client that records every event it reads, in order."""

    def __init__(self, ws) -> None:
        self.ws = ws
        self.events: list[dict] = []

    async def send(self, event: dict | str | bytes) -> None:
        await self.ws.send(event if isinstance(event, (str, bytes)) else json.dumps(event))

    async def next(self, timeout: float = 30.0) -> dict:
        event = json.loads(await asyncio.wait_for(self.ws.recv(), timeout))
        self.events.append(event)
        return event

    async def until(self, event_type: str, timeout: float = 30.0) -> dict:
        async with asyncio.timeout(timeout):
            while True:
                event = await self.next(timeout)
                if event["type"] == event_type:
                    return event

    def types(self) -> list[str]:
        return [e["type"] for e in self.events]

    def of_type(self, event_type: str) -> list[dict]:
        return [e for e in self.events if e["type"] == event_type]


@contextlib.asynccontextmanager
async def connect(url: str, **kwargs) -> AsyncIterator[Client]:
    async with websockets.connect(url, max_size=None, **kwargs) as ws:
        client = Client(ws)
        await client.until("session.created")
        yield client


class RawClient:
    """A WebSocket client over a bare socket (the ``websockets`` sans-I/O protocol): it reads only
    when asked, may shrink its receive buffer (so a server's sends block once it stops reading),
    can send any frame (text frames of invalid UTF-8 included) and can reset the connection."""

    def __init__(self, sock: socket.socket, protocol: ClientProtocol) -> None:
        self.sock = sock
        self.protocol = protocol
        self.events: list[dict] = []
        self.close_code: int | None = None
        self.close_reason: str | None = None

    @classmethod
    async def open(cls, url: str, *, rcvbuf: int | None = None) -> RawClient:
        sock = socket.socket()
        if rcvbuf is not None:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        sock.setblocking(False)
        uri = parse_uri(url)
        await asyncio.get_running_loop().sock_connect(sock, (uri.host, uri.port))
        client = cls(sock, ClientProtocol(uri, max_size=None))
        client.protocol.send_request(client.protocol.connect())
        await client.flush()
        await client.read(lambda: client.protocol.state is not State.CONNECTING)
        assert client.protocol.handshake_exc is None, client.protocol.handshake_exc
        return client

    async def flush(self, timeout: float = 5.0) -> bool:
        """Write what the protocol has to send; ``False`` if the socket took it not in time."""
        loop = asyncio.get_running_loop()
        try:
            for data in self.protocol.data_to_send():
                await asyncio.wait_for(loop.sock_sendall(self.sock, data), timeout)
        except TimeoutError:
            return False
        return True

    async def send(self, event: dict | str | bytes, *, timeout: float = 5.0) -> bool:
        """One text frame (bytes are sent as they are, valid UTF-8 or not)."""
        data = event if isinstance(event, bytes) else (event if isinstance(event, str) else json.dumps(event)).encode()
        self.protocol.send_text(data)
        return await self.flush(timeout)

    async def read(self, done: Callable[[], bool], timeout: float = 10.0) -> None:
        """Read until ``done()`` or the connection closes."""
        loop = asyncio.get_running_loop()
        async with asyncio.timeout(timeout):
            while not done() and self.close_code is None:
                data = await loop.sock_recv(self.sock, 1 << 16)
                if data:
                    self.protocol.receive_data(data)
                else:
                    self.protocol.receive_eof()
                self._collect()
                await self.flush()
                if not data:
                    break

    async def until(self, event_type: str, timeout: float = 10.0) -> dict:
        start = len(self.events)
        await self.read(lambda: any(e["type"] == event_type for e in self.events[start:]), timeout)
        return next(e for e in self.events[start:] if e["type"] == event_type)

    async def until_closed(self, timeout: float = 10.0) -> int | None:
        """Read everything up to the server's close frame; returns its code (``None``: no close
        frame, the connection just ended)."""
        await self.read(lambda: False, timeout)
        return self.close_code

    def _collect(self) -> None:
        for frame in self.protocol.events_received():
            if not isinstance(frame, Frame):  # the handshake's response
                continue
            if frame.opcode is Opcode.TEXT:
                self.events.append(json.loads(frame.data))
            elif frame.opcode is Opcode.CLOSE:
                close = Close.parse(frame.data)
                self.close_code, self.close_reason = close.code, close.reason

    def reset(self) -> None:
        """Abort the connection: the kernel sends a TCP RST, no close frame, no FIN."""
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.sock.close()

    def close(self) -> None:
        self.sock.close()


class ServeProcess:
    """``omni-realtime serve`` in a subprocess on a free loopback port (``--model``: a checkpoint
    folder), its stdout and stderr collected in :attr:`lines` by a thread."""

    def __init__(self, model_dir: Path, tmp_path: Path, *args: str, log_level: str = "info") -> None:
        env = os.environ | {"OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
        command = [sys.executable, "-m", "realtime.cli", "--log-level", log_level, "serve", "--port", "0",
                   "--model", str(model_dir), "--cache-dir", str(tmp_path), "--no-webrtc", *args]
        self.process = subprocess.Popen(command, cwd=REPO, env=env, stdout=subprocess.PIPE,
                                        stderr=subprocess.STDOUT, text=True)
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        self.base_url = self._wait_for_url(timeout=90)
        self.ws_url = self.base_url.replace("http://", "ws://") + "/v1/realtime"

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.append(line)

    def _wait_for_url(self, timeout: float) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and self.process.poll() is None:
            for line in list(self.lines):
                running = re.search(r"Uvicorn running on (http://\S+)", line)
                if running:
                    return running.group(1)
            time.sleep(0.05)
        self.process.kill()
        raise AssertionError("the server did not start:\n" + "".join(self.lines))

    def stop(self, timeout: float = 60) -> str:
        """SIGTERM if still running, wait for the exit; the whole log."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        self.process.wait(timeout)
        self._reader.join(timeout)
        return "".join(self.lines)


def user_text(text: str) -> dict:
    return {"type": "conversation.item.create", "item": {
        "type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}}


def _held(hygiene: Hygiene, idle: Hygiene) -> dict[str, int]:
    """What ``hygiene`` holds beyond the idle server (engine counts beyond its idle ones: a
    shared engine may hold other tests' state)."""
    held = {"sessions": hygiene.sessions, "session_tasks": hygiene.session_tasks,
            "webrtc_peers": hygiene.webrtc_peers, "outbound_events": hygiene.outbound_events}
    if hygiene.engine is not None and idle.engine is not None:
        now, before = hygiene.engine, idle.engine
        held |= {
            "engine_conversations": now.conversations - before.conversations,
            "engine_responses": now.responses - before.responses,
            "engine_open_audio_messages": now.open_audio_messages - before.open_audio_messages,
            "engine_kv_positions": (now.cached_tokens + now.talker_cached_tokens)
            - (before.cached_tokens + before.talker_cached_tokens),
        }
    if hygiene.loop_tasks > idle.loop_tasks:
        held["loop_tasks"] = hygiene.loop_tasks - idle.loop_tasks
    return {name: count for name, count in held.items() if count > 0}


async def assert_clean(app, timeout: float = 10.0) -> Hygiene:
    """Wait until the server holds nothing of any session (compared with ``app.state.idle``);
    fails naming what is still held."""
    server = app.state.realtime
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        hygiene = await server.hygiene()
        held = _held(hygiene, app.state.idle)
        if not held:
            return hygiene
        if loop.time() > deadline:
            raise AssertionError(f"still held {timeout:g} s after the sessions ended: {held}")
        await asyncio.sleep(0.02)


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
            await client.send({"type": "session.update", "session": {"type": "realtime", "audio": {
                "input": {"turn_detection": None}}}})
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
        for name in ("omni_realtime_session_tasks", "omni_realtime_engine_conversations",
                     "omni_realtime_engine_responses", "omni_realtime_engine_open_audio_messages"):
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
