"""Turn detection: exact event times from scripted probabilities, and silero on spoken fixtures."""

from __future__ import annotations

import json
import wave

import numpy as np
import pytest

from realtime.errors import RealtimeError
from realtime.media.audio import InputDecoder
from realtime.protocol.audio_format import AudioFormat
from realtime.protocol.turn_detection import ServerVadParams
from realtime.turns.server_vad import SpeechPaused, SpeechResumed, SpeechStarted, SpeechStopped, TurnDetector
from realtime.turns.vad import SileroVad
from tests.helpers.paths import TESTS
from tests.helpers.scripted_vad import FRAME, ScriptedVad, script

SPEECH_DIR = TESTS / "fixtures" / "speech"
MANIFEST = json.loads((SPEECH_DIR / "manifest.json").read_text())


def detect(audio: np.ndarray, chunk: int | None = None, pause_ms: int | None = None, **params) -> list:
    det = TurnDetector(ServerVadParams(**params), ScriptedVad(), pause_ms=pause_ms)
    step = chunk or max(len(audio), 1)
    return [ev for i in range(0, len(audio), step) for ev in det.feed(audio[i : i + step])]


# --- params ---


def test_params_defaults_match_the_api():
    p = ServerVadParams()
    assert (p.threshold, p.prefix_padding_ms, p.silence_duration_ms) == (0.5, 300, 500)
    assert p.create_response and p.interrupt_response
    assert p.end_threshold == pytest.approx(0.35)
    assert ServerVadParams(threshold=0.1).end_threshold == 0.01


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("threshold", 1.5),
        ("threshold", -0.1),
        ("threshold", "0.5"),
        ("threshold", True),
        ("prefix_padding_ms", -1),
        ("prefix_padding_ms", 2.5),
        ("silence_duration_ms", -10),
        ("silence_duration_ms", None),
        ("create_response", "yes"),
        ("interrupt_response", 1),
    ],
)
def test_params_reject_invalid_values(field, value):
    with pytest.raises(RealtimeError, match=f"turn_detection.{field}") as info:
        ServerVadParams(**{field: value})
    assert info.value.param == f"session.turn_detection.{field}"


# --- scripted probabilities ---


def test_exact_start_and_stop_times():
    audio = script((0.0, 10), (0.9, 20), (0.0, 20))
    events = detect(audio, prefix_padding_ms=100, silence_duration_ms=200)
    # speech from frame 10 (320 ms); silence from frame 30 (960 ms); 200 ms of it is reached at the
    # end of frame 36 (1184 ms, the first frame end >= 1160 ms)
    assert events == [
        SpeechStarted(audio_start_ms=220, speech_start_ms=320),
        SpeechStopped(audio_end_ms=1184, speech_end_ms=960),
    ]


def test_prefix_padding_does_not_go_below_zero():
    events = detect(script((0.0, 2), (1.0, 5)), prefix_padding_ms=300)
    assert events == [SpeechStarted(audio_start_ms=0, speech_start_ms=64)]


def test_zero_prefix_padding():
    events = detect(script((0.0, 4), (1.0, 5)), prefix_padding_ms=0)
    assert events == [SpeechStarted(audio_start_ms=128, speech_start_ms=128)]


@pytest.mark.parametrize(("quiet_frames", "stops"), [(6, False), (7, True)])
def test_silence_must_last_silence_duration(quiet_frames, stops):
    # 6 frames = 192 ms < 200 ms; 7 frames = 224 ms >= 200 ms
    audio = script((1.0, 5), (0.0, quiet_frames), (1.0, 5))
    events = detect(audio, silence_duration_ms=200)
    if stops:
        assert events == [
            SpeechStarted(audio_start_ms=0, speech_start_ms=0),
            SpeechStopped(audio_end_ms=160 + 224, speech_end_ms=160),
            SpeechStarted(audio_start_ms=84, speech_start_ms=384),
        ]
    else:
        assert events == [SpeechStarted(audio_start_ms=0, speech_start_ms=0)]


def test_probabilities_between_thresholds_neither_start_nor_end_speech():
    # threshold 0.5 → end threshold 0.35: 0.4 is in the hysteresis band
    assert detect(script((0.4, 50))) == []
    events = detect(script((0.9, 3), (0.4, 50)), silence_duration_ms=100)
    assert events == [SpeechStarted(audio_start_ms=0, speech_start_ms=0)]


def test_band_frames_do_not_cancel_a_silence_run_but_speech_does():
    quiet_then_band = detect(script((0.9, 3), (0.0, 2), (0.4, 10)), silence_duration_ms=200)
    assert quiet_then_band[1] == SpeechStopped(audio_end_ms=96 + 224, speech_end_ms=96)
    interrupted = detect(script((0.9, 3), (0.0, 2), (0.6, 1), (0.0, 10)), silence_duration_ms=200)
    assert interrupted[1] == SpeechStopped(audio_end_ms=192 + 224, speech_end_ms=192)


def test_threshold_is_inclusive():
    assert detect(script((0.0, 1), (0.5, 1)))[0] == SpeechStarted(audio_start_ms=0, speech_start_ms=32)
    assert detect(script((0.0, 1), (0.49, 1))) == []


@pytest.mark.parametrize("chunk", [320, 1600, 512, 7, 100_000])
def test_events_do_not_depend_on_chunk_size(chunk):
    # 20 ms, 100 ms, exactly a frame, a few samples, everything at once
    audio = script((0.0, 7), (0.8, 12), (0.2, 3), (0.9, 4), (0.0, 25), (0.7, 9), (0.0, 30))
    reference = detect(audio, chunk=None, silence_duration_ms=500, prefix_padding_ms=300)
    assert len(reference) == 4
    assert detect(audio, chunk=chunk, silence_duration_ms=500, prefix_padding_ms=300) == reference


def test_speaking_and_elapsed_ms_follow_the_stream():
    det = TurnDetector(ServerVadParams(silence_duration_ms=64), ScriptedVad())
    assert not det.speaking and det.elapsed_ms == 0
    det.feed(script((1.0, 1))[:400])  # less than a frame: nothing decided yet
    assert not det.speaking and det.elapsed_ms == 25
    det.feed(script((1.0, 1))[400:])
    assert det.speaking
    assert det.feed(script((0.0, 2))) == [SpeechStopped(audio_end_ms=96, speech_end_ms=32)]
    assert not det.speaking and det.elapsed_ms == 96


def test_reset_forgets_speech_and_partial_frame_but_keeps_the_clock():
    vad = ScriptedVad()
    det = TurnDetector(ServerVadParams(prefix_padding_ms=0, silence_duration_ms=64), vad)
    assert det.feed(script((1.0, 2))) == [SpeechStarted(audio_start_ms=0, speech_start_ms=0)]
    det.feed(np.full(100, 0.3, np.float32))  # a partial frame, dropped by reset
    det.reset()
    assert vad.resets == 1 and not det.speaking
    # no SpeechStopped for the forgotten turn; frames now start 100 samples (6.25 ms) later
    assert det.feed(script((0.0, 5))) == []
    events = det.feed(script((1.0, 1)))
    assert events == [SpeechStarted(audio_start_ms=230, speech_start_ms=230)]  # (2·512+100+5·512)/16


# --- pauses (preemptive replies) ---


def test_pause_then_stop_in_one_silence_run():
    # speech frames 3..12, silence from frame 13 (416 ms): paused at 7 frames (224 >= 200 ms), stopped at 16 (512 ms)
    events = detect(script((0.0, 3), (0.9, 10), (0.0, 20)), pause_ms=200)
    assert events == [
        SpeechStarted(0, 96),
        SpeechPaused(audio_end_ms=640, speech_end_ms=416),
        SpeechStopped(audio_end_ms=928, speech_end_ms=416),
    ]


def test_speech_after_a_pause_resumes_and_a_later_run_pauses_again():
    audio = script((0.9, 5), (0.0, 8), (0.4, 2), (0.9, 3), (0.0, 20))
    events = detect(audio, pause_ms=200)
    # the first run (frames 5..12) pauses at frame 11; the band frames 13-14 do not cancel it, speech at 15 does
    assert events == [
        SpeechStarted(0, 0),
        SpeechPaused(audio_end_ms=384, speech_end_ms=160),
        SpeechResumed(speech_start_ms=480),
        SpeechPaused(audio_end_ms=800, speech_end_ms=576),
        SpeechStopped(audio_end_ms=1088, speech_end_ms=576),
    ]


def test_no_pause_without_pause_ms_or_when_it_reaches_the_silence_window():
    audio = script((0.9, 5), (0.0, 20))
    plain = detect(audio)
    assert detect(audio, pause_ms=500) == plain == detect(audio, pause_ms=800)
    assert not any(isinstance(e, (SpeechPaused, SpeechResumed)) for e in plain)


def test_speech_without_a_pause_reports_no_resume():
    events = detect(script((0.9, 5), (0.0, 3), (0.9, 5), (0.0, 20)), pause_ms=200)
    assert [type(e) for e in events] == [SpeechStarted, SpeechPaused, SpeechStopped]


@pytest.mark.parametrize("chunk", [1, 100, FRAME, 3 * FRAME + 7])
def test_pauses_do_not_depend_on_chunk_size(chunk):
    audio = script((0.9, 5), (0.0, 8), (0.9, 3), (0.0, 20))
    assert detect(audio, chunk=chunk, pause_ms=200) == detect(audio, pause_ms=200)


def test_reset_forgets_a_pause():
    det = TurnDetector(ServerVadParams(), ScriptedVad(), pause_ms=100)
    assert [type(e) for e in det.feed(script((0.9, 3), (0.0, 5)))] == [SpeechStarted, SpeechPaused]
    det.reset()
    assert [type(e) for e in det.feed(script((0.9, 3)))] == [SpeechStarted]  # a fresh turn: no resume


@pytest.mark.parametrize("pause_ms", [-1, 1.5, True])
def test_pause_ms_must_be_a_non_negative_integer(pause_ms):
    with pytest.raises(ValueError, match="pause_ms"):
        TurnDetector(ServerVadParams(), ScriptedVad(), pause_ms=pause_ms)


def test_rejects_multichannel_audio():
    det = TurnDetector(ServerVadParams(), ScriptedVad())
    with pytest.raises(ValueError, match="mono"):
        det.feed(np.zeros((FRAME, 2), np.float32))


# --- silero on spoken fixtures, fed as a client would ---


def wire_bytes(name: str) -> bytes:
    with wave.open(str(SPEECH_DIR / name)) as w:
        assert w.getframerate() == AudioFormat.PCM.sample_rate
        return w.readframes(w.getnframes())


def detect_from_wire(det: TurnDetector, data: bytes) -> list:
    """Stream pcm16 24 kHz bytes in 20 ms appends through the input decoder into the detector."""
    decoder = InputDecoder(AudioFormat.PCM)
    events = []
    for i in range(0, len(data), 960):
        events += det.feed(decoder.decode(data[i : i + 960]))
    return events + det.feed(decoder.flush())


@pytest.fixture(scope="module")
def silero() -> SileroVad:
    return SileroVad()


def test_silero_one_turn_near_the_real_boundaries(silero):
    silero.reset()
    det = TurnDetector(ServerVadParams(), silero)
    entry = MANIFEST["capital_of_france.wav"]
    events = detect_from_wire(det, wire_bytes("capital_of_france.wav"))
    assert [type(e) for e in events] == [SpeechStarted, SpeechStopped]
    started, stopped = events
    assert abs(started.speech_start_ms - entry["speech_start_ms"]) <= 100
    assert started.audio_start_ms == max(0, started.speech_start_ms - 300)
    assert abs(stopped.speech_end_ms - entry["speech_end_ms"]) <= 150
    assert 500 <= stopped.audio_end_ms - stopped.speech_end_ms < 500 + 32


def test_silero_two_turns_in_one_stream(silero):
    silero.reset()
    det = TurnDetector(ServerVadParams(), silero)
    first, second = "pair_turn1_name.wav", "pair_turn2_recall.wav"
    events = detect_from_wire(det, wire_bytes(first) + wire_bytes(second))
    assert [type(e) for e in events] == [SpeechStarted, SpeechStopped] * 2
    offset = MANIFEST[first]["duration_ms"]
    assert abs(events[2].speech_start_ms - (offset + MANIFEST[second]["speech_start_ms"])) <= 100
    assert abs(events[3].speech_end_ms - (offset + MANIFEST[second]["speech_end_ms"])) <= 150
