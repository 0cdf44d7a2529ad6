"""Wire audio formats: pcm16 / G.711 codecs, resampling, and the session's streaming pipelines."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from realtime.errors import InvalidAudioData, RealtimeError
from realtime.media.audio import (
    InputDecoder,
    OutputEncoder,
    StreamResampler,
    alaw_decode,
    alaw_encode,
    decode_audio,
    decode_pcm16,
    encode_audio,
    encode_pcm16,
    float_to_pcm16,
    pcm16_to_float,
    resample,
    ulaw_decode,
    ulaw_encode,
)
from realtime.protocol.audio_format import AudioFormat

ALL_INT16 = np.arange(-32768, 32768, dtype=np.int16)
ALL_CODES = np.arange(256, dtype=np.uint8)


def sine(freq: float, rate: int, seconds: float, amp: float = 0.5) -> np.ndarray:
    t = np.arange(round(rate * seconds)) / rate
    return (amp * np.sin(2 * np.pi * freq * t)).astype(np.float32)


def peak_frequency(x: np.ndarray, rate: int) -> float:
    spectrum = np.abs(np.fft.rfft(x * np.hanning(len(x))))
    return float(np.fft.rfftfreq(len(x), 1 / rate)[np.argmax(spectrum)])


# --- formats ---


@pytest.mark.parametrize(
    ("name", "fmt", "rate"),
    [
        ("audio/pcm", AudioFormat.PCM, 24000),
        ("pcm16", AudioFormat.PCM, 24000),
        ("audio/pcmu", AudioFormat.PCMU, 8000),
        ("g711_ulaw", AudioFormat.PCMU, 8000),
        ("audio/pcma", AudioFormat.PCMA, 8000),
        ("g711_alaw", AudioFormat.PCMA, 8000),
    ],
)
def test_parse_accepts_ga_and_beta_names(name, fmt, rate):
    assert AudioFormat.parse(name) is fmt
    assert fmt.sample_rate == rate
    assert AudioFormat.parse(fmt.beta_name) is fmt


def test_parse_rejects_unknown_format():
    with pytest.raises(RealtimeError, match="unsupported audio format 'audio/opus'") as info:
        AudioFormat.parse("audio/opus")
    assert info.value.param == "format"


def test_duration_ms_per_format():
    assert AudioFormat.PCM.duration_ms(48_000) == 1000.0
    assert AudioFormat.PCMU.duration_ms(160) == 20.0
    assert AudioFormat.PCMA.duration_ms(8_000) == 1000.0


# --- pcm16 ---


def test_pcm16_known_bytes():
    assert decode_pcm16(b"\x01\x00\xff\x7f\x00\x80\xff\xff").tolist() == [1, 32767, -32768, -1]
    assert encode_pcm16(np.array([1, 32767, -32768, -1], np.int16)) == b"\x01\x00\xff\x7f\x00\x80\xff\xff"


def test_pcm16_round_trips_every_value():
    assert np.array_equal(decode_pcm16(encode_pcm16(ALL_INT16)), ALL_INT16)
    assert np.array_equal(float_to_pcm16(pcm16_to_float(ALL_INT16)), ALL_INT16)


def test_float_to_pcm16_rounds_and_clips():
    x = np.array([1.4, 1.6, -1.6, 40000.0, -40000.0], np.float64) / 32768
    assert float_to_pcm16(x).tolist() == [1, 2, -2, 32767, -32768]
    assert float_to_pcm16(np.array([1.0, -1.0])).tolist() == [32767, -32768]


def test_float_to_pcm16_rejects_nan():
    with pytest.raises(ValueError, match="NaN"):
        float_to_pcm16(np.array([0.0, np.nan]))


@pytest.mark.parametrize("n_bytes", [1, 3, 481])
def test_odd_length_pcm16_is_invalid_audio(n_bytes):
    with pytest.raises(InvalidAudioData, match=f"even number of bytes.*got {n_bytes} bytes"):
        decode_audio(b"\x00" * n_bytes, AudioFormat.PCM)


def test_decode_pcm_gives_float32_in_range():
    x = decode_audio(b"\x00\x40\x00\xc0", AudioFormat.PCM)
    assert x.dtype == np.float32
    assert x.tolist() == [0.5, -0.5]


# --- G.711 ---


def test_ulaw_known_code_points():
    # G.711 µ-law outputs (14-bit) scaled by 4: 0xFF/0x7F are ±0, 0x80/0x00 ±8031 (full scale),
    # 0xF0 is 30 (top of segment 0, steps of 2), 0xEF/0x6F ±33 (bottom of segment 1, steps of 4)
    codes = np.array([0xFF, 0x7F, 0x80, 0x00, 0xF0, 0xEF, 0x6F], np.uint8)
    assert ulaw_decode(codes).tolist() == [0, 0, 32124, -32124, 120, 132, -132]
    levels = np.array([0, 32767, -32768, 120, 132, -132], np.int16)
    assert ulaw_encode(levels).tolist() == [0xFF, 0x80, 0x00, 0xF0, 0xEF, 0x6F]


def test_alaw_known_code_points():
    # G.711 table 1a scaled to 16 bits: 0xD5/0x55 are ±1·8 (the smallest level), 0xAA/0x2A ±4032·8
    assert alaw_decode(np.array([0xD5, 0x55, 0xAA, 0x2A], np.uint8)).tolist() == [8, -8, 32256, -32256]
    assert alaw_encode(np.array([0, -1, 32767, -32768], np.int16)).tolist() == [0xD5, 0x55, 0xAA, 0x2A]


def test_ulaw_codes_round_trip():
    codes = ALL_CODES[ALL_CODES != 0x7F]  # 0x7F is "negative zero": it decodes to 0, which encodes as 0xFF
    assert np.array_equal(ulaw_encode(ulaw_decode(codes)), codes)


def test_alaw_codes_round_trip():
    assert np.array_equal(alaw_encode(alaw_decode(ALL_CODES)), ALL_CODES)


@pytest.mark.parametrize(("encode", "decode"), [(ulaw_encode, ulaw_decode), (alaw_encode, alaw_decode)])
def test_g711_quantization_error_is_bounded(encode, decode):
    # logarithmic quantizer: the error stays within one step, and a step is at most 1/16 of the level
    # (plus the finest step near zero); beyond full scale it clips
    x = ALL_INT16[np.abs(ALL_INT16.astype(np.int64)) <= 32000].astype(np.int64)
    err = np.abs(decode(encode(x)).astype(np.int64) - x)
    assert np.all(err <= np.abs(x) / 16 + 16)
    ordered = decode(encode(ALL_INT16)).astype(np.int64)
    assert np.all(np.diff(ordered) >= 0)  # monotonic


def test_g711_matches_python_audioop_on_every_sample():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        audioop = pytest.importorskip("audioop")  # removed from Python 3.13
    pcm = encode_pcm16(ALL_INT16)
    assert ulaw_encode(ALL_INT16).tobytes() == audioop.lin2ulaw(pcm, 2)
    assert alaw_encode(ALL_INT16).tobytes() == audioop.lin2alaw(pcm, 2)
    assert encode_pcm16(ulaw_decode(ALL_CODES)) == audioop.ulaw2lin(ALL_CODES.tobytes(), 2)
    assert encode_pcm16(alaw_decode(ALL_CODES)) == audioop.alaw2lin(ALL_CODES.tobytes(), 2)


@pytest.mark.parametrize("fmt", [AudioFormat.PCMU, AudioFormat.PCMA])
def test_g711_wire_round_trip_is_one_byte_per_sample(fmt):
    x = sine(440, 8000, 0.1)
    data = encode_audio(x, fmt)
    assert len(data) == len(x)
    y = decode_audio(data, fmt)
    assert y.dtype == np.float32
    assert np.max(np.abs(y - x)) < 0.5 / 16 + 1e-3


# --- resampling ---


@pytest.mark.parametrize(("in_rate", "out_rate"), [(24000, 16000), (8000, 16000), (24000, 8000), (16000, 48000)])
def test_stream_resampler_length_ratio(in_rate, out_rate):
    rng = np.random.default_rng(0)
    signal = rng.standard_normal(in_rate).astype(np.float32) * 0.1
    r = StreamResampler(in_rate, out_rate)
    cuts = np.cumsum(rng.integers(1, in_rate // 20, size=100))
    pieces = [r.process(c) for c in np.split(signal, cuts[cuts < len(signal)])]
    total = sum(len(p) for p in pieces) + len(r.flush())
    assert abs(total - out_rate) <= 1


def test_stream_resampler_keeps_a_sines_frequency():
    r = StreamResampler(24000, 16000)
    x = sine(1000, 24000, 1.0)
    y = np.concatenate([r.process(c) for c in np.split(x, 50)] + [r.flush()])
    assert peak_frequency(y, 16000) == pytest.approx(1000, abs=2)
    assert np.sqrt(np.mean(y[2000:-2000] ** 2)) == pytest.approx(0.5 / np.sqrt(2), rel=0.01)


def test_stream_resampler_output_does_not_depend_on_chunking():
    x = sine(300, 24000, 0.5)
    whole = StreamResampler(24000, 16000)
    one_shot = np.concatenate([whole.process(x), whole.flush()])
    chunked = StreamResampler(24000, 16000)
    streamed = np.concatenate([chunked.process(c) for c in np.split(x, 25)] + [chunked.flush()])
    assert len(streamed) == len(one_shot) == 8000
    np.testing.assert_allclose(streamed, one_shot, atol=1e-5)
    np.testing.assert_allclose(one_shot, resample(x, 24000, 16000), atol=1e-4)


def test_flush_starts_a_fresh_signal():
    r = StreamResampler(24000, 16000)
    x = sine(500, 24000, 0.2)
    first = np.concatenate([r.process(x), r.flush()])
    second = np.concatenate([r.process(x), r.flush()])
    np.testing.assert_array_equal(first, second)


def test_equal_rates_pass_through():
    r = StreamResampler(16000, 16000)
    x = sine(500, 16000, 0.01)
    np.testing.assert_array_equal(r.process(x), x)
    assert len(r.flush()) == 0


def test_resampler_rejects_bad_input():
    with pytest.raises(ValueError, match="mono"):
        StreamResampler(24000, 16000).process(np.zeros((10, 2), np.float32))
    with pytest.raises(ValueError, match="positive"):
        StreamResampler(0, 16000)


# --- session pipelines ---


def test_input_decoder_pcm_to_16k():
    x = sine(440, 24000, 1.0)
    wire = encode_audio(x, AudioFormat.PCM)
    dec = InputDecoder(AudioFormat.PCM)
    chunks = [dec.decode(wire[i : i + 960]) for i in range(0, len(wire), 960)]  # 20 ms appends
    y = np.concatenate(chunks + [dec.flush()])
    assert y.dtype == np.float32
    assert len(y) == 16000
    assert peak_frequency(y, 16000) == pytest.approx(440, abs=2)


def test_input_decoder_rejects_odd_pcm16_payload():
    with pytest.raises(InvalidAudioData):
        InputDecoder(AudioFormat.PCM).decode(b"\x00\x01\x02")


@pytest.mark.parametrize("fmt", [AudioFormat.PCMU, AudioFormat.PCMA])
def test_input_decoder_g711_to_16k(fmt):
    wire = encode_audio(sine(440, 8000, 0.5), fmt)
    dec = InputDecoder(fmt)
    y = np.concatenate([dec.decode(wire[i : i + 160]) for i in range(0, len(wire), 160)] + [dec.flush()])
    assert len(y) == 8000
    assert peak_frequency(y, 16000) == pytest.approx(440, abs=4)


def test_output_encoder_pcm_is_plain_pcm16():
    x = sine(440, 24000, 0.1)
    enc = OutputEncoder(AudioFormat.PCM)
    assert enc.encode(x) + enc.flush() == encode_audio(x, AudioFormat.PCM)


@pytest.mark.parametrize("fmt", [AudioFormat.PCMU, AudioFormat.PCMA])
def test_output_encoder_g711_from_24k(fmt):
    x = sine(440, 24000, 0.5)
    enc = OutputEncoder(fmt)
    wire = b"".join(enc.encode(c) for c in np.split(x, 25)) + enc.flush()
    assert len(wire) == 4000
    y = decode_audio(wire, fmt)
    assert peak_frequency(y, 8000) == pytest.approx(440, abs=4)
    np.testing.assert_allclose(y[500:-500], resample(x, 24000, 8000)[500:-500], atol=0.5 / 16 + 1e-3)
