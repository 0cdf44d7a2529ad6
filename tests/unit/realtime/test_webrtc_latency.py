"""What a WebRTC call's audio waits for on its way: the receive buffers (server microphone, the bench's simulated
browser), the microphone's downsampling, and how the bench stamps its own microphone."""

from __future__ import annotations

import os

import numpy as np
import pytest
from aiortc import RTCConfiguration, RTCPeerConnection
from aiortc.rtp import RtpPacket

from realtime.bench.cli import build_parser, resolve_options, server_config
from realtime.bench.client import BROWSER_HOLD_PACKETS, FRAME_MS, WebRTCLink, _TimedMicQueue
from realtime.config import ServerConfig
from realtime.media.audio import StreamResampler, decode_audio
from realtime.protocol.audio_format import AudioFormat
from realtime.transports.decimator import Decimator
from realtime.transports.media import MicrophoneEncoder, OutputAudioQueue, PacedAudioTrack
from realtime.transports.peer import accept_offer
from realtime.transports.receive_buffer import SERVER_AUDIO_HOLD_PACKETS, InOrderAudioBuffer, audio_buffer
from realtime.transports.webrtc import IceHostAddress, announce_host_addresses

PACKET = 960  # 20 ms of 48 kHz audio: one Opus packet


def _packets_until_release(buffer) -> int:
    """Feed a steady stream of one-packet audio frames; how many packets after the first arrived when the first
    was released."""
    for sequence in range(16):
        packet = RtpPacket(payload_type=111, sequence_number=sequence, timestamp=sequence * PACKET)
        packet._data = bytes([sequence])  # what the receiver sets after depayloading
        _, frame = buffer.add(packet)
        if frame is not None:
            assert frame.timestamp == 0 and frame.data == bytes([0])
            return sequence
    raise AssertionError("the first packet was never released")


def _audio_receive_buffer(pc: RTCPeerConnection):
    (receiver,) = [t.receiver for t in pc.getTransceivers() if t.kind == "audio"]
    return receiver._RTCRtpReceiver__jitter_buffer


@pytest.mark.parametrize("packets", [0, 1, 2, 3])
def test_audio_buffer_releases_a_packet_once_that_many_later_packets_arrived(packets):
    assert _packets_until_release(audio_buffer(packets)) == packets
    with pytest.raises(ValueError):
        audio_buffer(-1)
    with pytest.raises(ValueError):
        audio_buffer(16)


def _packet(sequence: int) -> RtpPacket:
    packet = RtpPacket(payload_type=111, sequence_number=sequence % 65536, timestamp=sequence * PACKET % 2**32)
    packet._data = bytes([sequence % 256])
    return packet


def test_the_in_order_buffer_releases_at_once_skips_gaps_drops_late_packets_and_follows_a_restart():
    buffer = InOrderAudioBuffer()
    released = []
    # in order across the 16-bit wrap; 65538 missing (lost); 65537 after 65539 (late); then a restarted sequence
    for sequence in (65533, 65534, 65535, 65536, 65537, 65539, 65538, 65540, 30000, 30001):
        pli, frame = buffer.add(_packet(sequence))
        assert pli is False
        released.append(None if frame is None else (frame.data[0], frame.timestamp))
    want = [(s % 256, s * PACKET % 2**32) for s in (65533, 65534, 65535, 65536, 65537, 65539)]
    want += [None] + [(s % 256, s * PACKET % 2**32) for s in (65540, 30000, 30001)]
    assert released == want
    assert (buffer.lost, buffer.late) == (1, 1)


async def test_the_server_holds_the_microphone_no_packet_not_four():
    browser = RTCPeerConnection(RTCConfiguration(iceServers=[]))
    server = RTCPeerConnection(RTCConfiguration(iceServers=[]))
    try:
        browser.addTrack(PacedAudioTrack(OutputAudioQueue(), lambda _name: None))
        browser.createDataChannel("oai-events")
        await announce_host_addresses(browser, [IceHostAddress.parse("127.0.0.1")])
        await browser.setLocalDescription(await browser.createOffer())
        await accept_offer(server, browser.localDescription.sdp)
        assert _packets_until_release(_audio_receive_buffer(server)) == SERVER_AUDIO_HOLD_PACKETS == 0
    finally:
        await browser.close()
        await server.close()


class _Listener:
    def on_event(self, at, event) -> None: ...

    def on_audio(self, at, samples, response_id) -> None: ...


async def test_the_bench_browser_holds_replies_40_ms_not_aiortcs_80():
    pc = WebRTCLink("http://127.0.0.1:9")._peer(_Listener())
    try:
        assert _packets_until_release(_audio_receive_buffer(pc)) == BROWSER_HOLD_PACKETS == 2
    finally:
        await pc.close()


async def test_the_bench_microphone_stamps_when_the_first_frame_was_captured():
    """A frame leaves once it is all captured (as over the WebSocket): its first sample is a frame older."""
    now = [10.0]
    mic = _TimedMicQueue(lambda: now[0])
    mic.play("u1", np.full(2400, 0.5, dtype=np.float32))
    mic.end("u1")
    assert mic.next_frame().audible
    assert await mic.started("u1") == pytest.approx(10.0 - FRAME_MS / 1000)


def test_bench_server_runs_serves_media_worker_default():
    options = resolve_options(build_parser().parse_args(["--transport", "webrtc", "--quick"]))
    assert server_config(options).media_workers is ServerConfig().media_workers is None
    chosen = resolve_options(build_parser().parse_args(["--transport", "webrtc", "--quick", "--media-workers", "0"]))
    assert server_config(chosen).media_workers == 0
    chosen = resolve_options(build_parser().parse_args(["--transport", "webrtc", "--quick", "--media-workers", "2"]))
    assert server_config(chosen).media_workers == 2


@pytest.mark.parametrize(("cores", "workers"), [(1, 0), (2, 0), (3, 0), (4, 2), (9, 4), (16, 8), (64, 8)])
def test_the_default_media_workers_take_half_the_cores(monkeypatch, cores, workers):
    """Half the cores this process may run on, at most 8; none where there is no spare core to spread media over."""
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(cores)), raising=False)
    assert ServerConfig().media_worker_count == workers
    assert ServerConfig(media_workers=0).media_worker_count == 0
    assert ServerConfig(media_workers=3).media_worker_count == 3


# --- the microphone's downsampling ---------------------------------------------------------------


def _tone(hz: float, seconds: float, rate: int) -> np.ndarray:
    return (0.5 * np.sin(2 * np.pi * hz * np.arange(int(seconds * rate)) / rate)).astype(np.float32)


def test_decimator_is_the_same_whatever_the_chunks():
    rng = np.random.default_rng(0)
    signal = rng.standard_normal(4801).astype(np.float32)
    whole = Decimator(3).process(signal)
    streaming = Decimator(3)
    cuts = [0, 1, 2, 7, 960, 961, 3000, 4801]
    parts = np.concatenate([streaming.process(signal[a:b]) for a, b in zip(cuts, cuts[1:], strict=False)])
    assert len(whole) == len(parts) == 1601  # samples 0, 3, ..., 4800
    np.testing.assert_allclose(parts, whole, atol=1e-5)


@pytest.mark.parametrize("factor", [2, 6])
def test_decimator_passes_speech_and_stops_what_would_fold_back(factor):
    in_rate = 48_000
    out_rate = in_rate // factor
    voice = Decimator(factor).process(_tone(0.3 * out_rate / 2, 0.5, in_rate))
    folded = Decimator(factor).process(_tone(0.6 * out_rate, 0.5, in_rate))  # above the output's Nyquist
    settled = slice(Decimator(factor).delay_samples, None)
    assert np.sqrt(np.mean(voice[settled] ** 2)) == pytest.approx(0.5 / np.sqrt(2), rel=0.01)
    assert np.max(np.abs(folded[settled])) < 1e-3  # < -54 dB; the filter gives about -80


def test_microphone_encoder_hands_each_48khz_frame_on_whole():
    """A 20 ms frame's samples reach the session with that frame (soxr would hold ~20 ms back), and a sound's onset
    is delayed by well under a millisecond."""
    frames = np.zeros(48_000, dtype=np.float32)
    frames[24_000:] = 0.5  # a step half-way through
    encoder = MicrophoneEncoder()
    chunks = [encoder.encode(frames[i : i + PACKET], 48_000, AudioFormat.PCM) for i in range(0, 48_000, PACKET)]
    assert all(len(c) == 2 * 480 for c in chunks)
    out = decode_audio(b"".join(chunks), AudioFormat.PCM)
    onset = int(np.argmax(out > 0.25))
    assert 12_000 <= onset < 12_000 + 24  # < 1 ms at 24 kHz
    soxr = StreamResampler(48_000, 24_000)
    held_back = 24_000 - sum(len(soxr.process(frames[i : i + PACKET])) for i in range(0, 48_000, PACKET))
    assert held_back > 0  # what the decimator saves (measured ~5 to 40 ms, ~20 on average)
