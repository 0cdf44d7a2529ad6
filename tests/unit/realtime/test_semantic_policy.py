"""realtime.turns.semantic: semantic_vad's decisions from the silence length, the turn model's answer and the
eagerness, and the tracker that applies them to a session's silence runs (pure: the tests walk the runs by hand)."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given
from hypothesis import strategies as st

from realtime.turns.semantic import (
    Eagerness,
    EagernessLimits,
    EndTurn,
    ScoreTurn,
    SemanticPolicy,
    SemanticTurnTracker,
    SemanticVadConfig,
    TurnAction,
    TurnDecision,
)

CONFIG = SemanticVadConfig()
AFTER = CONFIG.score_after_ms


def walk(policy: SemanticPolicy, probability: float | None, *, answered_at: int = AFTER, step: int = 32) -> int:
    """The silence length (ms) at which a silence run of VAD frames of ``step`` ms ends, the model asked when the
    policy says so and answering ``probability`` once the silence reaches ``answered_at``."""
    asked = False
    for silence in range(0, 60_000, step):
        answer = probability if asked and silence >= answered_at else None
        decision = policy.decide(silence, answer, asked=asked)
        if decision.action is TurnAction.SCORE:
            asked = True
            decision = policy.decide(silence, probability if silence >= answered_at else None, asked=True)
        if decision.action is TurnAction.COMMIT:
            return silence
    raise AssertionError("the turn never ended")


def test_the_model_is_asked_once_the_silence_is_long_enough():
    policy = SemanticPolicy("medium")
    assert policy.decide(0, None, asked=False) == TurnDecision(TurnAction.WAIT, AFTER)
    assert policy.decide(AFTER - 1, None, asked=False) == TurnDecision(TurnAction.WAIT, AFTER)
    assert policy.decide(AFTER, None, asked=False) == TurnDecision(TurnAction.SCORE)


@pytest.mark.parametrize("eagerness", list(Eagerness))
def test_a_complete_turn_ends_as_soon_as_the_model_says_so(eagerness):
    policy = SemanticPolicy(eagerness)
    assert policy.decide(AFTER, 1.0, asked=True) == TurnDecision(TurnAction.COMMIT)
    assert policy.decide(AFTER, policy.limits.complete_at, asked=True).action is TurnAction.COMMIT
    assert walk(policy, 1.0) == 224  # the first 32 ms frame at or past 200 ms of silence


@pytest.mark.parametrize("eagerness", list(Eagerness))
def test_an_incomplete_turn_ends_at_its_eagerness_limit(eagerness):
    policy = SemanticPolicy(eagerness)
    limit = policy.limits.max_wait_ms
    below = policy.limits.complete_at - 0.01
    assert policy.decide(AFTER, below, asked=True) == TurnDecision(TurnAction.WAIT, limit)
    assert policy.decide(limit - 1, below, asked=True).action is TurnAction.WAIT
    assert policy.decide(limit, below, asked=True).action is TurnAction.COMMIT


def test_eagerness_orders_the_waits():
    low, medium, high = (SemanticPolicy(e) for e in ("low", "medium", "high"))
    for p in (0.0, 0.5, 0.9, None):
        assert high.end_of_turn_ms(p) <= medium.end_of_turn_ms(p) <= low.end_of_turn_ms(p), p
    assert high.end_of_turn_ms(0.1) < medium.end_of_turn_ms(0.1) < low.end_of_turn_ms(0.1)
    assert high.end_of_turn_ms(0.7) == AFTER < medium.end_of_turn_ms(0.7)  # only high trusts a middling "complete"
    # each outwaits a mid-sentence pause as its name asks: high takes most pauses, medium outwaits 1.2 s
    assert high.limits.max_wait_ms < 1000 and medium.limits.max_wait_ms > 1200 and low.limits.max_wait_ms >= 3000


def test_auto_is_medium():
    assert SemanticPolicy("auto").limits == SemanticPolicy("medium").limits
    assert Eagerness.AUTO.resolved() is Eagerness.MEDIUM and Eagerness.HIGH.resolved() is Eagerness.HIGH


def test_without_an_answer_the_turn_ends_on_silence_alone():
    for eagerness in ("low", "medium", "high"):
        policy = SemanticPolicy(eagerness)
        wait = policy.limits.unscored_wait_ms
        assert policy.decide(AFTER, None, asked=True) == TurnDecision(TurnAction.WAIT, wait)
        assert policy.decide(wait, None, asked=True).action is TurnAction.COMMIT
    assert SemanticPolicy("medium").limits.unscored_wait_ms == 500  # server VAD's default window


def test_a_late_answer_moves_the_end():
    policy = SemanticPolicy("medium")
    # the model answers at 400 ms: incomplete keeps the turn open past the silence-only window
    assert walk(policy, 0.1, answered_at=400, step=4) == policy.limits.max_wait_ms
    # an answer slower than the silence-only window comes too late: the turn already ended there
    assert walk(policy, 0.1, answered_at=800, step=4) == policy.limits.unscored_wait_ms
    # a "complete" that arrives late ends the turn on arrival
    assert walk(policy, 1.0, answered_at=416, step=4) == 416


@given(
    eagerness=st.sampled_from(list(Eagerness)),
    probability=st.none() | st.floats(0.0, 1.0),
    silence=st.integers(0, 10_000),
    later=st.integers(0, 10_000),
)
def test_once_ended_a_turn_stays_ended(eagerness, probability, silence, later):
    policy = SemanticPolicy(eagerness)
    if policy.decide(silence, probability, asked=True).action is TurnAction.COMMIT:
        assert policy.decide(silence + later, probability, asked=True).action is TurnAction.COMMIT
    decision = policy.decide(silence, probability, asked=True)
    if decision.action is TurnAction.WAIT:
        assert decision.until_ms > silence
        assert policy.decide(decision.until_ms, probability, asked=True).action is TurnAction.COMMIT


@pytest.mark.parametrize(
    "change",
    [
        {"complete_at": 1.5},
        {"complete_at": True},
        {"max_wait_ms": -1},
        {"unscored_wait_ms": 2.5},
    ],
)
def test_bad_limits_are_refused(change):
    with pytest.raises(ValueError):
        dataclasses.replace(CONFIG.medium, **change)


def test_bad_config_and_inputs_are_refused():
    with pytest.raises(ValueError, match="score_after_ms"):
        SemanticVadConfig(score_after_ms=-5)
    with pytest.raises(ValueError, match="high.max_wait_ms"):
        SemanticVadConfig(score_after_ms=800, high=EagernessLimits(0.5, 700, 300))
    with pytest.raises(ValueError):
        SemanticPolicy("eager")
    policy = SemanticPolicy("medium")
    with pytest.raises(ValueError, match="probability"):
        policy.end_of_turn_ms(1.2)
    with pytest.raises(ValueError, match="silence_ms"):
        policy.decide(-1, None, asked=False)


def run_frames(tracker: SemanticTurnTracker, start: int, stop: int, step: int = 32) -> list:
    actions = []
    for silence in range(start, stop, step):
        actions.extend(tracker.silence(silence))
    return actions


def test_the_tracker_asks_once_and_ends_a_complete_turn_on_the_answer():
    tracker = SemanticTurnTracker(SemanticPolicy("medium"))
    tracker.speech()
    assert run_frames(tracker, 32, 224) == []
    assert tracker.silence(224) == [ScoreTurn(1)]
    assert run_frames(tracker, 256, 320) == []  # asked once per run
    assert tracker.scored(1, 0.99) == [EndTurn(288)]  # at the silence last reported
    assert run_frames(tracker, 320, 2000) == [] and tracker.scored(1, 0.99) == []  # ended: nothing more


def test_the_tracker_waits_out_an_incomplete_turn():
    tracker = SemanticTurnTracker(SemanticPolicy("medium"))
    assert tracker.silence(224) == [ScoreTurn(1)]
    assert tracker.scored(1, 0.1) == []
    assert run_frames(tracker, 256, 1300) == []
    assert tracker.silence(1312) == [EndTurn(1312)]


def test_an_answer_for_an_earlier_silence_run_is_ignored():
    tracker = SemanticTurnTracker(SemanticPolicy("medium"))
    assert tracker.silence(224) == [ScoreTurn(1)]
    tracker.speech()  # the user goes on before the model answered
    assert tracker.silence(32) == [] and tracker.scored(1, 1.0) == []
    assert tracker.silence(224) == [ScoreTurn(2)]
    assert tracker.scored(2, 1.0) == [EndTurn(224)]
    tracker.speech()  # the next turn
    assert tracker.silence(224) == [ScoreTurn(3)]


def test_without_an_answer_in_time_the_turn_ends_on_silence():
    tracker = SemanticTurnTracker(SemanticPolicy("medium"))
    assert tracker.silence(224) == [ScoreTurn(1)]
    assert tracker.scored(1, None) == []  # the scorer was saturated: "unknown"
    assert tracker.silence(512) == [EndTurn(512)]  # server VAD's window
    slow = SemanticTurnTracker(SemanticPolicy("medium"))
    slow.silence(224)
    assert slow.silence(512) == [EndTurn(512)]  # no answer yet: the silence-only window still holds
    assert slow.scored(1, 0.1) == []  # too late


def test_after_the_model_failed_turns_end_on_silence_alone():
    tracker = SemanticTurnTracker(SemanticPolicy("medium"))
    assert tracker.silence(224) == [ScoreTurn(1)]
    assert tracker.unavailable() == []  # 224 ms: not yet the silence-only window
    assert tracker.silence(512) == [EndTurn(512)]
    assert not tracker.model_available
    tracker.speech()
    assert run_frames(tracker, 32, 500) == []  # never asked again
    assert tracker.silence(512) == [EndTurn(512)]
    answered = SemanticTurnTracker(SemanticPolicy("medium"))
    answered.silence(224)
    assert answered.scored(1, 0.1) == [] and answered.silence(608) == []  # incomplete: waiting up to 1.3 s
    assert answered.unavailable() == [EndTurn(608)]  # learnt of the failure past the silence-only window
    coarse = SemanticTurnTracker(SemanticPolicy("high"))
    assert coarse.silence(320) == [EndTurn(320)]  # first heard past high's 300 ms window: no model call to make
