"""The bench's client worker processes (realtime.bench.workers): users dealt over shares, shares merged."""

from __future__ import annotations

import numpy as np
import pytest

from realtime.bench.client import UserPlan
from realtime.bench.metrics import AudioArrival, ResponseLog, ResponseOutcome, TurnLog
from realtime.bench.speech import Speech
from realtime.bench.workers import ClientShare, merge_shares, split_plans
from realtime.observe.loop_lag import LagSummary


def plans(n: int) -> list[UserPlan]:
    speech = Speech("a.wav", np.zeros(2400, dtype=np.float32), 0.0, 100.0, "energy")
    return [UserPlan(user=u, speeches=(speech,), start_delay_s=0.1 * u) for u in range(n)]


def test_split_deals_users_round_robin_and_never_makes_an_empty_share():
    shares = split_plans(plans(5), 2)
    assert [[p.user for p in share] for share in shares] == [[0, 2, 4], [1, 3]]
    assert [[p.user for p in share] for share in split_plans(plans(2), 4)] == [[0], [1]]
    assert [[p.user for p in share] for share in split_plans(plans(3), 1)] == [[0, 1, 2]]
    assert split_plans([], 3) == []
    with pytest.raises(ValueError, match="at least 1"):
        split_plans(plans(2), 0)


def turn(user: int, created: float, done: float) -> TurnLog:
    response = ResponseLog(
        f"r{user}", created, done_at=done, status=ResponseOutcome.COMPLETED, audio=[AudioArrival(created + 0.1, 480, 0)]
    )
    return TurnLog(user, 0, "a.wav", 0.0, 1.0, speech_stopped_at=1.5, responses=[response])


def share(logs: list[TurnLog], lag_ms: float, window: float | None = 500.0) -> ClientShare:
    return ClientShare(
        logs,
        [{"code": "x"}],
        window,
        {"input_audio_buffer.committed": len(logs)},
        LagSummary(10, 1.0, lag_ms, lag_ms),
        cpu_s=2.0,
        wall_s=10.0,
        users=len(logs),
    )


def test_merge_orders_turns_by_user_and_joins_replying_time_over_processes():
    # user 1's reply (process b) overlaps user 0's (process a): replying time is their union, 2.0 to 5.0
    a = share([turn(0, 2.0, 4.0), turn(2, 10.0, 11.0)], lag_ms=3.0)
    b = share([turn(1, 3.0, 5.0)], lag_ms=40.0)
    level = merge_shares([a, b], jitter_ms=60.0)
    assert [t.user for t in level.turns] == [0, 1, 2]
    assert level.replying_s == pytest.approx(3.0 + 1.0)
    assert level.silence_window_ms == 500.0
    assert level.counts == {"input_audio_buffer.committed": 3}
    assert len(level.errors) == 2
    assert [p["users"] for p in level.processes] == [2, 1]
    assert level.processes[1]["loop_lag_ms"]["p99_ms"] == 40.0


def test_merge_leaves_the_silence_window_out_when_processes_disagree():
    level = merge_shares([share([turn(0, 2.0, 3.0)], 1.0, 500.0), share([turn(1, 2.0, 3.0)], 1.0, 200.0)], jitter_ms=60)
    assert level.silence_window_ms is None
