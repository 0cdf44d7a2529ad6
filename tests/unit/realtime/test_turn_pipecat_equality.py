"""Our Smart Turn scoring is the model's own: :class:`~realtime.turns.smart_turn.SmartTurnModel` (our features and
our onnxruntime session) gives the spoken fixture turns the probabilities pipecat's own analyzer
(``LocalSmartTurnAnalyzerV3``, driven frame by frame as a pipecat pipeline drives it) gives them.

Why ``PROBABILITY_TOL`` and not more: the model's input is the same up to float32 rounding (our features equal
pipecat's: the same numpy float32 normalization, then float64 spectra that differ by ~1e-16 relative before
rounding to float32, ``test_turn_features``), and both sessions run the same file with the same options. The model
quantizes its input and activations to int8, so a difference in the input's arithmetic does not show as float
noise: it moves a value across a quantization step, and the steps add up through the layers. With torch's float32
summation order in the normalization (features ~1e-5 apart), 6 of these 20 turns were off, by up to 0.19. Equal
inputs give equal outputs to float32 resolution, hence the tolerance."""

from __future__ import annotations

import numpy as np
import pytest

from realtime.bench.turn_fixtures import RATE, VOICES, TurnKind
from tests.helpers.pipecat_turn import pipecat_probabilities
from tests.helpers.turn_model import turn_clips, turn_model

SENTENCES = 10
"""The first sentences of the fixtures; each gives a complete turn and a cut one: 20 turns."""
SCORE_AFTER_MS = 200
PROBABILITY_TOL = 1e-6
BATCH = 8


def test_our_probabilities_are_pipecats_analyzers():
    model = turn_model()
    clips = turn_clips(VOICES[0])
    complete = [c for c in clips if c.kind is TurnKind.COMPLETE][:SENTENCES]
    paused = [c for c in clips if c.kind is TurnKind.PAUSE][:SENTENCES]
    heard = [(c.with_silence(SCORE_AFTER_MS), c) for c in complete]
    heard += [(c.until_pause(SCORE_AFTER_MS), c) for c in paused]
    # pcm16 as a client sends it; both sides hear it as int16 / 32768 (the server's and pipecat's conversion)
    pcm = [(np.clip(audio, -1, 1) * 32767).astype(np.int16) for audio, _ in heard]
    ms = RATE // 1000
    speech_ends = [c.speech_end_ms if c.kind is TurnKind.COMPLETE else c.pause_start_ms for _, c in heard]
    turns = [(p, c.speech_start_ms * ms, end * ms) for p, (_, c), end in zip(pcm, heard, speech_ends, strict=True)]
    try:
        theirs = pipecat_probabilities(turns)
    except ImportError as exc:
        pytest.skip(str(exc))

    audios = [p.astype(np.float32) / 32768 for p in pcm]
    alone = np.concatenate([model([a]) for a in audios])
    batched = np.concatenate([model(audios[i : i + BATCH]) for i in range(0, len(audios), BATCH)])
    assert theirs.shape == (2 * SENTENCES,)
    np.testing.assert_allclose(alone, theirs, rtol=0, atol=PROBABILITY_TOL)
    np.testing.assert_allclose(batched, theirs, rtol=0, atol=PROBABILITY_TOL)
    assert np.ptp(theirs) > 0.5  # turns the model tells apart, not one answer for all
