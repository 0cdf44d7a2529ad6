"""A call's camera (realtime.media.video, realtime.media.message_frames): an aiortc peer sends a camera-like VP8 track
with speech; the spoken message gets sampled, downscaled frames and the reply's usage counts their image tokens, with
the call's media in the server's process or on media workers (the frames then cross from the worker). Against the
FakeEngine with a vision tower; loopback only, as test_webrtc.py."""

from __future__ import annotations

import asyncio
import fractions

import av
import numpy as np
import pytest
from aiortc import RTCSessionDescription, VideoStreamTrack

from pipeline.errors import UnsupportedInputError
from realtime.media.message_frames import MessageFrames
from realtime.media.video import CameraFeed
from realtime.media.video_settings import CameraSettings
from realtime.runner import OpenMessage
from realtime.transports.webrtc import WebRTCCalls
from realtime.transports.webrtc.worker_media import RemoteCall, WorkerCalls
from tests.fakes import TINY_VISION, FakeEngine
from tests.helpers.webrtc_peer import ClientPeer

pytestmark = pytest.mark.timeout(60)


class MovingPattern(VideoStreamTrack):
    """A 640x480 camera at 15 fps: a bright bar moving over a gradient."""

    def __init__(self) -> None:
        super().__init__()
        self.sent = 0

    async def recv(self) -> av.VideoFrame:
        pts, time_base = await self.next_timestamp()
        image = np.zeros((480, 640, 3), np.uint8)
        image[..., 0] = np.linspace(0, 255, 640, dtype=np.uint8)
        x = (self.sent * 16) % 600
        image[:, x : x + 40] = 255
        frame = av.VideoFrame.from_ndarray(image, format="rgb24")
        frame.pts, frame.time_base = pts, time_base
        self.sent += 1
        return frame


async def serving(engine, media_workers: int, **kwargs) -> WebRTCCalls | WorkerCalls:
    """The WebRTC endpoint over ``engine``, started, with its calls' media in this process (0) or on workers."""
    local = WebRTCCalls(engine, ice_host_addresses=("127.0.0.1",), **kwargs)
    calls = local if media_workers == 0 else WorkerCalls(local, media_workers)
    await calls.start()
    return calls


media_placements = pytest.mark.parametrize("media_workers", [0, 2], ids=["in-process", "2-media-workers"])


@pytest.mark.slow
@media_placements
async def test_camera_frames_reach_the_spoken_message_and_usage_counts_them(media_workers):
    engine = FakeEngine(vision=TINY_VISION)
    outcomes: list[str] = []
    calls = await serving(engine, media_workers, on_camera_frame=outcomes.append)
    client = ClientPeer()
    camera = MovingPattern()
    client.pc.addTrack(camera)
    try:
        await client.call(calls)
        (call,) = calls.calls()
        assert isinstance(call, RemoteCall) == (media_workers > 0)  # a camera call is placed as any other
        await asyncio.sleep(0.5)  # the camera runs before the user speaks: its latest frame is held
        client.say("capital_of_france")
        _, done = await client.wait_for("response.done")
    finally:
        await client.close()
        await calls.close()
    conversation = engine.conversations[0]
    (message,) = [handle for handle in conversation.inputs.values() if handle.state == "committed"]
    shapes = {shape for shape, _ in message.frames}
    times = [t for _, t in message.frames]
    # 640x480 under the default budget (128 x 28 x 28 pixels) -> 364x252 on the 28-pixel grid
    assert shapes == {(252, 364, 3)}
    assert CameraSettings().frame_size(TINY_VISION, 480, 640) == (252, 364)
    speech_s = message.samples / 16_000
    # about 2 frames a second of the message from its start (the frame held before it opened first), times never
    # decreasing
    assert 0.0 <= times[0] < 1.0 and times == sorted(times) and times[-1] <= speech_s + 0.5
    assert abs(len(times) - 2 * speech_s) <= 3, (len(times), speech_s)
    usage = done["response"]["usage"]
    assert usage["input_token_details"]["image_tokens"] == TINY_VISION.tokens(252, 364, len(times)) > 0
    assert outcomes.count("delivered") == len(times)
    assert outcomes.count("skipped") > outcomes.count("delivered")  # 15 fps sampled at 2
    assert "invalid" not in outcomes and "no_vision" not in outcomes


VP9_CAMERA = (
    "m=video 9 UDP/TLS/RTP/SAVPF 98\r\nc=IN IP4 0.0.0.0\r\na=mid:camera\r\na=sendonly\r\na=rtpmap:98 VP9/90000\r\n"
)
"""A camera offered in VP9 only, as the last media section of an offer (aiortc decodes VP8 and H.264)."""


@pytest.mark.slow
@media_placements
async def test_a_camera_in_a_codec_the_server_cannot_decode_is_refused_and_the_call_goes_on(media_workers):
    engine = FakeEngine(vision=TINY_VISION)
    outcomes: list[str] = []
    refused: list[str] = []
    calls = await serving(engine, media_workers, on_camera_frame=outcomes.append, on_camera_refused=refused.append)
    client = ClientPeer()
    try:
        # aiortc's peer cannot take an answer with a rejected section: the camera section goes to the server only,
        # and the client is given the answer without it (the section the server rejected, last as offered)
        answer = await calls.create_call(await client.offer() + VP9_CAMERA)
        (call,) = calls.calls()
        assert isinstance(call, RemoteCall) == (media_workers > 0)
        answered, video = answer.split("m=video")
        assert video.split()[:2] == ["0", "UDP/TLS/RTP/SAVPF"] and "a=mid:camera" in video and "a=inactive" in video
        assert refused == ["unsupported_codec"]
        await client.pc.setRemoteDescription(RTCSessionDescription(sdp=answered, type="answer"))
        client.say("capital_of_france")
        _, done = await client.wait_for("response.done")
    finally:
        await client.close()
        await calls.close()
    assert done["response"]["status"] == "completed"
    assert done["response"]["usage"]["input_token_details"]["image_tokens"] == 0
    assert outcomes == []  # no frame ever came


async def refusal_of_frames(engine) -> str | None:
    """Why ``engine`` takes no camera frames (None: it takes them): no vision tower, or a build whose spoken
    messages refuse video (``UnsupportedInputError``)."""
    if engine.vision is None:
        return "the engine has no vision (engine.vision is None)"
    conversation = engine.conversation()
    try:
        message = conversation.open_audio("probe")
        try:
            message.add_video_frame(np.zeros((56, 56, 3), np.uint8), 0.0)
        except UnsupportedInputError as exc:
            return f"the engine refuses camera frames in this build: {exc}"
        finally:
            await message.discard()
    finally:
        await conversation.close()
    return None


@pytest.mark.slow
@media_placements
async def test_on_the_tiny_engine_the_reply_counts_the_camera_frames_image_tokens(tiny_engine, media_workers):
    """The real engine on the tiny checkpoint: camera frames go into the spoken message and the reply's usage
    counts their image tokens."""
    reason = await refusal_of_frames(tiny_engine)
    if reason is not None:
        pytest.skip(reason)
    outcomes: list[str] = []
    calls = await serving(tiny_engine, media_workers, on_camera_frame=outcomes.append)
    client = ClientPeer()
    client.pc.addTrack(MovingPattern())
    try:
        await client.call(calls, session_overrides={"type": "realtime", "max_output_tokens": 8})
        (call,) = calls.calls()
        assert isinstance(call, RemoteCall) == (media_workers > 0)
        await asyncio.sleep(0.5)
        client.say("capital_of_france")
        _, done = await client.wait_for("response.done", timeout=40.0)
    finally:
        await client.close()
        await calls.close()
    assert done["response"]["status"] in ("completed", "incomplete")
    delivered = outcomes.count("delivered")
    assert delivered >= 2 and "invalid" not in outcomes, outcomes
    image_tokens = done["response"]["usage"]["input_token_details"]["image_tokens"]
    # 640x480 -> 364x252 under the default budget: (252/28) * (364/28) = 117 tokens a pair of frames at most
    assert 0 < image_tokens <= tiny_engine.vision.tokens(252, 364, delivered + 1)


# --- the sampling rules, without a network ------------------------------------------------------


class Messages:
    def __init__(self) -> None:
        self.open: OpenMessage | None = None

    def open_message(self) -> OpenMessage | None:
        return self.open


class Handle:
    def __init__(self) -> None:
        self.frames: list[tuple[tuple[int, ...], float]] = []

    def add_video_frame(self, frame: np.ndarray, t: float) -> None:
        self.frames.append((frame.shape, t))


def frame_at(seconds: float, width: int = 320, height: int = 240) -> av.VideoFrame:
    frame = av.VideoFrame(width, height, "yuv420p")
    frame.pts, frame.time_base = round(seconds * 90_000), fractions.Fraction(1, 90_000)
    return frame


def feed_of(messages: Messages, vision, counts: list[str]) -> CameraFeed:
    """The in-process media's camera: sampled frames into ``messages``, every outcome appended to ``counts``."""
    frames = MessageFrames(messages, count=counts.append)
    return CameraFeed(vision, CameraSettings(), kept=frames.offer, count=counts.append)


async def test_frames_while_no_message_is_open_keep_the_latest_for_the_next_message():
    messages, counts = Messages(), []
    feed = feed_of(messages, TINY_VISION, counts)
    for i in range(12):  # 30 fps for 0.4 s: one frame a 0.5 s period at most, so the first is taken
        await feed.offer(frame_at(i / 30), 100 + i / 30)
    await feed.offer(frame_at(0.6), 100.6)  # a second sampled frame replaces the held one (counted idle)
    assert counts.count("idle") == 1 and counts.count("skipped") == 11
    handle = Handle()
    messages.open = OpenMessage("item_1", handle, started_at=100.9)
    await feed.offer(frame_at(1.2), 101.2)
    # 320x240 is within the budget: only rounded to the 28-pixel grid (252x308)
    assert handle.frames == [((252, 308, 3), 0.0), ((252, 308, 3), pytest.approx(0.3))]
    messages.open = None  # committed: frames are held again
    await feed.offer(frame_at(1.8), 101.8)
    assert counts.count("delivered") == 2 and len(handle.frames) == 2


async def test_unusable_frames_and_a_blind_model_are_counted_drops():
    messages, counts = Messages(), []
    messages.open = OpenMessage("item_1", Handle(), started_at=0.0)
    feed = feed_of(messages, TINY_VISION, counts)
    bad = frame_at(0.0)
    bad.pts = None
    feed.convert = lambda frame: (_ for _ in ()).throw(ValueError("the frame is 0x0"))  # a corrupt frame
    await feed.offer(bad, 1.0)
    assert counts == ["invalid"]
    blind = feed_of(messages, None, counts)
    await blind.offer(frame_at(0.0), 1.0)
    assert counts == ["invalid", "no_vision"]
