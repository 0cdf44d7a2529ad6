"""SileroVad on the spoken fixtures: speech is detected in the spoken part, not in the silence."""

from __future__ import annotations

import json

import numpy as np
import pytest

from realtime.turns.vad import VAD_SAMPLE_RATE, SileroVad
from tests.helpers.paths import TESTS
from tests.helpers.speech import load_16k

SPEECH_DIR = TESTS / "fixtures" / "speech"
MANIFEST = json.loads((SPEECH_DIR / "manifest.json").read_text())
SHORT_CLIPS = ["capital_of_france.wav", "short_joke.wav", "weather_today.wav", "count_to_five.wav"]


def frame_probs(vad: SileroVad, x: np.ndarray) -> np.ndarray:
    n = vad.frame_samples
    return np.array([vad(x[i : i + n]) for i in range(0, len(x) - n + 1, n)])


@pytest.fixture(scope="module")
def vad() -> SileroVad:
    return SileroVad()


@pytest.mark.parametrize("name", SHORT_CLIPS)
def test_speech_detected_only_where_spoken(vad, name):
    entry = MANIFEST[name]
    vad.reset()
    probs = frame_probs(vad, load_16k(name))
    start_ms = np.arange(len(probs)) * 1000 * vad.frame_samples // VAD_SAMPLE_RATE
    end_ms = start_ms + 32
    before = end_ms <= entry["speech_start_ms"]
    # the model's recurrent state lingers a few frames after speech: judge silence from 300 ms on
    after = start_ms >= entry["speech_end_ms"] + 300
    during = (start_ms >= entry["speech_start_ms"]) & (end_ms <= entry["speech_end_ms"])
    assert probs[before].max() < 0.1
    assert probs[after].max() < 0.1
    assert np.mean(probs[during] >= 0.5) > 0.8


def test_reset_makes_the_stream_repeatable(vad):
    x = load_16k("short_joke.wav")
    vad.reset()
    first = frame_probs(vad, x)
    vad.reset()
    second = frame_probs(vad, x)
    np.testing.assert_allclose(first, second, atol=1e-6)


def test_state_carries_across_frames(vad):
    # the same frame scores differently depending on what came before: the model is streaming
    x = load_16k("short_joke.wav")
    speech_frame = x[VAD_SAMPLE_RATE // 2 : VAD_SAMPLE_RATE // 2 + vad.frame_samples]
    vad.reset()
    fresh = vad(speech_frame)
    vad.reset()
    frame_probs(vad, x[: VAD_SAMPLE_RATE // 2])
    in_context = vad(speech_frame)
    assert fresh != pytest.approx(in_context, abs=1e-4)


def test_silence_scores_low(vad):
    vad.reset()
    assert frame_probs(vad, np.zeros(VAD_SAMPLE_RATE, np.float32)).max() < 0.1


@pytest.mark.parametrize("n", [511, 513, 1024])
def test_rejects_frames_of_the_wrong_size(vad, n):
    with pytest.raises(ValueError, match=r"\(512,\)"):
        vad(np.zeros(n, np.float32))
