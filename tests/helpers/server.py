"""The server harness of the WebSocket, reliability and browser tests: a server on loopback (in this
event loop, on a thread of its own, or ``omni-realtime serve`` in a subprocess), recording WebSocket
clients, an engine fake that reports its stats, and :func:`assert_clean`, which waits until the server
holds nothing of any session and fails naming what is left."""

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

import websockets
from websockets.client import ClientProtocol
from websockets.frames import Close, Frame, Opcode
from websockets.protocol import State
from websockets.uri import parse_uri

from pipeline.response_events import EngineStats
from realtime.config import ServerConfig
from realtime.observe.metrics import Hygiene
from realtime.server.app import create_app, serve_in_background
from tests.fakes import FakeEngine

REPO = Path(__file__).resolve().parents[2]


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
        command = [
            sys.executable,
            "-m",
            "realtime.cli.main",
            "--log-level",
            log_level,
            "serve",
            "--port",
            "0",
            "--model",
            str(model_dir),
            "--cache-dir",
            str(tmp_path),
            "--no-webrtc",
            *args,
        ]
        self.process = subprocess.Popen(
            command, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        self.base_url = self._wait_for_url(timeout=90)
        self.ws_url = re.sub("^http", "ws", self.base_url) + "/v1/realtime"

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.append(line)

    def _wait_for_url(self, timeout: float) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and self.process.poll() is None:
            for line in list(self.lines):
                running = re.search(r"Uvicorn running on (https?://\S+)", line)
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
    return {
        "type": "conversation.item.create",
        "item": {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]},
    }


def _held(hygiene: Hygiene, idle: Hygiene) -> dict[str, int]:
    """What ``hygiene`` holds beyond the idle server (engine counts beyond its idle ones: a
    shared engine may hold other tests' state)."""
    held = {
        "sessions": hygiene.sessions,
        "session_tasks": hygiene.session_tasks,
        "webrtc_peers": hygiene.webrtc_peers,
        "outbound_events": hygiene.outbound_events,
    }
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


def of_response(events: list[dict], event_type: str, response_id: str) -> list[dict]:
    return [e for e in events if e["type"] == event_type and e.get("response_id") == response_id]


class ServerThread:
    """uvicorn serving ``app`` on a loopback port from its own thread and event loop; with ``config``, configured as
    ``serve`` configures it (its TLS settings included; its host and port are not used)."""

    def __init__(self, app, config: ServerConfig | None = None) -> None:
        import uvicorn

        from realtime.server.app import _uvicorn_config

        self.socket = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.socket.bind(("127.0.0.1", 0))
        self.port = self.socket.getsockname()[1]
        self.scheme = config.http_scheme if config is not None else "http"
        if config is None:
            uvicorn_config = uvicorn.Config(app, log_level="warning", lifespan="on")
        else:
            uvicorn_config = _uvicorn_config(app, config, log_level="warning")
        self.server = uvicorn.Server(uvicorn_config)
        self.thread = threading.Thread(target=lambda: asyncio.run(self.server.serve(sockets=[self.socket])))

    @property
    def url(self) -> str:
        return f"{self.scheme}://127.0.0.1:{self.port}/"

    def __enter__(self) -> ServerThread:
        self.thread.start()
        for _ in range(300):
            if self.server.started:
                return self
            if not self.thread.is_alive():
                break
            self.thread.join(0.05)
        raise RuntimeError("the server did not start")

    def __exit__(self, *exc) -> None:
        self.server.should_exit = True
        self.thread.join(15)
        self.socket.close()
