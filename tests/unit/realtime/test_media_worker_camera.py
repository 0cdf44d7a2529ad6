"""A call's camera on a media worker (realtime.transports.media_workers.camera), without processes: the worker's
frames wait for the server behind a bounded lane (the oldest dropped and counted ``overflow`` when full) while the
microphone's audio goes out at once, and the server turns the worker's frames and counts into the session's frames and
the camera counters."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
from aiortc.mediastreams import AudioStreamTrack

from realtime.protocol.audio_format import AudioFormat
from realtime.protocol.names import Dialect
from realtime.runner import OpenMessage
from realtime.server.limits import SessionSlots
from realtime.transports.media_workers import messages as m
from realtime.transports.media_workers.camera import COUNTS_EVERY_S, CameraLane, CameraTally
from realtime.transports.media_workers.worker import Worker, WorkerCall
from realtime.transports.webrtc import WebRTCCalls
from realtime.transports.webrtc.camera import CallCameras
from realtime.transports.webrtc.worker_media import RemoteCall
from tests.fakes import TINY_VISION, FakeEngine

pytestmark = pytest.mark.timeout(30)


class _Wire:
    """What a worker or the server sends, recorded."""

    def __init__(self) -> None:
        self.sent: list[object] = []
        self.index = 0

    def send(self, message: object) -> None:
        self.sent.append(message)

    async def drain(self) -> None:
        pass


def frame(call: str, n: int, size: int = 1000) -> m.CameraFrame:
    """Call ``call``'s frame number ``n``, of ``size`` bytes."""
    return m.CameraFrame(call, np.full(size, n % 256, np.uint8), float(n))


def numbers(messages: list[object]) -> list[tuple[str, int]]:
    return [(f.call, int(f.at)) for f in messages if isinstance(f, m.CameraFrame)]


def test_frames_wait_beyond_the_bytes_in_flight_and_a_full_call_drops_its_oldest():
    sent: list[object] = []
    overflow: list[str] = []
    lane = CameraLane(sent.append, overflow.append, in_flight_bytes=2000, waiting_per_call=2)
    lane.put(frame("a", 1))
    lane.put(frame("a", 2))  # 1000 bytes in flight: room for one more
    lane.put(frame("a", 3))  # 2000 in flight: waits
    lane.put(frame("b", 1))
    lane.put(frame("a", 4))
    assert numbers(sent) == [("a", 1), ("a", 2)] and lane.in_flight == 2
    assert lane.waiting("a") == 2 and lane.waiting("b") == 1 and overflow == []
    lane.put(frame("a", 5))  # a third of a's waiting: its oldest (3) is dropped, b's frame is not
    assert overflow == ["a"] and lane.waiting("a") == 2 and lane.waiting() == 3
    lane.taken()  # the server read a1: one frame goes, the oldest waiting across calls
    assert numbers(sent)[2:] == [("b", 1)]
    lane.taken()
    lane.taken()
    assert numbers(sent)[3:] == [("a", 4), ("a", 5)] and lane.waiting() == 0 and lane.in_flight == 2
    lane.put(frame("b", 2))
    assert lane.forget("b") == 1 and lane.waiting() == 0  # an ended call's waiting frames are let go
    with pytest.raises(RuntimeError):
        CameraLane(sent.append, overflow.append).taken()


def test_a_frame_larger_than_the_bound_still_goes_when_nothing_is_in_flight():
    sent: list[object] = []
    lane = CameraLane(sent.append, lambda call: None, in_flight_bytes=100)
    lane.put(frame("a", 1, size=5000))
    lane.put(frame("a", 2, size=10))
    assert numbers(sent) == [("a", 1)]
    lane.taken()
    assert numbers(sent) == [("a", 1), ("a", 2)]


async def test_the_microphone_goes_out_ahead_of_waiting_frames_and_overflow_reaches_the_server():
    wire = _Wire()
    worker = Worker(wire, ())
    call = WorkerCall(worker, "rtc_m1", AudioFormat.PCM, vision=TINY_VISION)
    worker.calls[call.id] = call
    pixels = np.zeros((252, 364, 3), np.uint8)  # 275 kB: four fit the bytes in flight (1 MiB)
    try:
        for n in range(8):  # the server reads nothing meanwhile
            call._camera_frame(pixels, float(n))
        assert numbers(wire.sent) == [("rtc_m1", n) for n in range(4)] and worker.camera.waiting() == 2
        microphone = asyncio.ensure_future(call._microphone(AudioStreamTrack()))
        while not any(isinstance(message, m.MicAudio) for message in wire.sent):
            await asyncio.sleep(0.01)
        microphone.cancel()
        await asyncio.gather(microphone, return_exceptions=True)
        sent_before = len(wire.sent)
        worker.handle(m.CameraTaken())  # the server read one frame: the oldest waiting goes, after the audio
        assert numbers(wire.sent[sent_before:]) == [("rtc_m1", 6)]
        assert isinstance(wire.sent[4], m.MicAudio)  # the audio went out ahead of the frames that waited
        call.camera_outcomes.flush()
        assert wire.sent[-1] == m.CameraCounts("rtc_m1", (("overflow", 2),))  # frames 4 and 5
    finally:
        await call.pc.close()


def test_the_tally_reports_at_most_every_period_and_on_flush():
    sent: list[object] = []
    now = [0.0]
    tally = CameraTally("rtc_m1", sent.append, clock=lambda: now[0])
    for _ in range(3):
        tally.count("skipped")
    tally.count("invalid")
    assert sent == []
    now[0] = COUNTS_EVERY_S
    tally.count("skipped")
    assert sent == [m.CameraCounts("rtc_m1", (("invalid", 1), ("skipped", 4)))]
    tally.flush()
    tally.count("no_vision")
    tally.flush()
    assert sent[1:] == [m.CameraCounts("rtc_m1", (("no_vision", 1),))]


class _OpenHandle:
    def __init__(self) -> None:
        self.frames: list[tuple[tuple[int, ...], float]] = []

    def add_video_frame(self, frame: np.ndarray, t: float) -> None:
        self.frames.append((frame.shape, t))


async def test_the_server_hands_the_workers_frames_to_the_open_message_and_counts_every_outcome():
    engine = FakeEngine(vision=TINY_VISION)
    outcomes: list[str] = []
    local = WebRTCCalls(engine, turn_detector_factory=lambda: lambda params: None)
    slot = SessionSlots(1).try_acquire()
    assert slot is not None
    make_runner = await local.session_factory(Dialect.GA, slot)
    cameras = CallCameras(vision=TINY_VISION, on_frame=outcomes.append)
    call = RemoteCall(
        "rtc_m1", _Wire(), Dialect.GA, make_runner, gate=None, slot=slot, on_input_delay=None, cameras=cameras
    )
    pixels = np.zeros((252, 364, 3), np.uint8)
    call.receive(m.CameraFrame(call.id, pixels, 10.0))  # no message open: held
    call.receive(m.CameraFrame(call.id, pixels, 10.5))  # replaces it
    call.receive(m.CameraCounts(call.id, (("overflow", 2), ("skipped", 5))))
    assert sorted(outcomes) == ["idle", "overflow", "overflow", "skipped", "skipped", "skipped", "skipped", "skipped"]
    handle = _OpenHandle()
    message = OpenMessage("item_1", handle, started_at=10.2)
    call.runner.open_message = lambda: message  # the user starts speaking
    call.receive(m.CameraFrame(call.id, pixels, 11.0))
    assert handle.frames == [((252, 364, 3), pytest.approx(0.3)), ((252, 364, 3), pytest.approx(0.8))]
    assert outcomes.count("delivered") == 2
