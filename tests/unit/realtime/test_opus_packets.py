"""The reply track's own Opus packets (realtime.transports.opus_packets), decoded by aiortc's Opus decoder as a
peer would."""

from __future__ import annotations

import asyncio

import av
import numpy as np
import pytest
from aiortc.codecs.opus import OpusDecoder
from aiortc.jitterbuffer import JitterFrame

from realtime.transports.media import FRAME_SAMPLES, OutputAudioQueue, PacedAudioTrack
from realtime.transports.opus_packets import OpusPackets, silence_packet


def _decode(packets: list[av.Packet]) -> np.ndarray:
    """The mono float signal a peer hears (aiortc decodes to s16 stereo)."""
    decoder = OpusDecoder()
    out = []
    for packet in packets:
        (frame,) = decoder.decode(JitterFrame(bytes(packet), int(packet.pts)))
        out.append(frame.to_ndarray().reshape(-1, 2)[:, 0].astype(np.float32) / 32768)
    return np.concatenate(out)


def _tone(frames: int) -> np.ndarray:
    t = np.arange(frames * FRAME_SAMPLES) / 48_000
    return (0.3 * np.sin(2 * np.pi * 440 * t)).astype(np.float32)


def test_silence_is_not_encoded_and_decodes_to_zeros():
    opus = OpusPackets()
    packets = [opus.packet(np.zeros(FRAME_SAMPLES, np.float32), k * FRAME_SAMPLES, audible=False) for k in range(5)]
    assert opus.encoded == 0
    assert all(bytes(p) == silence_packet() for p in packets)
    assert [p.pts for p in packets] == [k * FRAME_SAMPLES for k in range(5)]
    assert np.abs(_decode(packets)).max() == 0.0


def test_audible_frames_are_encoded_then_one_silent_frame_flushes_the_encoder():
    opus = OpusPackets()
    tone = _tone(10)
    packets = [opus.packet(f, k * FRAME_SAMPLES, audible=True) for k, f in enumerate(tone.reshape(10, -1))]
    silent = np.zeros(FRAME_SAMPLES, np.float32)
    packets += [opus.packet(silent, (10 + k) * FRAME_SAMPLES, audible=False) for k in range(3)]
    assert opus.encoded == 11  # the ten audible frames and the first silent one (the encoder's lookahead)
    assert [bytes(p) == silence_packet() for p in packets[10:]] == [False, True, True]
    heard = _decode(packets)
    # the codec's delay (a few ms) shifts the tone: compare energies, not samples
    rms = float(np.sqrt(np.mean(heard[2 * FRAME_SAMPLES : 10 * FRAME_SAMPLES] ** 2)))
    assert rms == pytest.approx(0.3 / np.sqrt(2), rel=0.1)
    assert np.abs(heard[12 * FRAME_SAMPLES :]).max() == 0.0


def test_a_frame_of_the_wrong_size_is_refused():
    with pytest.raises(ValueError, match="960 samples"):
        OpusPackets().packet(np.ones(480, np.float32), 0, audible=True)


def test_the_track_returns_packets_after_send_opus():
    queue = OutputAudioQueue()
    track = PacedAudioTrack(queue, on_finished=lambda rid: None)

    async def two_frames():
        first = await track.recv()  # frames: before send_opus
        track.send_opus()
        queue.play("r1", _tone(2)[::2].copy())  # 24 kHz engine audio
        return first, await track.recv()

    first, second = asyncio.run(two_frames())
    assert isinstance(first, av.AudioFrame)
    assert isinstance(second, av.Packet) and second.pts == FRAME_SAMPLES
    assert track.opus is not None and track.opus.encoded == 1
