"""``bench --camera`` end to end against a real server (aiortc media path, silero VAD) and a fast fake engine that
sees (``FakeEngine(vision=TINY_VISION)``): over WebRTC the user's camera track reaches the spoken messages (the
server's /metrics count delivered frames during the level, the replies' usage counts their image tokens) and the
report says the camera was on; over WebSocket each turn sends one picture that the replies' usage counts. Loopback
only, as test_webrtc.py."""

from __future__ import annotations

import asyncio
import functools
import json

import pytest

from realtime.bench.camera import CameraOptions, scrape_camera_frames
from realtime.bench.cli import build_parser, resolve_options
from realtime.bench.client import PICTURES_SENT, USAGE_IMAGE_TOKENS, USAGE_RESPONSES, ClientOptions, ClientTransport
from realtime.bench.report import RESULTS_JSON, RunInfo, markdown, write_report
from realtime.bench.speech import load_speech_folder
from realtime.bench.sweep import SweepPlan, run_sweep
from realtime.config import ServerConfig
from realtime.server.app import create_app, serve_in_background
from tests.fakes import TINY_VISION, FakeEngine, Script
from tests.helpers.paths import TESTS

pytestmark = [pytest.mark.timeout(120), pytest.mark.slow]

CAMERA = CameraOptions(width=320, height=240, fps=5.0)
"""At 320x240 the server keeps the frame size on its 28-pixel grid (252x308): 99 positions a frame pair."""


def run_level(transport: ClientTransport, turns: int):
    speeches = load_speech_folder(TESTS / "fixtures" / "speech", max_seconds=4.0)[:1]
    config = ServerConfig(
        host="127.0.0.1",
        port=0,
        max_sessions=2,
        webrtc=transport is ClientTransport.WEBRTC,
        ice_host_addresses=("127.0.0.1",),
        log_level="warning",
    )
    engine = FakeEngine(Script(audio_chunks=10, chunk_ms=40, delay_s=0.01), vision=TINY_VISION)
    app = create_app(config, engine=engine)
    plan = SweepPlan((1,), turns=turns, min_samples=0, ramp_s=0.0, warmup_turns=0)

    async def run():
        async with serve_in_background(app, config) as url:
            return await run_sweep(
                url,
                speeches,
                plan,
                ClientOptions(transport, camera=CAMERA),
                camera_frames=functools.partial(scrape_camera_frames, url),
            )

    (level,) = asyncio.run(run())
    return level, engine


def test_a_webrtc_user_with_a_camera_sends_frames_the_server_delivers(tmp_path):
    level, engine = run_level(ClientTransport.WEBRTC, turns=1)
    assert [t.status for t in level.turns] == ["completed"] and level.errors == []
    frames = level.camera_frames
    assert frames is not None and frames["delivered"] > 0 and frames["skipped"] > 0, frames
    assert frames["invalid"] == frames["no_vision"] == 0
    (message,) = [h for h in engine.conversations[0].inputs.values() if h.state == "committed"]
    assert len(message.frames) == frames["delivered"]
    assert {shape for shape, _ in message.frames} == {(252, 308, 3)}
    counts = level.event_counts
    assert counts[PICTURES_SENT] == 0 and counts[USAGE_RESPONSES] == 1
    assert counts[USAGE_IMAGE_TOKENS] == TINY_VISION.tokens(240, 320, frames["delivered"]) > 0
    info = RunInfo(
        command="bench --camera",
        date="today",
        model="fake",
        device="cpu",
        transport="webrtc",
        server="in process",
        text_tokens=4,
        codec_tokens=40,
        wavs="fixtures",
        torch_threads=1,
        turns_per_user=1,
        workload="1 turn",
        lighter_workload=None,
        camera={"width": 320, "height": 240, "fps": 5.0, "sent_as": "WebRTC video track"},
    )
    text = markdown(info, [level])
    assert "Camera: on (WebRTC video track)." in text
    row = next(line for line in text.splitlines() if line.startswith("| 1 | 0 | "))
    assert row.split(" | ")[2] == str(frames["delivered"])
    write_report(tmp_path, info, [level], plots=False)
    results = json.loads((tmp_path / RESULTS_JSON).read_text())
    assert results["info"]["camera"]["fps"] == 5.0 and results["levels"][0]["camera_frames"] == frames


def test_a_websocket_user_with_a_camera_sends_a_picture_per_turn():
    level, engine = run_level(ClientTransport.WS, turns=2)
    assert [t.status for t in level.turns] == ["completed"] * 2 and level.errors == []
    counts = level.event_counts
    assert counts[PICTURES_SENT] == 2 and counts[USAGE_RESPONSES] == 2
    picture = TINY_VISION.tokens(240, 320)  # within the camera budget: sent as drawn, put on the grid by the server
    # each reply's usage counts the pictures in its context: one, then two
    assert counts[USAGE_IMAGE_TOKENS] == picture * (1 + 2)
    assert set(level.camera_frames.values()) == {0}  # no video track: the server counted no frame


def test_camera_options_from_the_command_line():
    parse = build_parser().parse_args
    assert resolve_options(parse(["--quick"])).camera is None
    options = resolve_options(parse(["--quick", "--camera", "--camera-size", "320x240", "--camera-fps", "10"]))
    assert options.camera == CameraOptions(320, 240, 10.0)
    for bad in (
        ["--camera-size", "320"],
        ["--camera-size", "axb"],
        ["--camera-size", "321x240"],
        ["--camera-fps", "0"],
    ):
        with pytest.raises(ValueError):
            resolve_options(parse(["--camera", *bad]))
