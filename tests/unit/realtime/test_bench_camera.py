"""The bench's simulated camera (realtime/bench/camera.py, camera_track.py): the moving pattern, the track's frames and
timestamps, the WebSocket pictures (as the server decodes them), and a user who sends a picture when each turn's
speech starts and counts the image tokens of the replies' usage."""

from __future__ import annotations

import asyncio
import json

import numpy as np
import pytest
from aiortc.mediastreams import MediaStreamError

from realtime.bench.camera import CameraOptions, CameraPictures, pattern_frames
from realtime.bench.camera_track import VIDEO_CLOCK_RATE, VIDEO_TIME_BASE, CameraTrack
from realtime.media.images import ImageLimits, decode_item
from realtime.media.video_settings import DEFAULT_CAMERA
from realtime.protocol.client import parse_client_event
from tests.fakes import TINY_VISION


def bar_columns(rgb: np.ndarray) -> np.ndarray:
    """Columns where the white bar is (all three channels near 255 down the whole middle row band)."""
    band = rgb[rgb.shape[0] // 4 : 3 * rgb.shape[0] // 4].astype(int)
    return np.flatnonzero(band.min(axis=(0, 2)) > 230)


def test_the_pattern_is_a_bar_moving_across_distinct_frames():
    options = CameraOptions(width=160, height=96, distinct_frames=4)
    frames = pattern_frames(options)
    assert len(frames) == 4 and all(f.shape == (96, 160, 3) and f.dtype == np.uint8 for f in frames)
    starts = [bar_columns(f)[0] for f in frames]
    assert starts == sorted(starts) and starts[0] == 0 and bar_columns(frames[-1])[-1] == 159
    assert all(len(bar_columns(f)) == 16 for f in frames)  # a tenth of the width


@pytest.mark.parametrize("bad", [{"width": 15}, {"height": 31}, {"fps": 0}, {"distinct_frames": 0}])
def test_bad_camera_options_are_refused(bad):
    with pytest.raises(ValueError):
        CameraOptions(**bad)


class FakeTime:
    def __init__(self) -> None:
        self.now = 100.0
        self.sleeps: list[float] = []

    def clock(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


async def test_the_track_paces_frames_by_absolute_deadlines_with_rtp_timestamps():
    options = CameraOptions(width=64, height=48, fps=15, distinct_frames=3)
    time = FakeTime()
    track = CameraTrack(options, clock=time.clock, sleep=time.sleep)
    frames = [await track.recv() for _ in range(4)]
    assert [f.pts for f in frames] == [0, 6000, 12000, 18000] and VIDEO_CLOCK_RATE // 15 == 6000
    assert all(f.time_base == VIDEO_TIME_BASE and f.format.name == "yuv420p" for f in frames)
    assert all((f.width, f.height) == (64, 48) for f in frames)
    assert time.sleeps == pytest.approx([1 / 15] * 3) and time.now == pytest.approx(100.2)
    # the pattern comes through the yuv420p conversion, cycling after distinct_frames
    rgb = [f.to_ndarray(format="rgb24") for f in frames]
    want = pattern_frames(options)
    for got, k in zip(rgb, (0, 1, 2, 0), strict=True):
        assert np.abs(got.astype(int) - want[k].astype(int)).mean() < 6
    # late: the next frame (4, due at t0 + 4/15) goes at once, the one after keeps the schedule (t0 + 5/15)
    time.now += 0.1
    await track.recv()
    assert len(time.sleeps) == 3
    await track.recv()
    assert time.now == pytest.approx(100.0 + 5 / 15)
    track.stop()
    with pytest.raises(MediaStreamError):
        await track.recv()


async def test_websocket_pictures_are_jpeg_items_the_server_decodes_within_the_camera_budget():
    options = CameraOptions(width=640, height=480, distinct_frames=2)
    pictures = CameraPictures(options)
    items = [pictures.next_item() for _ in range(3)]
    assert pictures.sent == 3 and items[0] == items[2] and items[0] != items[1]
    event = parse_client_event(json.dumps(items[0]))
    decoded = await decode_item(event, TINY_VISION, ImageLimits())
    (part,) = decoded.item.parts
    height, width = part.pixels.shape[:2]
    # shrunk to the camera budget before sending: the picture costs what one WebRTC frame pair does
    assert (height, width) == DEFAULT_CAMERA.frame_size(TINY_VISION, 480, 640)


class PictureLink:
    """A WebSocket-like link (no video track) that answers each committed turn with a reply counting the pictures
    it has seen as 117 image tokens each."""

    paced_audio = False
    output_rate = 24_000

    def __init__(self) -> None:
        self.sent: list[tuple[float, dict]] = []
        self.listener = None

    async def connect(self, listener) -> None:
        self.listener = listener
        self.t0 = asyncio.get_running_loop().time()
        audio = {"format": {"type": "audio/pcm", "rate": 24_000}}
        listener.on_event(self.t0, {"type": "session.created", "session": {"audio": {"input": audio, "output": audio}}})

    async def speak(self, pcm: np.ndarray) -> float:
        asyncio.get_running_loop().call_later(0.05, self._reply)
        return asyncio.get_running_loop().time()

    def _reply(self) -> None:
        at = asyncio.get_running_loop().time()
        rid = f"resp_{len(self.sent)}"
        self.listener.on_event(at, {"type": "response.created", "response": {"id": rid}})
        usage = {"input_token_details": {"image_tokens": 117 * len(self.sent)}}
        done = {"id": rid, "status": "completed", "usage": usage}
        asyncio.get_running_loop().call_later(
            0.05, self.listener.on_event, at, {"type": "response.done", "response": done}
        )

    async def send(self, event: dict) -> None:
        self.sent.append((asyncio.get_running_loop().time(), event))

    async def close(self) -> None:
        pass


async def test_a_websocket_user_with_a_camera_sends_a_picture_at_each_speech_start():
    from realtime.bench.client import (
        PICTURES_SENT,
        USAGE_IMAGE_TOKENS,
        USAGE_RESPONSES,
        ClientOptions,
        SimulatedUser,
        UserPlan,
    )
    from realtime.bench.speech import Speech

    speech = Speech("hi", np.zeros(2400, np.float32), speech_start_ms=20.0, speech_end_ms=80.0, bounds_from="manifest")
    link = PictureLink()
    options = ClientOptions(camera=CameraOptions(width=64, height=48, distinct_frames=2), turn_timeout_s=5)
    user = SimulatedUser(UserPlan(0, (speech, speech)), link, options)
    logs = await user.run()
    assert [event["item"]["content"][0]["type"] for _, event in link.sent] == ["input_image"] * 2
    for (at, _), log in zip(link.sent, logs, strict=True):
        assert at >= log.speech_start_at
    assert user.counts[PICTURES_SENT] == 2 and user.counts[USAGE_RESPONSES] == 2
    assert user.counts[USAGE_IMAGE_TOKENS] == 117 * (1 + 2)
