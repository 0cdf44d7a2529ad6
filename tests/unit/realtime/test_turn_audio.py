"""realtime.turns.turn_audio.TurnAudio: the current turn's audio for the turn model, from its look-back before the
speech start to now, its last 8 s at most, however the audio is chunked."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from realtime.turns.features import WINDOW_SAMPLES
from realtime.turns.turn_audio import TurnAudio

LOOKBACK_MS = 300
LOOKBACK = LOOKBACK_MS * 16


def signal(n: int, start: int = 0) -> np.ndarray:
    """Samples whose values are their indices (scaled): any slice says where it came from."""
    return (np.arange(start, start + n) / 2**24).astype(np.float32)


def feed(buffer: TurnAudio, audio: np.ndarray, chunk: int) -> None:
    for i in range(0, len(audio), chunk):
        buffer.append(audio[i : i + chunk])


def test_a_turn_holds_its_lookback_and_what_follows():
    buffer = TurnAudio(LOOKBACK_MS)
    audio = signal(30_000)
    feed(buffer, audio[:20_000], 320)
    assert buffer.audio().size == 0 and not buffer.in_turn
    buffer.begin()
    feed(buffer, audio[20_000:], 320)
    np.testing.assert_array_equal(buffer.audio(), audio[20_000 - LOOKBACK :])


def test_a_turn_that_begins_early_has_what_there_is():
    buffer = TurnAudio(LOOKBACK_MS)
    buffer.append(signal(1000))
    buffer.begin()
    buffer.append(signal(500, 1000))
    np.testing.assert_array_equal(buffer.audio(), signal(1500))


def test_speech_that_starts_again_continues_the_turn():
    buffer = TurnAudio(LOOKBACK_MS)
    buffer.append(signal(10_000))
    buffer.begin()
    buffer.append(signal(10_000, 10_000))
    buffer.begin()  # speech resumed after a pause: the same turn
    np.testing.assert_array_equal(buffer.audio(), signal(10_000 + LOOKBACK, 10_000 - LOOKBACK))
    buffer.end()
    assert buffer.audio().size == 0
    buffer.begin()  # a new turn: only its look-back
    np.testing.assert_array_equal(buffer.audio(), signal(LOOKBACK, 20_000 - LOOKBACK))


@settings(max_examples=50, deadline=None)
@given(
    before=st.integers(0, 3 * WINDOW_SAMPLES),
    during=st.integers(0, 3 * WINDOW_SAMPLES),
    chunk=st.integers(1, 3 * WINDOW_SAMPLES),
)
def test_a_long_turn_keeps_its_last_eight_seconds_however_chunked(before, during, chunk):
    buffer = TurnAudio(LOOKBACK_MS)
    audio = signal(before + during)
    feed(buffer, audio[:before], chunk)
    buffer.begin()
    feed(buffer, audio[before:], chunk)
    start = max(before - LOOKBACK, 0, len(audio) - WINDOW_SAMPLES)
    np.testing.assert_array_equal(buffer.audio(), audio[start:])


def test_bad_input_is_refused():
    with pytest.raises(ValueError):
        TurnAudio(-1)
    with pytest.raises(ValueError):
        TurnAudio().append(np.zeros((2, 10), np.float32))
