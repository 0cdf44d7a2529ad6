"""The latency goal of the bench's report (realtime/bench/goal.py): which levels meet it, and the users at it."""

from __future__ import annotations

import pytest

from realtime.bench.goal import LatencyGoal
from realtime.bench.metrics import TurnMetrics


def turns(*ttfa_ms, status="incomplete", underruns=0, **extra) -> list[TurnMetrics]:
    return [TurnMetrics(0, i, "a.wav", status, ttfa_ms=t, underruns=underruns, **extra) for i, t in enumerate(ttfa_ms)]


GOAL = LatencyGoal(600)


def test_a_level_within_the_p95_and_without_underruns_meets_the_goal():
    assert GOAL.meets(turns(100, 200, 590, status="completed"))
    assert GOAL.meets(turns(100, 200, 590))  # a forced length ends the reply as incomplete


@pytest.mark.parametrize(
    "level",
    [
        turns(100, 200, 700),  # p95 over the goal
        turns(100, 200, underruns=1),  # a starved player
        turns(100, 200) + turns(None, status="failed"),  # a turn without a reply
        turns(100, 200) + turns(None),  # a reply without sound
        [],
    ],
)
def test_a_level_misses_the_goal(level):
    assert not GOAL.meets(level)


def test_a_talked_over_turn_does_not_count():
    level = turns(100, 200) + turns(None, status="cancelled", barge_in_kind="cancelled")
    assert GOAL.meets(level)


def test_users_at_the_goal_stop_at_the_first_level_that_misses_it():
    good, bad = turns(100, 200), turns(100, 900)
    assert GOAL.users_at_goal([(8, good), (4, good), (12, bad), (16, good)]) == 8
    assert GOAL.users_at_goal([(4, bad), (8, good)]) == 0


def test_the_goal_must_be_positive():
    with pytest.raises(ValueError, match="> 0 ms"):
        LatencyGoal(0)
