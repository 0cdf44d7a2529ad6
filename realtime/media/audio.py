"""Wire audio formats of the OpenAI Realtime API: codecs, resampling and the two streaming pipelines.

Pure numpy + soxr, no I/O. Conventions used throughout:

- *float audio* is a 1-D ``float32`` array, nominal range [-1, 1], mono;
- *pcm16* is signed 16-bit little-endian; ``int16`` value ``v`` is float ``v / 32768``;
- G.711 payloads are one byte per sample at 8 kHz (µ-law for ``audio/pcmu``, A-law for ``audio/pcma``).

The session layer uses :class:`InputDecoder` (client bytes → 16 kHz float for the VAD and the model)
and :class:`OutputEncoder` (engine 24 kHz float → client bytes). Both are streaming: they keep
resampler state between calls, and ``flush()`` drains it at the end of a turn or response.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Protocol

import numpy as np
import soxr

from realtime.errors import InvalidAudioData
from realtime.protocol.audio_format import AudioFormat

MODEL_INPUT_RATE = 16_000
"""Sample rate (Hz) the thinker's audio encoder and the VAD consume."""

ENGINE_OUTPUT_RATE = 24_000
"""Sample rate (Hz) of the waveform token2wav produces."""

_PCM16_SCALE = 32768.0


# --- pcm16 <-> float ------------------------------------------------------------------------------


def pcm16_to_float(pcm: np.ndarray) -> np.ndarray:
    """int16 samples → float32 in [-1, 1)."""
    return (np.asarray(pcm, dtype=np.int16).astype(np.float32)) / np.float32(_PCM16_SCALE)


def float_to_pcm16(samples: np.ndarray) -> np.ndarray:
    """float samples → int16: scaled by 32768, rounded to nearest, clipped to the int16 range.

    NaN is not audio: it raises ``ValueError`` (a bug upstream, not a client's fault) rather than
    turning into an arbitrary click."""
    x = np.asarray(samples, dtype=np.float32)
    if np.isnan(x).any():
        raise ValueError("audio samples contain NaN")
    scaled = np.rint(x.astype(np.float64) * _PCM16_SCALE)
    return np.clip(scaled, -32768, 32767).astype(np.int16)


def decode_pcm16(data: bytes) -> np.ndarray:
    """Little-endian pcm16 bytes → int16 samples. An odd byte count raises ``InvalidAudioData``."""
    if len(data) % 2:
        raise InvalidAudioData(
            f"pcm16 audio must have an even number of bytes (2 per sample), got {len(data)} bytes",
            param="audio",
        )
    return np.frombuffer(data, dtype="<i2").astype(np.int16)


def encode_pcm16(pcm: np.ndarray) -> bytes:
    """int16 samples → little-endian pcm16 bytes."""
    return np.asarray(pcm, dtype=np.int16).astype("<i2").tobytes()


# --- G.711 ----------------------------------------------------------------------------------------
# Decoders follow ITU-T G.711 tables 1a/2a scaled to 16 bits; encoders quantize the way the ITU
# reference coder does (µ-law on 14 bits, A-law on 13). Both directions are lookup tables built once
# (256 entries to decode, 65536 to encode), so a whole chunk converts with one vectorized index.

_ULAW_BIAS = 132  # 0x84: makes the segment of a magnitude the position of its leading bit
_ALAW_TOGGLE = 0x55  # G.711 A-law inverts the even bits on the line


def _ulaw_decode_one(code: int) -> int:
    c = ~code & 0xFF
    exponent, mantissa = (c >> 4) & 0x07, c & 0x0F
    magnitude = (((mantissa << 3) + _ULAW_BIAS) << exponent) - _ULAW_BIAS
    return -magnitude if c & 0x80 else magnitude


def _alaw_decode_one(code: int) -> int:
    c = code ^ _ALAW_TOGGLE
    exponent, mantissa = (c >> 4) & 0x07, c & 0x0F
    if exponent == 0:
        magnitude = (mantissa << 4) + 8
    else:
        magnitude = ((mantissa << 4) + 0x108) << (exponent - 1)
    return magnitude if c & 0x80 else -magnitude


def _segment(magnitude: np.ndarray, first_bit: int) -> np.ndarray:
    """Segment number 0…7: how far the leading bit of ``magnitude`` sits above ``first_bit``."""
    top = np.floor(np.log2(np.maximum(magnitude, 1))).astype(np.int64)
    return np.clip(top - first_bit, 0, 7)


def _ulaw_encode_values(x: np.ndarray) -> np.ndarray:
    # G.711 µ-law quantizes 14-bit samples: drop the 2 low bits first (arithmetic shift, as the
    # ITU reference coder does, so negative values round toward -inf), then bias by 33 (132 / 4).
    v = x >> 2
    sign = np.where(v < 0, 0x80, 0x00)
    magnitude = np.minimum(np.abs(v) + _ULAW_BIAS // 4, 0x1FFF)  # clip into segment 7
    exponent = _segment(magnitude, 5)
    mantissa = (magnitude >> (exponent + 1)) & 0x0F
    return (~(sign | (exponent << 4) | mantissa) & 0xFF).astype(np.uint8)


def _alaw_encode_values(x: np.ndarray) -> np.ndarray:
    # G.711 A-law quantizes 13-bit samples; negative values use their ones' complement magnitude.
    v = x >> 3
    sign = np.where(v >= 0, 0x80, 0x00)
    magnitude = np.where(v >= 0, v, -v - 1)  # 0 … 4095
    exponent = _segment(magnitude, 4)
    mantissa = (magnitude >> np.maximum(exponent, 1)) & 0x0F
    return ((sign | (exponent << 4) | mantissa) ^ _ALAW_TOGGLE).astype(np.uint8)


@functools.cache
def _tables() -> dict[str, np.ndarray]:
    every_int16 = np.arange(-32768, 32768, dtype=np.int64)
    return {
        "ulaw_dec": np.array([_ulaw_decode_one(c) for c in range(256)], dtype=np.int16),
        "alaw_dec": np.array([_alaw_decode_one(c) for c in range(256)], dtype=np.int16),
        # indexed by int16 value + 32768
        "ulaw_enc": _ulaw_encode_values(every_int16),
        "alaw_enc": _alaw_encode_values(every_int16),
    }


def ulaw_encode(pcm: np.ndarray) -> np.ndarray:
    """int16 samples → G.711 µ-law codes (uint8)."""
    return _tables()["ulaw_enc"][np.asarray(pcm, dtype=np.int16).astype(np.int64) + 32768]


def ulaw_decode(codes: np.ndarray) -> np.ndarray:
    """G.711 µ-law codes (uint8) → int16 samples."""
    return _tables()["ulaw_dec"][np.asarray(codes, dtype=np.uint8)]


def alaw_encode(pcm: np.ndarray) -> np.ndarray:
    """int16 samples → G.711 A-law codes (uint8)."""
    return _tables()["alaw_enc"][np.asarray(pcm, dtype=np.int16).astype(np.int64) + 32768]


def alaw_decode(codes: np.ndarray) -> np.ndarray:
    """G.711 A-law codes (uint8) → int16 samples."""
    return _tables()["alaw_dec"][np.asarray(codes, dtype=np.uint8)]


# --- wire bytes <-> float -------------------------------------------------------------------------


def decode_audio(data: bytes, fmt: AudioFormat) -> np.ndarray:
    """Wire bytes in ``fmt`` → float32 samples at ``fmt.sample_rate`` (no resampling)."""
    if fmt is AudioFormat.PCM:
        pcm = decode_pcm16(data)
    else:
        codes = np.frombuffer(data, dtype=np.uint8)
        pcm = ulaw_decode(codes) if fmt is AudioFormat.PCMU else alaw_decode(codes)
    return pcm16_to_float(pcm)


def encode_audio(samples: np.ndarray, fmt: AudioFormat) -> bytes:
    """float samples at ``fmt.sample_rate`` → wire bytes in ``fmt`` (clipped, rounded; no resampling)."""
    pcm = float_to_pcm16(samples)
    if fmt is AudioFormat.PCM:
        return encode_pcm16(pcm)
    codes = ulaw_encode(pcm) if fmt is AudioFormat.PCMU else alaw_encode(pcm)
    return codes.tobytes()


# --- resampling -----------------------------------------------------------------------------------


def _as_mono_float32(chunk: np.ndarray) -> np.ndarray:
    x = np.ascontiguousarray(chunk, dtype=np.float32)
    if x.ndim != 1:
        raise ValueError(f"expected mono 1-D audio, got an array of shape {x.shape}")
    return x


def resample(samples: np.ndarray, in_rate: int, out_rate: int) -> np.ndarray:
    """One-shot resampling of a whole float signal (soxr HQ); for files and tests, not streams."""
    x = _as_mono_float32(samples)
    if in_rate == out_rate:
        return x.copy()
    return soxr.resample(x, in_rate, out_rate, quality="HQ").astype(np.float32, copy=False)


class StreamResampler:
    """Streaming mono float32 resampler (soxr).

    Contract: call :meth:`process` with consecutive chunks of one signal, then :meth:`flush` once at
    its end; the concatenated outputs hold ``round(n_in * out_rate / in_rate)`` samples. soxr
    works in blocks, so a call may return fewer samples than its share (even none) and a later
    call catches up: with ``quality="HQ"`` 24→16 kHz lags ≤ ~40 ms, 8→16 kHz ≤ ~120 ms. After
    ``flush`` the resampler is fresh and can take a new signal. Equal rates pass chunks through.
    """

    def __init__(self, in_rate: int, out_rate: int, *, quality: str = "HQ") -> None:
        if in_rate <= 0 or out_rate <= 0:
            raise ValueError(f"sample rates must be positive, got {in_rate} → {out_rate}")
        self.in_rate = in_rate
        self.out_rate = out_rate
        self._stream = None
        if in_rate != out_rate:
            self._stream = soxr.ResampleStream(in_rate, out_rate, 1, dtype="float32", quality=quality)

    def process(self, chunk: np.ndarray) -> np.ndarray:
        """Resample the next chunk of the signal; returns the output samples ready so far."""
        x = _as_mono_float32(chunk)
        if self._stream is None:
            return x.copy()
        return self._stream.resample_chunk(x)

    def flush(self) -> np.ndarray:
        """End the signal: return the samples still held back, and start fresh for the next one."""
        if self._stream is None:
            return np.zeros(0, dtype=np.float32)
        tail = self._stream.resample_chunk(np.zeros(0, dtype=np.float32), last=True)
        self._stream.clear()
        return tail


class AudioDecoder(Protocol):
    """Wire bytes → float32 16 kHz, streaming (:class:`InputDecoder` is one)."""

    def decode(self, data: bytes) -> np.ndarray: ...

    def flush(self) -> np.ndarray: ...


DecoderFactory = Callable[[AudioFormat], AudioDecoder]
"""Makes the streaming decoder of one wire format (:class:`InputDecoder` is one)."""


class InputDecoder:
    """Client audio bytes in ``fmt`` → float32 at 16 kHz (the VAD's and the model's rate), streaming.

    Each :meth:`decode` call takes one whole ``input_audio_buffer.append`` payload (pcm16 payloads
    must hold whole samples). Call :meth:`flush` when the input turn ends (commit / speech stopped)
    to get the samples the resampler still holds.
    """

    def __init__(self, fmt: AudioFormat) -> None:
        self.format = fmt
        self._resampler = StreamResampler(fmt.sample_rate, MODEL_INPUT_RATE)

    def decode(self, data: bytes) -> np.ndarray:
        return self._resampler.process(decode_audio(data, self.format))

    def flush(self) -> np.ndarray:
        return self._resampler.flush()


class OutputEncoder:
    """Engine float32 audio at 24 kHz → wire bytes in ``fmt``, streaming.

    Call :meth:`encode` with each engine audio chunk in order and :meth:`flush` once when the
    response's audio ends (or is cancelled: then discard what flush returns if it must not play).
    """

    def __init__(self, fmt: AudioFormat) -> None:
        self.format = fmt
        self._resampler = StreamResampler(ENGINE_OUTPUT_RATE, fmt.sample_rate)

    def encode(self, samples: np.ndarray) -> bytes:
        return encode_audio(self._resampler.process(samples), self.format)

    def flush(self) -> bytes:
        return encode_audio(self._resampler.flush(), self.format)
