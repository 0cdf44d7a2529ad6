"""Placement of sessions over engines and capacity-aware admission (``realtime/engines/placement.py``), and the
per-engine
stage configs of data parallel (``realtime/engines/pool.py``): no engine runs here."""

from __future__ import annotations

import pytest

from pipeline.config import load_stage_config
from pipeline.errors import ConfigError
from pipeline.response_events import EngineStats
from realtime.engines.placement import EngineLoad, EngineSlot, EngineSlots, EngineState, PlacementCode, choose_engine
from realtime.engines.pool import check_devices, gpus_per_engine, replica_configs, total_stats
from realtime.errors import ErrorType

SERVING, FAILED = EngineState.SERVING, EngineState.FAILED


def test_the_engine_with_the_most_free_sessions_wins():
    loads = [EngineLoad(0, SERVING, 3, 4), EngineLoad(1, SERVING, 1, 4), EngineLoad(2, SERVING, 2, 4)]
    assert choose_engine(loads) == 1


def test_ties_go_to_the_fewest_live_responses_then_the_lowest_index():
    assert choose_engine([EngineLoad(0, SERVING, 1, 4, responses=2), EngineLoad(1, SERVING, 1, 4, responses=1)]) == 1
    assert choose_engine([EngineLoad(0, SERVING, 1, 4, responses=1), EngineLoad(1, SERVING, 1, 4, responses=1)]) == 0


def test_free_capacity_counts_before_responses():
    """A busy engine with room beats an idle one with less room."""
    assert choose_engine([EngineLoad(0, SERVING, 3, 4, responses=0), EngineLoad(1, SERVING, 0, 4, responses=9)]) == 1


def test_failed_and_full_engines_take_no_session():
    assert choose_engine([EngineLoad(0, FAILED, 0, 4), EngineLoad(1, SERVING, 3, 4)]) == 1
    assert choose_engine([EngineLoad(0, FAILED, 0, 4), EngineLoad(1, SERVING, 4, 4)]) is None
    assert choose_engine([]) is None


def test_sessions_alternate_over_equal_engines_and_keep_their_engine():
    slots = EngineSlots(["a", "b"], max_sessions=16, capacity=8)
    placed = [slots.admit() for _ in range(4)]
    assert [slot.index for slot in placed] == [0, 1, 0, 1]
    assert [slot.engine for slot in placed] == ["a", "b", "a", "b"]
    assert (slots.active, slots.sessions(0), slots.sessions(1)) == (4, 2, 2)
    placed[0].release()
    placed[0].release()  # once
    assert (slots.active, slots.sessions(0)) == (3, 1)
    assert slots.admit().index == 0  # the freed room is the most headroom


def test_the_total_limit_refuses_first_with_its_own_code():
    slots = EngineSlots(["a", "b"], max_sessions=2, capacity=8)
    held = [slots.admit(), slots.admit()]
    refusal = slots.admit()
    assert not isinstance(refusal, EngineSlot)
    assert refusal.code == "session_limit_reached" and refusal.type is ErrorType.RATE_LIMIT
    assert slots.try_acquire() is None and slots.refusal().code == "session_limit_reached"
    held[0].release()
    assert isinstance(slots.admit(), EngineSlot)


def test_engines_at_capacity_refuse_with_engine_capacity_reached():
    slots = EngineSlots(["a", "b"], max_sessions=16, capacity=1)
    held = [slots.admit(), slots.admit()]
    refusal = slots.admit()
    assert refusal.code == PlacementCode.ENGINE_CAPACITY_REACHED and "maximum of 1 sessions" in refusal.message
    assert slots.active == 2, "a refused session holds no slot"
    held[1].release()
    assert slots.admit().index == 1


def test_a_failed_engine_ends_its_sessions_and_takes_no_new_ones():
    slots = EngineSlots(["a", "b"], max_sessions=16, capacity=2)
    on_a, on_b, ended = slots.admit(), slots.admit(), []
    on_a.on_engine_failure(lambda: ended.append("a1"))
    on_b.on_engine_failure(lambda: ended.append("b1"))
    left = slots.admit()  # engine 0 again, released before the failure: not ended
    left.on_engine_failure(lambda: ended.append("gone"))
    left.release()
    assert slots.fail(0) == 1 and slots.fail(0) == 0  # idempotent
    assert ended == ["a1"]
    assert slots.state(0) is FAILED and slots.serving == 1
    assert [slots.admit().index for _ in range(1)] == [1]
    assert slots.admit().code == PlacementCode.ENGINE_CAPACITY_REACHED  # the survivor holds its 2
    late = []
    on_a.on_engine_failure(lambda: late.append("now"))  # registered after the failure: called at once
    assert late == ["now"]
    on_a.release()
    assert slots.sessions(0) == 0


def test_a_replaced_engine_serves_new_sessions_from_zero_while_the_old_ones_end():
    slots = EngineSlots(["a", "b"], max_sessions=16, capacity=2)
    old, ended = slots.admit(), []
    assert old.index == 0 and old.engine == "a"
    with pytest.raises(ValueError, match="serving"):
        slots.restarting(0)  # only a failed engine is restarted
    assert slots.fail(0) == 1
    slots.restarting(0)
    assert slots.state(0) is EngineState.RESTARTING and slots.admit().index == 1  # none placed while it loads
    assert slots.fail(0) == 0  # a restarting engine is not failed again
    slots.replace(0, "a2")
    assert slots.state(0) is SERVING and slots.engines == ("a2", "b") and slots.sessions(0) == 0
    new = slots.admit()
    assert (new.index, new.engine) == (0, "a2") and slots.sessions(0) == 1
    old.on_engine_failure(lambda: ended.append("old"))  # its engine failed, whatever serves at its index now
    new.on_engine_failure(lambda: ended.append("new"))
    assert ended == ["old"]
    old.release()  # counts against nothing of the new engine
    assert slots.sessions(0) == 1 and slots.active == 2
    with pytest.raises(ValueError, match="serving"):
        slots.replace(0, "a3")


def test_no_serving_engine_refuses_with_no_engine_available():
    slots = EngineSlots(["a"], max_sessions=16, capacity=16)
    slots.fail(0)
    refusal = slots.admit()
    assert refusal.code == PlacementCode.NO_ENGINE_AVAILABLE and refusal.type is ErrorType.SERVER


def test_a_failing_callback_does_not_keep_the_other_sessions_from_ending(caplog):
    slots = EngineSlots(["a"], max_sessions=16, capacity=16)
    first, second, ended = slots.admit(), slots.admit(), []

    def broken() -> None:
        raise RuntimeError("boom")

    first.on_engine_failure(broken)
    second.on_engine_failure(lambda: ended.append("second"))
    assert slots.fail(0) == 2 and ended == ["second"]
    assert "ending a session of failed engine 0 failed" in caplog.text


def test_placement_reads_reported_responses():
    slots = EngineSlots(["a", "b"], max_sessions=16, capacity=4)
    slots.report_responses(0, 3)
    assert slots.admit().index == 1


@pytest.mark.parametrize("bad", [{"max_sessions": 0, "capacity": 1}, {"max_sessions": 1, "capacity": 0}])
def test_limits_below_one_are_refused(bad):
    with pytest.raises(ValueError):
        EngineSlots(["a"], **bad)


# --- per-engine stage configs -------------------------------------------------------------------


def _config(thinker: str, talker: str, token2wav: str):
    stages = {"thinker": {"device": thinker}, "talker": {"device": talker}, "token2wav": {"device": token2wav}}
    return load_stage_config(overrides={"stages": stages})


def test_one_engine_keeps_its_config():
    cfg = _config("cpu", "cpu", "cpu")
    assert replica_configs(cfg, 1) == [cfg]


def test_cpu_engines_stay_on_the_cpu_each_in_its_own_process():
    cfg = _config("cpu", "cpu", "cpu")
    assert cfg.engine.process is False
    replicas = replica_configs(cfg, 2)
    assert [(c.thinker.device, c.token2wav.device, c.engine.process) for c in replicas] == [("cpu", "cpu", True)] * 2
    check_devices(replicas, lambda: 0)  # needs no GPU


def test_gpu_engines_get_one_gpu_each():
    replicas = replica_configs(_config("cuda", "cuda", "cuda"), 3)
    assert [(c.thinker.device, c.talker.device, c.token2wav.device) for c in replicas] == [
        ("cuda:0", "cuda:0", "cuda:0"),
        ("cuda:1", "cuda:1", "cuda:1"),
        ("cuda:2", "cuda:2", "cuda:2"),
    ]
    assert replicas[1].thinker.dtype == "bfloat16"
    check_devices(replicas, lambda: 3)
    with pytest.raises(ConfigError, match="3 engines need 3 GPUs .* this machine has 2") as info:
        check_devices(replicas, lambda: 2)
    assert info.value.param == "data_parallel_size"


def test_engines_whose_stages_span_gpus_get_that_many_each():
    cfg = _config("cuda:0", "cuda:0", "cuda:1")
    assert gpus_per_engine(cfg) == 2
    replicas = replica_configs(cfg, 2)
    assert [(c.thinker.device, c.token2wav.device) for c in replicas] == [("cuda:0", "cuda:1"), ("cuda:2", "cuda:3")]
    with pytest.raises(ConfigError, match="need 4 GPUs"):
        check_devices(replicas, lambda: 2)


def test_a_data_parallel_size_below_one_is_refused():
    with pytest.raises(ConfigError, match="data parallel size must be >= 1"):
        replica_configs(_config("cpu", "cpu", "cpu"), 0)


def test_engine_stats_add_up():
    a = EngineStats(1, 2, 3, 4, 5, 6, thinker_tokens_total=7, audio_underruns_total=1)
    b = EngineStats(10, 20, 30, 40, 50, 60, thinker_tokens_total=70, device_memory_bytes=5)
    total = total_stats([a, b])
    assert (total.conversations, total.responses, total.pending_commands) == (11, 22, 66)
    assert (total.thinker_tokens_total, total.audio_underruns_total, total.device_memory_bytes) == (77, 1, 5)
    assert total_stats([a]) is a and total_stats([]) is None
