"""realtime.turns.features: the Smart Turn model's input, the Whisper log-mel of a turn's last 8 s, as pipecat's
analyzer computes it."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest

from pipeline.errors import InvalidAudioError
from realtime.turns.features import FRAMES, N_MELS, WINDOW_SAMPLES, WhisperFeatures, last_window
from tests.helpers.speech import load_16k

PIPECAT_FEATURES = ("audio", "turn", "smart_turn", "_whisper_features.py")

TOL = 1.2e-7
"""One float32 ulp of a feature in [1, 2): ours and pipecat's normalize alike (numpy's float32 reductions), then
compute float64 spectra ~1e-16 apart (torch's FFT and numpy's) that round to the same float32 but for a value on a
rounding boundary. Equal on the signals below."""


@pytest.fixture(scope="module")
def features() -> WhisperFeatures:
    return WhisperFeatures()


def pipecat_extractor():
    """pipecat's own feature function, loaded from its file: importing the ``pipecat`` package would pull in its
    dependencies, which the ``turn`` extra does not install."""
    spec = importlib.util.find_spec("pipecat")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("pipecat-ai (the turn extra) is not installed: nothing to compare with")
    path = Path(next(iter(spec.submodule_search_locations))).joinpath(*PIPECAT_FEATURES)
    module_spec = importlib.util.spec_from_file_location("pipecat_whisper_features", path)
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    return module.compute_whisper_log_mel_features


def test_a_short_turn_is_padded_at_the_front_so_that_it_ends_the_window():
    audio = np.linspace(-0.5, 0.5, 1000, dtype=np.float32)
    window = last_window(audio)
    assert window.shape == (WINDOW_SAMPLES,) and window.dtype == np.float32
    np.testing.assert_array_equal(window[-1000:], audio)
    assert not window[:-1000].any()


def test_a_long_turn_keeps_its_last_eight_seconds():
    audio = np.arange(WINDOW_SAMPLES + 5000, dtype=np.float64) / 1e6
    np.testing.assert_array_equal(last_window(audio), audio[5000:].astype(np.float32))
    assert not last_window(np.zeros(0, np.float32)).any()


@pytest.mark.parametrize(
    "audio",
    [np.zeros((2, 100), np.float32), np.array([0.0, np.nan], np.float32), np.array([1, 2], np.int16)],
    ids=["2-D", "NaN", "int16"],
)
def test_bad_audio_is_refused(audio):
    with pytest.raises(InvalidAudioError):
        last_window(audio)


def test_features_equal_pipecat_extractor(features):
    reference = pipecat_extractor()
    speech = load_16k("capital_of_france.wav")
    rng = np.random.default_rng(7)
    audios = [
        speech,  # a turn shorter than the window: padded at the front
        np.tile(speech, 4),  # longer: its last 8 s
        (0.05 * rng.standard_normal(40_000)).astype(np.float32),
        np.zeros(16_000, np.float32),  # digital silence: the variance's epsilon alone keeps it finite
    ]
    ours = features(audios)
    assert ours.shape == (len(audios), N_MELS, FRAMES) and ours.dtype == np.float32
    for row, audio in zip(ours, audios, strict=True):
        np.testing.assert_allclose(row, reference(last_window(audio)), rtol=0, atol=TOL)


def test_each_row_of_a_batch_is_its_turn_alone(features):
    speech = load_16k("short_joke.wav")
    audios = [speech, speech[: len(speech) // 2], 0.3 * speech]
    batch = features(audios)
    for row, audio in zip(batch, audios, strict=True):
        np.testing.assert_allclose(row, features([audio])[0], rtol=0, atol=1e-6)
    assert np.abs(batch[0] - batch[1]).max() > 0.1  # the rows are not one turn repeated
