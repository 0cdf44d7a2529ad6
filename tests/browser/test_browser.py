"""The voice chat page in headless Chromium (Debian's package, driven by Playwright), talking to a
real server: uvicorn on 127.0.0.1 serving ``realtime.server.app.create_app`` (the page, WebSocket
``/v1/realtime``, WebRTC ``/v1/realtime/calls``, ``/healthz``) over the tiny random model.

Chromium's fake microphone plays a spoken fixture once (``%noloop``), padded with silence so the
question starts after the connection is up. Each test connects through one transport and waits
until the page shows a user speech item and an assistant transcript, and has played assistant
audio (its AnalyserNode read RMS > 0.01 on the played output); then it saves a screenshot under
``tests/artifacts/`` (git-ignored).

The WebSocket path's AudioWorklet code (resampler, playback jitter buffer) is also checked as
plain logic in a blank page, with the worklet globals stubbed.

WebRTC stays on loopback: the server offers only 127.0.0.1 and the test strips every other
candidate from the page's offer, so no STUN and no packet off the machine even outside a network
namespace (``scripts/run_browser_tests.sh`` also runs it inside a loopback-only one).
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

from tests.helpers.paths import REPO, TESTS
from tests.helpers.server import ServerThread

pytestmark = [pytest.mark.browser, pytest.mark.timeout(180), pytest.mark.slow]

CHROMIUM = Path("/usr/bin/chromium")
SPEECH = TESTS / "fixtures" / "speech"
ARTIFACTS = TESTS / "artifacts"
LEAD_IN_S = 1.5  # silence before the question: the page connects meanwhile (~0.3 s)
TAIL_S = 2.0  # silence after it, so the server VAD sees the end of the turn
TURN_TIMEOUT_MS = 40_000

if not CHROMIUM.exists():
    pytest.skip("Chromium is not installed (apt-get install -y chromium)", allow_module_level=True)
playwright_sync = pytest.importorskip("playwright.sync_api", reason="playwright is not installed")


@pytest.fixture(scope="module")
def server(tiny_engine):
    from realtime.config import ServerConfig
    from realtime.server.app import create_app

    app = create_app(ServerConfig(ice_host_addresses=("127.0.0.1",)), engine=tiny_engine)
    with ServerThread(app) as running:
        yield running


@pytest.fixture(scope="module")
def microphone_wav(tmp_path_factory) -> Path:
    """The fake microphone's input: a question padded with silence (16-bit, 24 kHz mono)."""
    pcm, rate = sf.read(SPEECH / "capital_of_france.wav", dtype="float32")
    silence = lambda seconds: np.zeros(int(seconds * rate), np.float32)  # noqa: E731
    padded = np.concatenate([silence(LEAD_IN_S), pcm, silence(TAIL_S)])
    path = tmp_path_factory.mktemp("mic") / "question.wav"
    sf.write(path, padded, rate, subtype="PCM_16")
    return path


@pytest.fixture(scope="module")
def browser(microphone_wav):
    with playwright_sync.sync_playwright() as p:
        browser = p.chromium.launch(
            executable_path=str(CHROMIUM),
            headless=True,
            args=[
                "--use-fake-ui-for-media-stream",
                "--use-fake-device-for-media-stream",
                f"--use-file-for-fake-audio-capture={microphone_wav}%noloop",
                "--autoplay-policy=no-user-gesture-required",
                "--allow-loopback-in-peer-connection",
                # Raw host addresses instead of mDNS names: nothing to resolve by multicast.
                "--disable-features=WebRtcHideLocalIpsWithMdns",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-quic",
                "--no-first-run",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
            ],
        )
        yield browser
        browser.close()


_CANDIDATE = re.compile(r"^a=candidate:\S+ \d+ \S+ \d+ (\S+) ")


def loopback_only(sdp: str) -> str:
    """The offer without candidates other than 127.0.0.1 (keeps the test on loopback)."""

    def foreign(line: str) -> bool:
        match = _CANDIDATE.match(line)
        return match is not None and match[1] != "127.0.0.1"

    return "\r\n".join(line for line in sdp.split("\r\n") if not foreign(line))


def turn_camera_on(page) -> None:
    page.click("#camera-toggle")
    page.wait_for_function(
        "() => window.omniDemo.camera.on && document.getElementById('camera-preview').videoWidth > 0", timeout=5_000
    )


def talk(
    browser,
    server,
    transport: str,
    screenshot: str,
    *,
    camera: str | None = None,
    init_script: str | None = None,
    **context_options,
) -> dict:
    """Open the page (``init_script`` run first), connect over ``transport`` (``camera``: the camera turned on
    ``before`` connecting or ``during`` the call, before the user speaks), wait for one full
    spoken turn; returns the page's ``window.omniDemo`` state, with the URLs of the WebSockets it opened under
    ``websockets``. ``context_options``: Playwright's browser context options."""
    ARTIFACTS.mkdir(exist_ok=True)
    context = browser.new_context(**context_options)
    page = context.new_page()
    if init_script is not None:
        page.add_init_script(init_script)
    offers: list[str] = []
    websockets: list[str] = []
    page.on("websocket", lambda ws: websockets.append(ws.url))

    def keep_on_loopback(route) -> None:
        offer = route.request.post_data or ""
        offers.append(offer)
        route.continue_(post_data=loopback_only(offer))

    page.route("**/v1/realtime/calls", keep_on_loopback)
    console: list[str] = []
    page.on("console", lambda message: console.append(f"{message.type}: {message.text}"))
    page.on("pageerror", lambda error: console.append(f"pageerror: {error}"))
    try:
        page.goto(server.url)
        page.wait_for_selector("#banner:not([hidden])", timeout=5_000)  # random weights, said plainly
        page.select_option("#transport", transport)
        page.fill("#max-tokens", "8")  # a short reply: the random model would ramble for seconds
        if camera == "before":
            turn_camera_on(page)
        page.click("#connect")
        page.wait_for_function("() => window.omniDemo.state === 'connected'", timeout=15_000)
        if camera == "during":
            turn_camera_on(page)
        page.wait_for_function(
            """() => {
                const d = window.omniDemo;
                return d.transcript.some(t => t.role === 'user')
                    && d.transcript.some(t => t.role === 'assistant' && t.text.length > 0)
                    && d.events.includes('response.done')
                    && d.stats.outputMaxRms > 0.01;
            }""",
            timeout=TURN_TIMEOUT_MS,
        )
        page.wait_for_timeout(300)  # let the latency readout and transcript settle for the picture
        page.screenshot(path=str(ARTIFACTS / screenshot), full_page=True)
        state = page.evaluate("() => window.omniDemo")
        state["remote_audio_playing"] = page.evaluate(
            "() => { const a = document.getElementById('remote-audio'); return a.srcObject !== null && !a.paused; }"
        )
        state["offers"] = offers
        state["websockets"] = websockets
        state["page_protocol"] = page.evaluate("() => location.protocol")
        state["latency_text"] = page.inner_text("#latency")
        page.click("#connect")  # disconnect
        page.wait_for_function("() => window.omniDemo.state === 'closed'", timeout=5_000)
        return state
    except playwright_sync.Error as exc:
        log = page.inner_text("#log") if not page.is_closed() else ""
        raise AssertionError(f"{exc.message}\nconsole:\n" + "\n".join(console) + f"\npage log:\n{log}") from None
    finally:
        context.close()


def test_voice_turn_over_webrtc(browser, server):
    state = talk(browser, server, "webrtc", "browser_webrtc.png")
    assert state["error"] is None
    assert "input_audio_buffer.speech_stopped" in state["events"]
    assert "output_audio_buffer.started" in state["events"]
    assert "response.output_audio.delta" not in state["events"]  # the reply came on the media track
    assert state["stats"]["micMaxRms"] > 0.01  # the fake microphone was heard
    assert state["stats"]["outputMaxRms"] > 0.01 and state["remote_audio_playing"]
    assert state["stats"]["latenciesMs"] and state["latency_text"].endswith("ms")
    assert len(state["offers"]) == 1 and "m=video" in state["offers"][0]  # the camera's sender, trackless
    assert _wait(lambda: server_app_calls(server) == 0)  # the call was torn down after disconnect


def test_voice_turn_over_websocket(browser, server):
    state = talk(browser, server, "websocket", "browser_websocket.png")
    assert state["error"] is None
    assert state["stats"]["audioDeltas"] > 0
    assert state["stats"]["outputMaxRms"] > 0.01  # measured after the playback worklet
    assert state["stats"]["latenciesMs"]
    assert state["offers"] == []


@pytest.fixture(scope="module")
def tls_server(tiny_engine, tmp_path_factory):
    """The server over TLS with a self-signed certificate made here (a browser on another machine needs https)."""
    from realtime.config import ServerConfig
    from realtime.server.app import create_app
    from tests.helpers.tls import self_signed

    certs = self_signed(tmp_path_factory.mktemp("tls"))
    config = ServerConfig(ssl_certfile=certs.cert, ssl_keyfile=certs.key, ice_host_addresses=("127.0.0.1",))
    with ServerThread(create_app(config, engine=tiny_engine), config) as running:
        yield running


def test_voice_turn_over_websocket_on_an_https_page(browser, tls_server):
    """The page served over https (its certificate accepted as a user accepts a self-signed one) opens its
    WebSocket with wss:// and holds a spoken turn."""
    assert tls_server.url.startswith("https://")
    state = talk(browser, tls_server, "websocket", "browser_https_websocket.png", ignore_https_errors=True)
    assert state["error"] is None and state["page_protocol"] == "https:"
    assert state["websockets"] and all(url.startswith("wss://") for url in state["websockets"]), state["websockets"]
    assert state["stats"]["audioDeltas"] > 0 and state["stats"]["outputMaxRms"] > 0.01


@pytest.fixture(scope="module")
def seeing_server(request):
    """The server over a fake engine with a vision tower (tests.fakes): the page's camera paths without a model,
    with the WebRTC calls' media (their cameras included) in the server's process or on ``request.param`` media
    workers (each test names the placements it runs on: :data:`BOTH_MEDIA_PATHS` or :data:`IN_PROCESS`)."""
    from realtime.config import ServerConfig
    from realtime.server.app import create_app
    from tests.fakes import TINY_VISION, FakeEngine

    engine = FakeEngine(vision=TINY_VISION)
    config = ServerConfig(ice_host_addresses=("127.0.0.1",), media_workers=request.param)
    with ServerThread(create_app(config, engine=engine)) as running:
        running.engine = engine
        yield running


BOTH_MEDIA_PATHS = pytest.mark.parametrize(
    "seeing_server", [0, 2], ids=["in-process", "2-media-workers"], indirect=True
)
IN_PROCESS = pytest.mark.parametrize("seeing_server", [0], ids=["in-process"], indirect=True)
"""Where a test's calls have their media. A WebSocket picture never touches the media workers, and the answer that
refuses a camera's codec is one function on both paths (``realtime/transports/peer.py``; both paths are checked
without a browser in tests/integration/server/test_webrtc_camera.py): those run in-process only."""


def camera_frames(server: ServerThread) -> dict[str, float]:
    """The server's ``/metrics`` camera frame counts by outcome."""
    from urllib.request import urlopen

    with urlopen(server.url + "metrics", timeout=5) as response:
        text = response.read().decode()
    return {
        m[1]: float(m[2])
        for m in re.finditer(r'^omni_realtime_camera_frames_total\{outcome="(\w+)"\} (\S+)$', text, re.M)
    }


@BOTH_MEDIA_PATHS
def test_voice_turn_with_the_camera_over_webrtc(browser, seeing_server):
    """The camera turned on during the call (the page's video sender gets the track, no renegotiation): the
    server hands sampled frames to the spoken message."""
    before = camera_frames(seeing_server).get("delivered", 0.0)
    state = talk(browser, seeing_server, "webrtc", "browser_webrtc_camera.png", camera="during")
    assert state["error"] is None and state["camera"]["on"]
    assert state["stats"]["outputMaxRms"] > 0.01
    frames = camera_frames(seeing_server)
    assert frames["delivered"] - before >= 2, frames  # 2 a second of speech (the question lasts ~2 s)
    assert frames["invalid"] == 0 and frames["no_vision"] == 0
    conversation = seeing_server.engine.conversations[-1]
    assert any(handle.frames for handle in conversation.inputs.values())


@IN_PROCESS
def test_voice_turn_with_the_camera_over_websocket(browser, seeing_server):
    """Over WebSocket the page sends the camera's picture as an input_image item when the user starts speaking,
    downscaled to the low-detail budget, and the server takes it."""
    state = talk(browser, seeing_server, "websocket", "browser_websocket_camera.png", camera="before")
    assert state["error"] is None and "error" not in state["events"]
    assert state["camera"]["picturesSent"] >= 1
    picture = state["camera"]["lastPicture"]
    assert 0 < picture["width"] * picture["height"] <= 256 * 28 * 28
    conversation = seeing_server.engine.conversations[-1]
    pictures = [call for call in conversation.calls if call[0] == "add_content"]
    assert len(pictures) == state["camera"]["picturesSent"], conversation.calls
    assert all(len(call[2]) == 1 and call[2][0][2] == 3 for call in pictures)
    assert conversation.image_tokens > 0


VP9_ONLY = """
const addTransceiver = RTCPeerConnection.prototype.addTransceiver;
RTCPeerConnection.prototype.addTransceiver = function (...args) {
    const transceiver = addTransceiver.apply(this, args);
    if (transceiver.receiver.track.kind === "video") {
        const codecs = RTCRtpReceiver.getCapabilities("video").codecs;
        transceiver.setCodecPreferences(codecs.filter((c) => /vp9/i.test(c.mimeType)));
    }
    return transceiver;
};
"""


@IN_PROCESS
def test_a_camera_in_a_codec_the_server_cannot_decode_is_refused_and_the_call_goes_on(browser, seeing_server):
    """The page offers its video in VP9 only (aiortc decodes VP8 and H.264): the answer rejects the video section,
    the refusal is counted, and the spoken turn goes on."""
    refused = lambda: camera_tracks_refused(seeing_server)  # noqa: E731
    before, delivered = refused(), camera_frames(seeing_server)["delivered"]
    state = talk(browser, seeing_server, "webrtc", "browser_webrtc_vp9.png", camera="during", init_script=VP9_ONLY)
    assert state["error"] is None and state["camera"]["on"]
    (offer,) = state["offers"]
    video = offer.split("m=video")[1].split("m=")[0]
    assert "VP9/90000" in video and "VP8/90000" not in video and "H264/90000" not in video
    assert state["stats"]["outputMaxRms"] > 0.01 and "response.done" in state["events"]
    assert refused() == before + 1
    assert camera_frames(seeing_server)["delivered"] == delivered


def camera_tracks_refused(server: ServerThread) -> float:
    from urllib.request import urlopen

    with urlopen(server.url + "metrics", timeout=5) as response:
        text = response.read().decode()
    return float(
        re.search(r'^omni_realtime_camera_tracks_refused_total\{reason="unsupported_codec"\} (\S+)$', text, re.M)[1]
    )


def server_app_calls(server: ServerThread) -> int:
    webrtc = server.server.config.app.state.webrtc
    return webrtc.live_calls


def _wait(predicate, timeout_s: float = 5.0) -> bool:
    import time

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return predicate()


WORKLETS = REPO / "web_demo" / "worklets.js"

_WORKLET_STUBS = """
window.sampleRate = 48000;
window.AudioWorkletProcessor = class {
    constructor() { this.port = { posted: [], postMessage(m) { this.posted.push(m); } }; }
};
window.processors = {};
window.registerProcessor = (name, cls) => { window.processors[name] = cls; };
"""

_RESAMPLE = """([inRate, outRate, freq]) => {
    const r = new SincResampler(inRate, outRate);
    const x = new Float32Array(inRate);  // one second of a 0.5 sine
    for (let i = 0; i < x.length; i++) x[i] = 0.5 * Math.sin(2 * Math.PI * freq * i / inRate);
    const parts = [];
    for (let i = 0; i < x.length; i += 128) parts.push(...r.process(x.subarray(i, i + 128)));
    parts.push(...r.flush());
    let err = 0, sum = 0;
    for (let i = 200; i < parts.length - 200; i++) {
        err = Math.max(err, Math.abs(parts[i] - 0.5 * Math.sin(2 * Math.PI * freq * i / outRate)));
        sum += parts[i] * parts[i];
    }
    return { length: parts.length, maxError: err, rms: Math.sqrt(sum / (parts.length - 400)) };
}"""

_JITTER = """() => {
    const p = new processors["omni-playback"]({ processorOptions: { inputRate: 24000, prebufferMs: 120 } });
    const quantum = () => {  // one render quantum; true if it carried sound
        const out = [[new Float32Array(128)]];
        p.process([], out);
        return out[0][0].some(v => Math.abs(v) > 0.01);
    };
    const audio = (itemId, ms) => {
        const samples = new Float32Array(24 * ms);
        for (let i = 0; i < samples.length; i++) samples[i] = 0.5 * Math.sin(i / 3);
        p.port.onmessage({ data: { type: "audio", itemId, samples } });
    };
    const result = {};
    audio("a", 40);
    result.belowPrebuffer = quantum();
    audio("a", 100);
    result.abovePrebuffer = quantum();
    let quanta = 1;
    while (quantum()) quanta++;
    result.playedMsBeforeUnderrun = quanta * 128 / 48;
    audio("a", 40);
    p.port.onmessage({ data: { type: "end" } });
    result.endPlaysShortTail = quantum();
    for (let i = 0; i < 30; i++) quantum();
    audio("b", 200);
    for (let i = 0; i < 20; i++) quantum();
    p.port.onmessage({ data: { type: "clear" } });
    result.afterClear = quantum();
    result.reports = p.port.posted
        .filter(m => m.type !== "progress")
        .map(m => [m.type, m.itemId, Math.round(m.playedMs)]);
    return result;
}"""


@pytest.fixture
def worklet_page(browser):
    context = browser.new_context()
    page = context.new_page()
    page.add_init_script(_WORKLET_STUBS)
    page.goto("about:blank")
    page.add_script_tag(path=str(WORKLETS))
    yield page
    context.close()


@pytest.mark.parametrize(
    "in_rate,out_rate,freq", [(48_000, 24_000, 1000), (44_100, 24_000, 1000), (24_000, 48_000, 3000)]
)
def test_worklet_resampler_is_accurate(worklet_page, in_rate, out_rate, freq):
    """The worklets' resampler (capture 48/44.1 kHz → 24 kHz, playback 24 kHz → device) keeps
    a tone's level, phase and length."""
    result = worklet_page.evaluate(_RESAMPLE, [in_rate, out_rate, freq])
    assert abs(result["length"] - out_rate) <= 4
    assert result["maxError"] < 0.002 and abs(result["rms"] - 0.5 / np.sqrt(2)) < 0.001


def test_worklet_resampler_removes_what_the_new_rate_cannot_carry(worklet_page):
    result = worklet_page.evaluate(_RESAMPLE, [48_000, 24_000, 20_000])  # above 12 kHz: aliasing
    assert result["rms"] < 0.002


def test_worklet_playback_jitter_buffer(worklet_page):
    result = worklet_page.evaluate(_JITTER)
    assert not result["belowPrebuffer"] and result["abovePrebuffer"]  # waits for 120 ms
    assert abs(result["playedMsBeforeUnderrun"] - 140) <= 6  # then plays everything queued
    assert result["endPlaysShortTail"]  # a reply's end plays out even below the prebuffer
    assert not result["afterClear"]
    assert result["reports"] == [["underrun", "a", 139], ["drained", "a", 180], ["cleared", "b", 53]]
