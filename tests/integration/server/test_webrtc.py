"""WebRTC calls (realtime.transports.webrtc / .media) against an aiortc client peer, no browser.

Everything stays on loopback: both peers offer only 127.0.0.1 host candidates and use no STUN
server, so no packet leaves the machine (``scripts/run_browser_tests.sh`` also runs this file in a
loopback-only network namespace). The client plays the spoken fixtures on its microphone track
in real time, reads the ``oai-events`` channel and records the audio it receives. Each call test
takes a few seconds of real time (speech is paced like a microphone).
"""

from __future__ import annotations

import asyncio
import fractions

import av
import numpy as np
import pydantic
import pytest
from aiortc import RTCConfiguration, RTCPeerConnection
from aiortc.mediastreams import MediaStreamError

from realtime.errors import LimitExceeded, ProtocolError, RealtimeError
from realtime.media.audio import decode_audio
from realtime.protocol.audio_format import AudioFormat
from realtime.transports.media import (
    FRAME_SAMPLES,
    TRACK_RATE,
    MicrophoneEncoder,
    OutputAudioQueue,
    PacedAudioTrack,
    frame_to_mono,
)
from realtime.transports.webrtc import (
    CallStatus,
    IceHostAddress,
    WebRTCCalls,
    WebRTCUnavailable,
    announce_host_addresses,
)
from realtime.transports.webrtc.worker_media import WorkerCalls
from tests.fakes import FakeEngine, Script
from tests.helpers.webrtc_peer import LOOPBACK, ClientPeer, rms

pytestmark = [pytest.mark.timeout(60), pytest.mark.slow]


async def wait_until(predicate, timeout: float = 5.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not predicate():
        if loop.time() > deadline:
            raise AssertionError("condition not met in time")
        await asyncio.sleep(0.02)


@pytest.fixture
async def fake_calls():
    engine = FakeEngine()
    calls = WebRTCCalls(engine, ice_host_addresses=("127.0.0.1",))
    yield engine, calls
    await calls.close()


@pytest.fixture(params=[0, 2], ids=["in-process", "2-media-workers"])
async def media_calls(request):
    """The WebRTC endpoint with media in this process (0) or in two media worker processes."""
    engine = FakeEngine()
    local = WebRTCCalls(engine, ice_host_addresses=("127.0.0.1",))
    calls = local if request.param == 0 else WorkerCalls(local, request.param)
    await calls.start()
    yield engine, calls
    await calls.close()
    assert calls.live_calls == 0 and calls.open_peers == 0


@pytest.fixture
async def client():
    peer = ClientPeer()
    yield peer
    await peer.close()


# --- media pieces (no network) -------------------------------------------------------------------


def _tone(ms: int, rate: int = 24_000, amplitude: float = 0.3) -> np.ndarray:
    t = np.arange(rate * ms // 1000) / rate
    return (amplitude * np.sin(2 * np.pi * 440 * t)).astype(np.float32)


def test_output_queue_frames_plays_in_order_and_reports_ends():
    queue = OutputAudioQueue()
    idle = queue.next_frame()
    assert idle.samples.shape == (FRAME_SAMPLES,) and not idle.audible and not idle.samples.any()
    queue.play("r1", _tone(50))  # 50 ms at 24 kHz → 2400 samples at 48 kHz (after the tail flush)
    queue.play("r2", _tone(30))
    queue.end("r2")
    frames = [queue.next_frame() for _ in range(3)]
    assert all(f.audible for f in frames[:2]) and not any(f.finished for f in frames)  # r1 not ended: underrun
    queue.end("r1")
    out = [queue.next_frame() for _ in range(8)]
    finished = [rid for f in out for rid in f.finished]
    assert finished == ["r1", "r2"]
    total = np.concatenate([f.samples for f in frames + out])
    loud = np.count_nonzero(np.abs(total) > 0.05)  # |sin| > 1/6 for ~89% of a tone's samples
    assert 0.8 * (2400 + 1440) < loud <= 2400 + 1440
    assert queue.response_ids() == () and queue.queued_samples == 0


def test_output_queue_clear_drops_audio_without_finishing():
    queue = OutputAudioQueue()
    queue.play("r1", _tone(200))
    queue.end("r1")
    assert queue.played_ms("r1") == 0.0
    assert queue.next_frame().audible and queue.next_frame().audible
    assert queue.played_ms("r1") == 2 * 20.0
    queue.clear("r1")
    assert queue.played_ms("r1") is None
    frame = queue.next_frame()
    assert not frame.audible and frame.finished == () and not frame.samples.any()
    queue.end("unknown")  # a response without audio: ignored
    queue.clear("unknown")
    queue.play("r2", _tone(10))
    queue.end("r2")
    with pytest.raises(ValueError):
        queue.play("r2", _tone(10))  # audio after the end is a caller bug


def test_frame_to_mono_downmixes_packed_and_planar_frames():
    left = np.linspace(-0.5, 0.5, 960, dtype=np.float32)
    right = -0.25 * np.ones(960, dtype=np.float32)
    packed = np.stack([left, right], axis=1).reshape(1, -1)
    s16 = av.AudioFrame.from_ndarray(np.round(packed * 32768).astype(np.int16), format="s16", layout="stereo")
    s16.sample_rate = TRACK_RATE
    np.testing.assert_allclose(frame_to_mono(s16), (left + right) / 2, atol=1e-4)
    planar = av.AudioFrame.from_ndarray(np.stack([left, right]), format="fltp", layout="stereo")
    np.testing.assert_allclose(frame_to_mono(planar), (left + right) / 2, atol=1e-6)


def test_microphone_encoder_resamples_to_the_session_format():
    encoder = MicrophoneEncoder()
    tone48 = _tone(1000, rate=TRACK_RATE)
    pcm = b"".join(encoder.encode(tone48[i : i + 960], TRACK_RATE, AudioFormat.PCM) for i in range(0, 48_000, 960))
    decoded = decode_audio(pcm, AudioFormat.PCM)
    assert 24_000 - 1200 <= len(decoded) <= 24_000  # soxr holds back a few ms
    assert abs(rms(decoded[2400:]) - rms(tone48)) < 0.01
    ulaw = encoder.encode(tone48[:9600], TRACK_RATE, AudioFormat.PCMU)  # format switched: 8 kHz bytes
    assert 0 < len(ulaw) <= 1600


async def test_paced_track_keeps_real_time_and_reports_the_last_frame():
    queue = OutputAudioQueue()
    finished: list[str] = []
    track = PacedAudioTrack(queue, finished.append)
    queue.play("r1", _tone(60))
    queue.end("r1")
    loop = asyncio.get_running_loop()
    start = loop.time()
    frames = [await track.recv() for _ in range(6)]
    elapsed = loop.time() - start
    assert [f.pts for f in frames] == [i * FRAME_SAMPLES for i in range(6)]
    assert frames[0].time_base == fractions.Fraction(1, TRACK_RATE) and frames[0].sample_rate == TRACK_RATE
    assert 0.09 <= elapsed < 0.3  # 5 frame periods after the first
    assert finished == ["r1"] and track.audible_frames_sent == 3
    track.stop()
    with pytest.raises(MediaStreamError):
        await track.recv()


def test_ice_host_address_parsing():
    assert IceHostAddress.parse("127.0.0.1") == IceHostAddress("127.0.0.1", "127.0.0.1")
    assert IceHostAddress.parse("203.0.113.7@10.0.0.5") == IceHostAddress(bind="10.0.0.5", announce="203.0.113.7")
    for bad in ("localhost", "1.2.3.4@::1", "1.2.3.4@"):
        with pytest.raises(ValueError):
            IceHostAddress.parse(bad)
    with pytest.raises(ValueError):
        WebRTCCalls(FakeEngine(), ice_host_addresses=("not-an-ip",))


# --- calls ---------------------------------------------------------------------------------------


def _candidates(sdp: str) -> list[list[str]]:
    return [line.split()[4:8] for line in sdp.splitlines() if line.startswith("a=candidate:")]


async def test_answer_offers_only_the_configured_host_candidates(media_calls, client):
    _, calls = media_calls
    answer = await client.call(calls)
    found = _candidates(answer)
    assert found and all(c[0] == "127.0.0.1" and c[2:] == ["typ", "host"] for c in found), found
    assert "a=end-of-candidates" in answer  # gathered before answering: aiortc cannot trickle


async def test_announced_address_differs_from_the_bound_one(client):
    calls = WebRTCCalls(FakeEngine(), ice_host_addresses=("127.0.0.1@0.0.0.0",))
    try:
        answer = await client.call(calls)
        assert {c[0] for c in _candidates(answer)} == {"127.0.0.1"}
        await client.wait_for("session.created")  # connected through the wildcard-bound socket
    finally:
        await calls.close()


async def test_spoken_turn_round_trip(family_engine, client):
    """Real model (the tiny one of each family) and server VAD: the microphone's question is detected, answered, and
    the answer's audio arrives on the remote track while the data channel narrates it."""
    calls = WebRTCCalls(family_engine, ice_host_addresses=("127.0.0.1",))
    try:
        # A short reply: the random model would otherwise write ~350 tokens of noise.
        await client.call(calls, session_overrides={"type": "realtime", "max_output_tokens": 8})
        client.say("capital_of_france")
        await client.wait_for("session.created")
        assert client.types()[0] == "session.created"
        await client.wait_for("input_audio_buffer.speech_started")
        await client.wait_for("input_audio_buffer.speech_stopped")
        _, committed = await client.wait_for("input_audio_buffer.committed")
        await client.wait_for("response.created")
        started_at, started = await client.wait_for("output_audio_buffer.started")
        _, done = await client.wait_for("response.done")
        stopped_at, stopped = await client.wait_for("output_audio_buffer.stopped")
        # A random model may run into the talker's token cap ("incomplete"); either way it spoke.
        assert done["response"]["status"] in ("completed", "incomplete")
        assert started["response_id"] == stopped["response_id"] == done["response"]["id"]
        assert "response.output_audio.delta" not in client.types()  # audio goes on the track
        assert "response.output_audio_transcript.done" in client.types()
        reply = client.received(started_at, stopped_at + 0.3)
        assert rms(reply) > 0.01, rms(reply)
        (call,) = calls.calls()
        assert call.status is CallStatus.CONNECTED and call.microphone_frames > 100
        assert call.track.audible_frames_sent > 10
        # the reply went out as the track's own Opus packets (the client heard it above); silence was not encoded
        opus = call.track.opus
        assert opus is not None and call.track.audible_frames_sent <= opus.encoded < call.track.frames_sent
    finally:
        await calls.close()


async def test_barge_in_cancels_the_reply_and_clears_output(media_calls, client):
    engine, calls = media_calls
    # A reply still being generated when the user talks over it, then a short one.
    engine.script(Script(text=("word",) * 60, audio_chunks=60, chunk_ms=100, delay_s=0.05), Script())
    await client.call(calls)
    client.say("capital_of_france")
    _, first = await client.wait_for("response.created")
    _, added = await client.wait_for("response.output_item.added")
    await client.wait_for("output_audio_buffer.started")
    client.say("short_joke")
    await client.wait_for("input_audio_buffer.speech_started")
    cleared_at, cleared = await client.wait_for("output_audio_buffer.cleared")
    # The model's context keeps only what went out before the interruption: the truncation reaches the session before
    # anything the user said after it, so before the interrupting turn's reply starts (with media workers it may
    # follow the cancelled reply's response.done: how much was played comes back from the worker).
    _, truncated = await client.wait_for("conversation.item.truncated")
    _, second_created = await client.wait_for("response.created")
    events = [event for _, event in client.events]
    assert events.index(truncated) < events.index(second_created)
    (done,) = [e for e in events if e["type"] == "response.done" and e["response"]["id"] == first["response"]["id"]]
    assert cleared["response_id"] == first["response"]["id"] != second_created["response"]["id"]
    assert done["response"]["status"] == "cancelled"
    assert done["response"]["status_details"]["reason"] == "turn_detected"
    assert engine.conversations[0].responses[0].cancel_reason == "turn_detected"
    assert truncated["item_id"] == added["item"]["id"] and 0 < truncated["audio_end_ms"] < 6000
    await asyncio.sleep(0.6)
    engine_calls = engine.conversations[0].calls
    replies = [i for i, call in enumerate(engine_calls) if call[0] == "respond"]
    assert len(replies) == 2  # the second reply was generated from the truncated conversation
    assert replies[0] < engine_calls.index(("truncate", truncated["item_id"], truncated["audio_end_ms"])) < replies[1]
    assert rms(client.received(cleared_at - 0.5, cleared_at)) > 0.01  # it was playing
    assert rms(client.received(cleared_at + 0.3, cleared_at + 0.6)) < 0.002  # and stopped at once
    _, second = await client.wait_for("response.done")  # the interrupting turn gets its answer
    assert second["response"]["status"] == "completed"


async def test_client_clear_stops_playback_of_a_finished_reply(fake_calls, client):
    engine, calls = fake_calls
    engine.script(Script(audio_chunks=100, chunk_ms=40))  # 4 s of audio, generated at once
    await client.call(calls)
    client.say("weather_today")
    _, done = await client.wait_for("response.done")
    await asyncio.sleep(0.4)
    client.send({"type": "output_audio_buffer.clear"})
    cleared_at, cleared = await client.wait_for("output_audio_buffer.cleared")
    assert cleared["response_id"] == done["response"]["id"]
    _, truncated = await client.wait_for("conversation.item.truncated")
    assert truncated["item_id"] == done["response"]["output"][0]["id"]
    assert 300 < truncated["audio_end_ms"] < 4000  # played ~0.4 s of the 4 s
    await asyncio.sleep(0.7)
    assert rms(client.received(cleared_at + 0.3, cleared_at + 0.7)) < 0.002
    assert "output_audio_buffer.stopped" not in client.types()
    (call,) = calls.calls()
    assert call.output.response_ids() == ()


async def test_output_audio_buffer_events_bracket_the_played_reply(media_calls, client):
    """``output_audio_buffer.started`` when the reply's audio starts playing, ``.stopped`` once the track has played
    its last frame (after ``response.done``); every data-channel event validates with the openai SDK's models."""
    realtime_types = pytest.importorskip("openai.types.realtime")
    adapter = pydantic.TypeAdapter(realtime_types.RealtimeServerEvent)
    engine, calls = media_calls
    engine.script(Script(audio_chunks=10, chunk_ms=40))  # 0.4 s of audio
    await client.call(calls)
    client.say("weather_today")
    started_at, started = await client.wait_for("output_audio_buffer.started")
    _, done = await client.wait_for("response.done")
    stopped_at, stopped = await client.wait_for("output_audio_buffer.stopped")
    assert started["response_id"] == stopped["response_id"] == done["response"]["id"]
    assert stopped_at - started_at >= 0.3  # played in real time
    for _, event in client.events:
        adapter.validate_python(event)


class RecordingObserver:
    def __init__(self) -> None:
        self.events: list[str] = []
        self.closed = False

    def __call__(self, event: dict) -> None:
        self.events.append(event["type"])

    def close(self) -> None:
        self.closed = True


async def test_peer_is_released_when_the_client_leaves(client):
    engine = FakeEngine()
    observers: list[RecordingObserver] = []

    def observe() -> RecordingObserver:
        observers.append(RecordingObserver())
        return observers[-1]

    calls = WebRTCCalls(engine, ice_host_addresses=("127.0.0.1",), session_observer=observe)
    await client.call(calls)
    await client.wait_for("session.created")
    (call,) = calls.calls()
    await client.close()
    await wait_until(lambda: calls.live_calls == 0)
    assert call.status is CallStatus.CLOSED and call.pc.connectionState == "closed"
    assert not call.tasks and call.track.readyState == "ended"
    assert engine.conversations[0].closed
    assert calls.calls_started == calls.calls_ended == 1
    (observer,) = observers
    assert observer.events[0] == "session.created" and observer.closed
    await calls.close()


async def test_close_ends_every_call_and_refuses_new_ones(client):
    engine = FakeEngine()
    calls = WebRTCCalls(engine, ice_host_addresses=("127.0.0.1",))
    await client.call(calls)
    await client.wait_for("session.created")
    await calls.close()
    assert calls.live_calls == 0 and engine.conversations[0].closed
    await wait_until(lambda: client.channel.readyState == "closed")
    with pytest.raises(WebRTCUnavailable):
        await calls.create_call(await ClientPeer().offer())


async def test_a_call_that_never_connects_is_dropped(fake_calls):
    engine, _ = fake_calls
    calls = WebRTCCalls(engine, ice_host_addresses=("127.0.0.1",), connect_timeout_s=0.3)
    silent = ClientPeer()
    try:
        await calls.create_call(await silent.offer())  # the answer is never applied
        assert calls.live_calls == 1
        await wait_until(lambda: calls.live_calls == 0, timeout=3.0)
        assert engine.conversations[0].closed
    finally:
        await silent.close()
        await calls.close()


async def test_bad_offers_and_limits_are_refused(fake_calls):
    engine, _ = fake_calls
    calls = WebRTCCalls(engine, ice_host_addresses=("127.0.0.1",), max_calls=1)
    peers = [ClientPeer() for _ in range(2)]
    try:
        with pytest.raises(RealtimeError) as exc:
            await calls.create_call("hello")
        assert exc.value.param == "sdp"
        no_channel = RTCPeerConnection(RTCConfiguration(iceServers=[]))
        no_channel.addTransceiver("audio")
        await announce_host_addresses(no_channel, [LOOPBACK])
        await no_channel.setLocalDescription(await no_channel.createOffer())
        with pytest.raises(RealtimeError, match="data channel"):
            await calls.create_call(no_channel.localDescription.sdp)
        await no_channel.close()
        with pytest.raises(ProtocolError) as exc:
            await calls.create_call(await peers[0].offer(), session_overrides={"bogus": 1})
        assert exc.value.param == "session.bogus"
        assert calls.live_calls == 0
        await calls.create_call(await peers[0].offer())
        with pytest.raises(LimitExceeded):
            await calls.create_call(await peers[1].offer())
    finally:
        for peer in peers:
            await peer.close()
        await calls.close()
    assert calls.live_calls == 0


async def test_session_overrides_apply_before_anything_else(media_calls, client):
    _, calls = media_calls
    await client.call(calls, session_overrides={"type": "realtime", "instructions": "Be brief."})
    await client.wait_for("session.created")
    _, updated = await client.wait_for("session.updated")
    assert updated["session"]["instructions"] == "Be brief."
