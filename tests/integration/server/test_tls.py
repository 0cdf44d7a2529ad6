"""The server terminating TLS itself (``ServerConfig.ssl_*``, ``serve --ssl-certfile/--ssl-keyfile``), with a
self-signed certificate made here: the official ``openai`` Python SDK and the ``openai`` npm package's realtime
client (which accepts only ``wss://``) each hold a text turn over ``wss://`` trusting only that certificate; a plain
``ws://`` client on the TLS port fails cleanly and the server serves on; the web demo, ``/healthz`` and a WebRTC call
(``POST /v1/realtime/calls``) work over ``https://``; mutual TLS refuses a client without a certificate; the CLI
starts with an encrypted key and says ``https://``."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import ssl
from asyncio.subprocess import PIPE
from collections.abc import AsyncIterator
from pathlib import Path

import httpx2
import pytest
import websockets
from openai import AsyncOpenAI

from realtime.config import ServerConfig
from realtime.server.app import create_app, serve_in_background
from tests.helpers.npm import NpmPackages, installed_version
from tests.helpers.paths import TESTS
from tests.helpers.server import ServeProcess, SilentVad
from tests.helpers.tls import CertFiles, client_certificate, self_signed

pytestmark = pytest.mark.slow

API_KEY = "tls-test-key"
NODE_SCRIPT = TESTS / "integration" / "server" / "node" / "openai_wss_text_turn.mjs"
OPENAI_NPM = "openai@7"
NPM = NpmPackages("npm-openai7", (OPENAI_NPM, "ws"), "openai")


@pytest.fixture(scope="module")
def certs(tmp_path_factory) -> CertFiles:
    return self_signed(tmp_path_factory.mktemp("tls"))


@contextlib.asynccontextmanager
async def tls_served(engine, certs: CertFiles, **config) -> AsyncIterator[str]:
    """A server with ``certs`` on a free loopback port; yields its ``https://`` base URL."""
    cfg = ServerConfig(
        port=0, api_key=API_KEY, ssl_certfile=certs.cert, ssl_keyfile=certs.key, **{"webrtc": False} | config
    )
    app = create_app(cfg, engine=engine, vad_factory=SilentVad)
    async with serve_in_background(app, cfg) as url:
        assert url.startswith("https://")
        yield url


TEXT_SESSION = {"type": "realtime", "output_modalities": ["text"], "max_output_tokens": 8}


async def sdk_text_turn(base_url: str, context: ssl.SSLContext) -> list:
    """One text turn with the ``openai`` SDK over ``wss://`` trusting ``context``; every event up to response.done
    (an error event fails)."""
    client = AsyncOpenAI(base_url=f"{base_url}/v1", api_key=API_KEY)
    options = {"ssl": context}  # handed to websockets' connect
    seen: list = []
    async with client.realtime.connect(model="gpt-realtime", websocket_connection_options=options) as connection:
        await connection.session.update(session=TEXT_SESSION)
        await connection.conversation.item.create(
            item={"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Hello over TLS?"}]}
        )
        await connection.response.create()
        async with asyncio.timeout(60):
            async for event in connection:
                seen.append(event)
                assert event.type != "error", event
                if event.type == "response.done":
                    return seen
    raise AssertionError(f"the connection closed before response.done: {[e.type for e in seen]}")


@pytest.mark.timeout(120)
async def test_the_openai_sdk_holds_a_text_turn_over_wss_and_plain_ws_fails_cleanly(tiny_engine, certs):
    async with tls_served(tiny_engine, certs) as base_url:
        events = await sdk_text_turn(base_url, certs.client_context())
        types = [e.type for e in events]
        assert types[0] == "session.created" and "session.updated" in types
        assert "response.output_text.delta" in types
        assert events[-1].response.status in ("completed", "incomplete")

        ws_url = base_url.replace("https://", "ws://") + "/v1/realtime"
        with pytest.raises(websockets.exceptions.InvalidMessage):  # the TLS port answers no plain HTTP
            async with asyncio.timeout(10):
                await websockets.connect(ws_url, additional_headers={"Authorization": f"Bearer {API_KEY}"})
        untrusted = ssl.create_default_context()  # the system's CAs only: the self-signed certificate is refused
        with pytest.raises(ssl.SSLCertVerificationError):
            await websockets.connect(base_url.replace("https://", "wss://") + "/v1/realtime", ssl=untrusted)
        again = await sdk_text_turn(base_url, certs.client_context())  # the server serves on
        assert again[-1].type == "response.done"


async def webrtc_call_over_https(http: httpx2.AsyncClient) -> dict:
    """An aiortc peer's call set up with ``POST /v1/realtime/calls`` over ``http``; its first data channel event."""
    from aiortc import RTCConfiguration, RTCPeerConnection, RTCSessionDescription

    from realtime.transports.webrtc import IceHostAddress, announce_host_addresses

    pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
    try:
        pc.addTransceiver("audio", direction="sendrecv")
        channel = pc.createDataChannel("oai-events")
        first: asyncio.Future = asyncio.get_running_loop().create_future()
        channel.on("message", lambda m: first.done() or first.set_result(json.loads(m)))
        await announce_host_addresses(pc, [IceHostAddress.parse("127.0.0.1")])
        await pc.setLocalDescription(await pc.createOffer())
        answer = await http.post(
            "/v1/realtime/calls",
            content=pc.localDescription.sdp,
            headers={"content-type": "application/sdp", "authorization": f"Bearer {API_KEY}"},
        )
        assert answer.status_code == 201, answer.text
        await pc.setRemoteDescription(RTCSessionDescription(sdp=answer.text, type="answer"))
        return await asyncio.wait_for(first, 20)
    finally:
        await pc.close()


@pytest.mark.timeout(120)
async def test_the_demo_healthz_and_webrtc_calls_are_served_over_https(tiny_engine, certs):
    async with (
        tls_served(tiny_engine, certs, webrtc=True, ice_host_addresses=("127.0.0.1",)) as base_url,
        httpx2.AsyncClient(base_url=base_url, verify=certs.client_context()) as http,
    ):
        page = await http.get("/")
        assert page.status_code == 200 and "<html" in page.text
        ws_js = await http.get("/ws.js")  # the page's WebSocket follows its scheme: wss:// on an https:// page
        assert 'location.protocol === "https:" ? "wss:" : "ws:"' in ws_js.text
        health = (await http.get("/healthz")).json()
        assert health["ok"] and health["webrtc"]
        first = await webrtc_call_over_https(http)
        assert first["type"] == "session.created"


@pytest.mark.timeout(60)
async def test_mutual_tls_refuses_a_client_without_a_certificate_signed_by_the_ca(tiny_engine, certs, tmp_path):
    client = client_certificate(tmp_path, issuer=certs)
    stranger = client_certificate(tmp_path / "stranger", issuer=self_signed(tmp_path / "other-ca"))
    async with tls_served(tiny_engine, certs, ssl_ca_certs=certs.cert) as base_url:
        with_cert = certs.client_context()
        with_cert.load_cert_chain(client.cert, client.key)
        async with httpx2.AsyncClient(base_url=base_url, verify=with_cert) as http:
            assert (await http.get("/healthz")).status_code == 200
        for context in (certs.client_context(), _with_chain(certs.client_context(), stranger)):
            with pytest.raises((httpx2.ConnectError, httpx2.ReadError, httpx2.RemoteProtocolError)):
                async with httpx2.AsyncClient(base_url=base_url, verify=context) as http:
                    await http.get("/healthz")


def _with_chain(context: ssl.SSLContext, cert: CertFiles) -> ssl.SSLContext:
    context.load_cert_chain(cert.cert, cert.key)
    return context


# --- the command line ----------------------------------------------------------------------------------------


@pytest.mark.timeout(180)
def test_serve_with_an_encrypted_key_says_https_and_answers_over_it(tiny_model_dir, tmp_path):
    certs = self_signed(tmp_path / "tls", key_password="s3cret")
    tls = ["--ssl-certfile", str(certs.cert), "--ssl-keyfile", str(certs.key), "--ssl-keyfile-password", "s3cret"]
    server = ServeProcess(tiny_model_dir, tmp_path, *tls)
    try:
        assert server.base_url.startswith("https://127.0.0.1:") and server.ws_url.startswith("wss://")
        with httpx2.Client(base_url=server.base_url, verify=certs.client_context()) as http:
            assert http.get("/healthz").json()["ok"]
    finally:
        log = server.stop()
    assert f"over https:// and wss:// (TLS, certificate {certs.cert})" in log, log
    assert "s3cret" not in log and "Traceback" not in log, log


# --- the openai npm package ---------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def openai_npm(request) -> Path:
    """A folder with ``openai@7`` and ``ws`` installed by npm (skips when npm cannot install them)."""
    folder = NPM.folder(request.config)
    version = installed_version(folder, "openai")
    assert version.startswith("7."), version
    return folder


@pytest.mark.background(NPM)
@pytest.mark.timeout(300)
async def test_the_openai_npm_realtime_client_holds_a_text_turn_over_wss(tiny_engine, certs, openai_npm):
    script = openai_npm / NODE_SCRIPT.name
    shutil.copyfile(NODE_SCRIPT, script)  # beside its node_modules, where its imports resolve
    async with tls_served(tiny_engine, certs) as base_url:
        results = {}
        for trusted in (True, False):
            env = {name: value for name, value in os.environ.items() if name != "NODE_EXTRA_CA_CERTS"}
            if trusted:
                env["NODE_EXTRA_CA_CERTS"] = str(certs.cert)
            node = await asyncio.create_subprocess_exec(
                "node", str(script), f"{base_url}/v1", API_KEY, env=env, stdout=PIPE, stderr=PIPE
            )
            out, err = await asyncio.wait_for(node.communicate(), 90)
            results[trusted] = (node.returncode, out.decode(), err.decode())
    code, out, err = results[True]
    assert code == 0, f"node exited with {code}:\n{err}\n{out}"
    types = [json.loads(line)["type"] for line in out.splitlines()]
    assert types[:2] == ["session.created", "session.updated"] and types[-1] == "response.done", types
    assert "error" not in types and "conversation.item.added" in types and "response.created" in types
    code, _, err = results[False]  # without the certificate trusted, node refuses the connection
    assert code == 1 and "self-signed certificate" in err, err
