"""Security on a real server on loopback: which routes need the key (and which are open, showing
nothing of any session), browser origins, the limits one client or all of them can hit (sessions
across WebSocket and WebRTC, the WebRTC data channel's message size and event rate, response
length), no path traversal through the static files, and no API key in any log line.

Limits already shown elsewhere are not repeated: WebSocket session cap, message size, input audio
buffer and event rate in ``test_server_limits``; WebRTC call setup limits in ``test_webrtc``."""

from __future__ import annotations

import asyncio
import json
import logging

import httpx2
import pytest
import websockets
from aiortc import RTCConfiguration, RTCPeerConnection, RTCSessionDescription
from websockets.exceptions import InvalidStatus

from realtime.server.app import REDACTED, SecretFilter
from realtime.server.limits import RateLimit
from realtime.transports.webrtc import IceHostAddress, announce_host_addresses
from tests.helpers.server import ServeProcess, StatsEngine, assert_clean, connect, served, user_text

KEY = "sk-test_0123456789abcdef"
BEARER = {"Authorization": f"Bearer {KEY}"}

# --- routes and origins -------------------------------------------------------------------------


async def test_the_key_guards_the_session_routes_and_the_open_routes_show_no_session(tmp_path):
    demo = tmp_path / "demo"
    demo.mkdir()
    (demo / "index.html").write_text("<h1>voice chat</h1>")
    async with served(StatsEngine(), api_key=KEY, web_demo_dir=demo) as (url, app):
        async with httpx2.AsyncClient(base_url=app.state.base_url) as http:
            sdp = {"content-type": "application/sdp"}
            for headers in ({}, {"authorization": "Bearer wrong"}, {"authorization": f"Basic {KEY}"}):
                calls = await http.post("/v1/realtime/calls", content="v=0", headers=sdp | headers)
                assert calls.status_code == 401 and calls.json()["error"]["code"] == "invalid_api_key"
                with pytest.raises(InvalidStatus) as refused:
                    await websockets.connect(url, additional_headers=headers)
                assert refused.value.response.status_code == 401
            # a key in the URL (where access logs would keep it) is not one of the accepted forms
            with pytest.raises(InvalidStatus) as refused:
                await websockets.connect(f"{url}?api_key={KEY}")
            assert refused.value.response.status_code == 401
            async with connect(url, additional_headers=BEARER) as client:
                await client.send(user_text("my secret plan"))
                await client.until("conversation.item.done")
                session_id = client.events[0]["session"]["id"]
                for path in ("/healthz", "/metrics", "/"):
                    response = await http.get(path)  # open: no key
                    assert response.status_code == 200, path
                    for private in (KEY, session_id, "secret plan"):
                        assert private not in response.text, (path, private)
        await assert_clean(app)


async def test_browser_origins_are_checked_on_both_session_routes():
    allowed = "https://app.example"
    async with served(StatsEngine(), api_key=KEY, allowed_origins=(allowed,)) as (url, app):
        async with httpx2.AsyncClient(base_url=app.state.base_url) as http:
            sdp = BEARER | {"content-type": "application/sdp"}
            evil = {"origin": "https://evil.example"}
            foreign = await http.post("/v1/realtime/calls", content="v=0", headers=sdp | evil)
            assert foreign.status_code == 403 and foreign.json()["error"]["code"] == "origin_not_allowed"
            ours = await http.post("/v1/realtime/calls", content="v=0", headers=sdp | {"origin": allowed})
            assert ours.status_code == 501  # past access control: this server has no WebRTC
        with pytest.raises(InvalidStatus) as refused:
            await websockets.connect(url, origin="https://evil.example", additional_headers=BEARER)
        assert refused.value.response.status_code == 403
        async with connect(url, origin=allowed, subprotocols=["realtime", f"openai-insecure-api-key.{KEY}"]):
            pass


# --- limits -------------------------------------------------------------------------------------


class Peer:
    """A minimal WebRTC client: microphone transceiver, ``oai-events`` channel, loopback only."""

    def __init__(self) -> None:
        self.pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
        self.pc.addTransceiver("audio", direction="sendrecv")
        self.channel = self.pc.createDataChannel("oai-events")
        self.events: asyncio.Queue[dict] = asyncio.Queue()
        self.channel.on("message", lambda m: self.events.put_nowait(json.loads(m)))

    async def offer(self) -> str:
        await announce_host_addresses(self.pc, [IceHostAddress.parse("127.0.0.1")])
        await self.pc.setLocalDescription(await self.pc.createOffer())
        return self.pc.localDescription.sdp

    async def call(self, http: httpx2.AsyncClient) -> httpx2.Response:
        response = await http.post(
            "/v1/realtime/calls", content=await self.offer(), headers={"content-type": "application/sdp"}
        )
        if response.status_code == 201:
            await self.pc.setRemoteDescription(RTCSessionDescription(sdp=response.text, type="answer"))
        return response

    async def until(self, event_type: str, timeout: float = 15.0) -> dict:
        async with asyncio.timeout(timeout):
            while (event := await self.events.get())["type"] != event_type:
                pass
        return event


async def test_the_session_limit_counts_websocket_sessions_and_webrtc_calls_together():
    config = {"webrtc": True, "ice_host_addresses": ("127.0.0.1",), "max_sessions": 2}
    async with served(StatsEngine(), **config) as (url, app), httpx2.AsyncClient(base_url=app.state.base_url) as http:
        peers = [Peer(), Peer()]
        try:
            async with connect(url):
                assert (await peers[0].call(http)).status_code == 201
                await peers[0].until("session.created")  # (closing a peer mid-ICE leaks an aioice task)
                refused = await peers[1].call(http)  # one WebSocket session + one call: full
                assert refused.status_code == 503 and refused.headers["retry-after"].isdigit()
                assert refused.json()["error"]["code"] == "session_limit_reached"
                async with websockets.connect(url) as third:
                    error = json.loads(await third.recv())
                    assert error["error"]["code"] == "session_limit_reached"
                    with pytest.raises(websockets.ConnectionClosed) as closed:
                        await third.recv()
                    assert closed.value.rcvd.code == 1013
                assert (await http.get("/healthz")).json()["sessions"] == 2
        finally:
            for peer in peers:
                await peer.pc.close()
        await assert_clean(app, timeout=20)


async def test_the_data_channel_has_the_websocket_message_limits():
    config = {
        "webrtc": True,
        "ice_host_addresses": ("127.0.0.1",),
        "max_message_bytes": 4096,
        "rate_limit": RateLimit(events_per_second=2.0, burst=4),
    }
    async with served(StatsEngine(), **config) as (_, app), httpx2.AsyncClient(base_url=app.state.base_url) as http:
        peer = Peer()
        try:
            assert (await peer.call(http)).status_code == 201
            await peer.until("session.created")
            peer.channel.send(json.dumps(user_text("x" * 5000)))
            too_large = await peer.until("error")
            assert too_large["error"]["code"] == "message_too_large"
            for n in range(6):
                peer.channel.send(json.dumps({"type": "conversation.item.retrieve", "item_id": f"ghost{n}"}))
            codes = [(await peer.until("error"))["error"]["code"] for _ in range(6)]
            assert codes.count("item_not_found") == 3 and codes.count("rate_limit_exceeded") == 3, codes
        finally:
            await peer.pc.close()
        await assert_clean(app, timeout=20)


@pytest.mark.timeout(120)
async def test_response_length_is_capped(tiny_engine):
    """``max_output_tokens`` above the API's 4096 is refused; a per-response cap is honoured by the
    engine (``"inf"`` leaves the engine's own cap, ``thinker.max_tokens`` of the stage config)."""
    async with served(tiny_engine) as (url, app), connect(url) as client:
        await client.send({"type": "response.create", "event_id": "huge", "response": {"max_output_tokens": 100_000}})
        error = (await client.until("error"))["error"]
        assert (error["code"], error["param"], error["event_id"]) == (
            "invalid_value",
            "response.max_output_tokens",
            "huge",
        )
        await client.send({"type": "session.update", "session": {"type": "realtime", "max_output_tokens": "inf"}})
        assert (await client.until("session.updated"))["session"]["max_output_tokens"] == "inf"
        await client.send(user_text("Count to one hundred, slowly."))
        await client.send(
            {"type": "response.create", "response": {"max_output_tokens": 3, "output_modalities": ["text"]}}
        )
        done = (await client.until("response.done", timeout=60))["response"]
        assert done["usage"]["output_token_details"]["text_tokens"] <= 3
        if done["status"] == "incomplete":
            assert done["status_details"]["reason"] == "max_output_tokens"
        assert tiny_engine.max_output_tokens <= 4096
    await assert_clean(app, timeout=20)


# --- static files -------------------------------------------------------------------------------

TRAVERSALS = [
    "/../secret.txt",
    "/..%2fsecret.txt",
    "/..%2Fsecret.txt",
    "/%2e%2e/secret.txt",
    "/%2e%2e%2fsecret.txt",
    "/%252e%252e%252fsecret.txt",  # double-encoded
    "/..%252fsecret.txt",
    "/%25%32%65%25%32%65/secret.txt",
    "/....//secret.txt",
    "/..\\secret.txt",
    "/..%5csecret.txt",
    "/%c0%ae%c0%ae/secret.txt",  # overlong UTF-8 dots
    "/assets/../../secret.txt",
    "/.%2e/secret.txt",
    "/%00/../secret.txt",
    "//etc/passwd",
    "/etc/passwd",
    "/%2fetc%2fpasswd",
    "/..%2f..%2f..%2f..%2f..%2f..%2fetc%2fpasswd",
    "/link-out",
]


async def raw_get(base_url: str, target: str) -> tuple[int, bytes]:
    """GET ``target`` exactly as written (no client-side normalisation); status and body."""
    host, port = base_url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(f"GET {target} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n".encode("latin-1"))
    await writer.drain()
    response = await asyncio.wait_for(reader.read(), 10)
    writer.close()
    head, _, body = response.partition(b"\r\n\r\n")
    return int(head.split()[1]), body


async def test_no_path_traversal_out_of_the_static_folder(tmp_path):
    demo = tmp_path / "demo"
    (demo / "assets").mkdir(parents=True)
    (demo / "index.html").write_text("<h1>voice chat</h1>")
    (demo / "assets" / "app.js").write_text("console.log(1)")
    secret = tmp_path / "secret.txt"
    secret.write_text("TOP SECRET")
    (demo / "link-out").symlink_to(secret)
    async with served(StatsEngine(), web_demo_dir=demo) as (_, app):
        base = app.state.base_url
        assert await raw_get(base, "/assets/app.js") == (200, b"console.log(1)")
        for target in [*TRAVERSALS, str(secret), "/" + str(secret), f"http://{base[7:]}/../secret.txt"]:
            status, body = await raw_get(base, target)
            assert status in (400, 404), (target, status)
            assert b"TOP SECRET" not in body and b"root:" not in body, target


# --- no secrets in logs -------------------------------------------------------------------------


def test_the_secret_filter_redacts_messages_arguments_and_tracebacks():
    secret_filter = SecretFilter(KEY)
    record = logging.LogRecord(
        "websockets", logging.DEBUG, __file__, 1, "< %s: %s", ("authorization", f"Bearer {KEY}"), None
    )
    assert secret_filter.filter(record) and record.getMessage() == f"< authorization: Bearer {REDACTED}"
    try:
        raise ValueError(f"bad key {KEY}")
    except ValueError as exc:
        failed = logging.LogRecord("x", logging.ERROR, __file__, 1, "failed", None, (type(exc), exc, exc.__traceback__))
    secret_filter.filter(failed)
    text = logging.Formatter().format(failed)
    assert KEY not in text and f"bad key {REDACTED}" in text


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_the_key_never_reaches_the_log_even_at_debug_level(tiny_model_dir, tmp_path):
    """``omni-realtime serve --log-level debug`` logs every request header (the ``websockets``
    library does); refused and accepted sessions, with the key as a Bearer header and as the
    browser's subprotocol, leave no trace of it."""
    key_file = tmp_path / "key"
    key_file.write_text(KEY + "\n")
    server = ServeProcess(tiny_model_dir, tmp_path, "--api-key-file", str(key_file), log_level="debug")
    try:

        async def clients() -> None:
            for headers, protocols in (
                ({"Authorization": "Bearer wrong"}, None),
                ({}, None),
                ({}, ["realtime", "openai-insecure-api-key.wrong"]),
            ):
                with pytest.raises(InvalidStatus):
                    await websockets.connect(server.ws_url, additional_headers=headers, subprotocols=protocols)
            async with httpx2.AsyncClient(base_url=server.base_url) as http:
                assert (await http.post("/v1/realtime/calls", content="v=0")).status_code == 401
            for headers, protocols in ((BEARER, None), ({}, ["realtime", f"openai-insecure-api-key.{KEY}"])):
                async with connect(server.ws_url, additional_headers=headers, subprotocols=protocols) as client:
                    await client.send(user_text("Hello"))
                    await client.send(
                        {"type": "response.create", "response": {"max_output_tokens": 4, "output_modalities": ["text"]}}
                    )
                    await client.until("response.done", timeout=60)

        asyncio.run(clients())
    finally:
        log = server.stop()
    assert server.process.returncode == 0, log
    assert "openai-insecure-api-key" in log and "authorization" in log.lower(), "the headers were not logged"
    assert KEY not in log
    assert REDACTED in log
    assert "Traceback" not in log
    # the refusals (HTTP 401 before the handshake) are no server errors
    assert "ERROR" not in log and "without completing handshake" not in log, log
