"""Reply audio encoded to Opus by the call's own track, for aiortc's pre-encoded send path.

An outgoing ``MediaStreamTrack`` that returns ``av.AudioFrame`` objects makes aiortc's ``RTCRtpSender`` compute
the frame's RFC 6465 audio level in a pure-Python loop over its samples and hand the frame to a thread pool to be
upmixed and encoded; both happen on every 20 ms frame, silence included. A track that returns ``av.Packet``
objects is only packetized. :class:`OpusPackets` makes those packets: mono Opus, one packet per 20 ms frame of
48 kHz audio, timestamped with the frame's pts. Silent frames, the bulk of a call, are not encoded: they are sent
as Opus's digital-silence packet (it decodes to exact zeros), once the encoder has been handed one silent frame
after the last audible one, so the lookahead the encoder still held is sent too. Audio levels are not sent (they
are an optional header extension).
"""

from __future__ import annotations

import fractions
from functools import cache

import av
import numpy as np

from realtime.media.audio import float_to_pcm16

TRACK_RATE = 48_000
"""Sample rate (Hz) of the Opus stream: the packets' timestamps count 48 kHz samples."""
FRAME_SAMPLES = 960
"""Samples per packet (20 ms)."""
BIT_RATE = 64_000
"""Bits per second of the encoded reply audio (mono speech; aiortc's own encoder uses 96 kbps for stereo)."""

_TIME_BASE = fractions.Fraction(1, TRACK_RATE)


def _new_encoder() -> av.AudioCodecContext:
    codec = av.AudioCodecContext.create("libopus", "w")
    codec.bit_rate = BIT_RATE
    codec.format = "s16"
    codec.layout = "mono"
    codec.sample_rate = TRACK_RATE
    codec.time_base = _TIME_BASE
    codec.options = {"application": "voip"}
    return codec


@cache
def silence_packet() -> bytes:
    """The Opus packet of 20 ms of digital silence, as libopus encodes it (a few bytes)."""
    codec = _new_encoder()
    packets: list[bytes] = []
    for pts in range(0, 3 * FRAME_SAMPLES, FRAME_SAMPLES):
        packets += [bytes(p) for p in codec.encode(_frame(np.zeros(FRAME_SAMPLES, dtype=np.int16), pts))]
    return packets[-1]


def _frame(pcm: np.ndarray, pts: int) -> av.AudioFrame:
    frame = av.AudioFrame.from_ndarray(pcm.reshape(1, -1), format="s16", layout="mono")
    frame.sample_rate = TRACK_RATE
    frame.pts = pts
    frame.time_base = _TIME_BASE
    return frame


class OpusPackets:
    """20 ms frames of the reply track (float32 mono 48 kHz, :data:`FRAME_SAMPLES` samples) → Opus packets.

    :meth:`packet` is called once per frame, in order, with the frame's pts (48 kHz samples since the track's first
    frame; a jump, where the track skipped ahead, is allowed). ``audible=False`` says the frame is silence. Not
    thread-safe: one track."""

    def __init__(self) -> None:
        self._codec = _new_encoder()
        self._silence = silence_packet()
        self._flushed = True
        """The encoder has seen a silent frame since its last audible one (its lookahead went out)."""
        self.encoded = 0
        """Frames run through the encoder so far (the rest went out as the silence packet)."""

    def packet(self, samples: np.ndarray, pts: int, *, audible: bool) -> av.Packet:
        if audible or not self._flushed:
            payload = self._encode(float_to_pcm16(samples), pts)
            self._flushed = not audible
        else:
            payload = self._silence
        packet = av.Packet(payload)
        packet.pts = pts
        packet.time_base = _TIME_BASE
        return packet

    def _encode(self, pcm: np.ndarray, pts: int) -> bytes:
        if len(pcm) != FRAME_SAMPLES:
            raise ValueError(f"an Opus frame is {FRAME_SAMPLES} samples, got {len(pcm)}")
        self.encoded += 1
        packets = self._codec.encode(_frame(pcm, pts))
        if len(packets) != 1:  # libopus emits one packet per 20 ms frame it is given
            raise RuntimeError(f"the Opus encoder returned {len(packets)} packets for one frame")
        return bytes(packets[0])
