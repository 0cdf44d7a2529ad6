"""realtime.turns.smart_turn.SmartTurnModel: the Smart Turn v3.2 file of the pipecat-ai wheel run by onnxruntime, its
decisions on the spoken turn fixtures, and the semantic_vad policy's pause handling on them.

On espeak-ng speech the model tells cut sentences from complete ones only a little better than chance over the
whole set (``python -m scripts.turn_accuracy`` prints the tables); the decision test below checks the turns it
decides with a wide margin on the project's default voice, which a wrong input (window, padding, features) flips."""

from __future__ import annotations

import asyncio
import sys

import numpy as np
import pytest

import realtime.turns.smart_turn as smart_turn
from realtime.bench.turn_fixtures import VOICES, TurnKind
from realtime.turns.semantic import Eagerness, SemanticPolicy
from realtime.turns.smart_turn import SmartTurnModel, TurnModelUnavailable, TurnScorer, bundled_model_path
from tests.helpers.speech import load_16k
from tests.helpers.turn_model import turn_clips, turn_model

VOICE = VOICES[0]  # en-us at 175 words a minute: the voice of the project's other spoken fixtures
SCORE_AFTER_MS = 200

CLEARLY_CUT = ("What would happen if the", "Yesterday we went to the beach and then")
"""Cut turns the model scores below 0.05 by the default voice (0.014, 0.015)."""
CLEARLY_COMPLETE = ("Can you remind me to", "Please add milk, eggs and", "Yesterday we went to the beach and then")
"""The complete sentences (named by their words before the pause) it scores above 0.9 (0.94, 0.93, 0.92)."""


@pytest.fixture(scope="module")
def scored():
    """(clip, P(complete) after 200 ms of silence) of every complete and cut turn by :data:`VOICE`; a cut turn is
    its pause turn heard 200 ms into the pause."""
    model = turn_model()
    clips = turn_clips(VOICE)
    heard = {
        TurnKind.COMPLETE: [(c, c.with_silence(SCORE_AFTER_MS)) for c in clips if c.kind is TurnKind.COMPLETE],
        TurnKind.PAUSE: [(c, c.until_pause(SCORE_AFTER_MS)) for c in clips if c.kind is TurnKind.PAUSE],
    }
    return {
        kind: list(
            zip(
                [c for c, _ in pairs],
                np.concatenate([model([a for _, a in pairs[i : i + 8]]) for i in range(0, len(pairs), 8)]),
            )
        )
        for kind, pairs in heard.items()
    }


def test_the_bundled_model_is_found_without_importing_pipecat():
    turn_model()
    path = bundled_model_path()
    assert path.is_file() and path.name == "smart-turn-v3.2-cpu.onnx"
    assert "pipecat" not in sys.modules


def test_without_pipecat_the_model_is_unavailable(monkeypatch):
    monkeypatch.setattr(smart_turn.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(TurnModelUnavailable, match=r"omni-realtime\[turn\]"):
        SmartTurnModel.bundled()


def test_without_onnxruntime_the_model_is_unavailable(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "onnxruntime", None)  # what an absent package looks like to import
    with pytest.raises(TurnModelUnavailable, match="onnxruntime"):
        SmartTurnModel(tmp_path / "model.onnx")


def test_a_file_that_is_not_the_model_is_unavailable(tmp_path):
    pytest.importorskip("onnxruntime", reason="the turn extra is not installed")
    garbage = tmp_path / "garbage.onnx"
    garbage.write_bytes(b"not a model")
    for path in (garbage, tmp_path / "missing.onnx"):
        with pytest.raises(TurnModelUnavailable, match="cannot load"):
            SmartTurnModel(path)


def test_a_batch_scores_each_turn_as_alone():
    model = turn_model()
    audios = [load_16k(name) for name in ("capital_of_france.wav", "short_joke.wav", "count_to_five.wav")]
    batch = model(audios)
    assert batch.shape == (3,) and ((batch >= 0) & (batch <= 1)).all()
    alone = np.array([model([a])[0] for a in audios])
    np.testing.assert_allclose(batch, alone, rtol=0, atol=1e-5)


def test_the_models_decisions_on_fixture_turns(scored):
    def probability(kind: TurnKind, before: str) -> float:
        (p,) = [p for clip, p in scored[kind] if clip.text.startswith(before + " ")]
        return p

    for before in CLEARLY_CUT:
        assert probability(TurnKind.PAUSE, before) < 0.1, before
    for before in CLEARLY_COMPLETE:
        assert probability(TurnKind.COMPLETE, before) > 0.8, before


def test_the_policy_rarely_takes_the_turn_in_a_mid_sentence_pause(scored):
    def taken_over(eagerness: Eagerness) -> float:
        policy = SemanticPolicy(eagerness)
        return np.mean([policy.end_of_turn_ms(float(p)) < clip.pause_ms for clip, p in scored[TurnKind.PAUSE]])

    def ended_at_once(eagerness: Eagerness) -> float:
        policy = SemanticPolicy(eagerness)
        return np.mean([policy.end_of_turn_ms(float(p)) == SCORE_AFTER_MS for _, p in scored[TurnKind.COMPLETE]])

    assert taken_over(Eagerness.LOW) <= taken_over(Eagerness.MEDIUM) <= 0.1
    assert taken_over(Eagerness.AUTO) == taken_over(Eagerness.MEDIUM)
    assert taken_over(Eagerness.HIGH) > 0.5  # high answers when the model says complete, pauses or not
    assert ended_at_once(Eagerness.HIGH) > ended_at_once(Eagerness.MEDIUM) >= ended_at_once(Eagerness.LOW)


async def test_the_scorer_runs_the_real_model_off_the_loop():
    model = turn_model()
    audios = [load_16k(name) for name in ("weather_today.wav", "pair_turn1_name.wav", "pair_turn2_recall.wav")]
    scorer = TurnScorer(lambda: model, max_batch=2)
    try:
        answers = await asyncio.wait_for(asyncio.gather(*(scorer.score(a) for a in audios)), 60)
    finally:
        scorer.close()
    np.testing.assert_allclose(answers, model(audios), rtol=0, atol=1e-5)
    assert scorer.calls == 2  # one turn alone, then the two that waited for it
