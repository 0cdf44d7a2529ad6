"""``kv_slots: auto``: the sizing rule as a pure function (pipeline/runners/kv_sizing.py), its settings in the stage
config, and the capacity table of docs/engine.md, which must be the rule's output (scripts/kv_capacity.py)."""

from __future__ import annotations

import pytest
import yaml

from conftest import load_script
from pipeline.config import DEFAULT_STAGE_CONFIG, PACKAGED_STAGE_CONFIGS, load_stage_config, parse_stage_config
from pipeline.errors import ConfigError
from pipeline.runners.kv_sizing import (
    CPU_KV_SLOTS,
    GIB,
    KVPlan,
    PoolRequest,
    SlotShape,
    StagePool,
    largest_fitting,
    plan_kv_pools,
    talker_slot_positions,
)
from tests.helpers.paths import REPO

MIB = 1 << 20
THINKER = SlotShape(layers=1, kv_heads=1, head_dim=64, dtype_bytes=2, positions=4096, table_bytes=0)
"""1 MiB a slot."""
TALKER = SlotShape(layers=1, kv_heads=1, head_dim=64, dtype_bytes=2, positions=2048, table_bytes=0)
"""512 KiB a slot."""


def thinker(slots: int | None = None, device: str = "cuda:0") -> PoolRequest:
    return PoolRequest("thinker", device, THINKER, slots)


def talker(slots: int | None = None, device: str = "cuda:0", limit: int | None = None) -> PoolRequest:
    return PoolRequest("talker", device, TALKER, slots, limit=limit)


def plan(*requests: PoolRequest, free: dict[str, int] | None = None, reserve: int = 0, max_slots: int = 1000):
    return plan_kv_pools(requests, free=free or {}, reserve=reserve, max_slots=max_slots)


# --- the slot's bytes ----------------------------------------------------------------------------------------------


def test_a_slot_is_keys_and_values_of_every_layer_plus_its_table_rows() -> None:
    assert THINKER.bytes == 2 * 1 * 1 * 64 * 2 * 4096 == MIB
    assert SlotShape(48, 4, 128, 2, 8192, table_bytes=152064).bytes == 768 * MIB + 152064  # Qwen3-Omni's thinker


def test_the_talker_slot_holds_the_context_then_the_reply() -> None:
    assert talker_slot_positions(8192, 4096, frames=False) == 8192 + 4096 + 2
    assert talker_slot_positions(8192, 2048, frames=True) == 8192 + 2048 + 16


# --- the plan ------------------------------------------------------------------------------------------------------


def test_auto_takes_every_whole_conversation_the_memory_holds_beside_the_scratch_rows() -> None:
    per_conversation = THINKER.bytes + TALKER.bytes
    for n in (1, 7, 30):
        free = (n + 1) * per_conversation  # n slots and the scratch row of each pool
        exact = plan(thinker(), talker(), free={"cuda:0": free})
        assert (exact.slots("thinker"), exact.slots("talker")) == (n, n)
        assert exact.free_after == {"cuda:0": 0}
        if n > 1:
            assert plan(thinker(), talker(), free={"cuda:0": free - 1}).slots("thinker") == n - 1
    with pytest.raises(ConfigError):
        plan(thinker(), talker(), free={"cuda:0": 2 * per_conversation - 1})


def test_the_reserve_is_kept_outside_the_pools() -> None:
    free = 11 * THINKER.bytes
    assert plan(thinker(), free={"cuda:0": free}).slots("thinker") == 10
    assert plan(thinker(), free={"cuda:0": free}, reserve=3 * THINKER.bytes).slots("thinker") == 7
    result = plan(thinker(), free={"cuda:0": free}, reserve=3 * THINKER.bytes)
    assert result.free_after == {"cuda:0": 3 * THINKER.bytes}


def test_a_reserve_larger_than_the_free_memory_is_a_config_error_naming_the_settings() -> None:
    for reserve in (GIB, 10 * THINKER.bytes):  # larger than free; leaves less than one conversation and its scratch
        with pytest.raises(ConfigError) as info:
            plan(thinker(), talker(), free={"cuda:0": 10 * THINKER.bytes}, reserve=reserve)
        assert info.value.param == "stages.thinker.kv_slots"
        for setting in ("engine.kv_reserve_gib", "stages.thinker.max_context_tokens", "cuda:0"):
            assert setting in str(info.value)


def test_max_slots_caps_auto() -> None:
    free = {"cuda:0": 100 * THINKER.bytes}
    assert plan(thinker(), free=free, max_slots=64).slots("thinker") == 64
    assert plan(thinker(), free=free, max_slots=1000).slots("thinker") == 99


def test_a_stage_limit_caps_that_stage_and_leaves_its_memory_to_the_others() -> None:
    free = {"cuda:0": 30 * (THINKER.bytes + TALKER.bytes)}
    unlimited = plan(thinker(), talker(), free=free)
    limited = plan(thinker(), talker(limit=4), free=free)
    assert (unlimited.slots("thinker"), unlimited.slots("talker")) == (29, 29)
    assert limited.slots("talker") == 4
    # the talker's memory stops at 5 rows: the rest goes to more thinker slots
    assert limited.slots("thinker") == (30 * (THINKER.bytes + TALKER.bytes) - 5 * TALKER.bytes) // THINKER.bytes - 1


def test_an_integer_stage_keeps_its_slots_and_its_memory_counts_against_auto() -> None:
    free = {"cuda:0": 20 * THINKER.bytes}
    result = plan(thinker(), PoolRequest("talker", "cuda:0", THINKER, 8), free=free)
    assert (result.slots("thinker"), result.slots("talker")) == (20 - 9 - 1, 8)  # 9 talker rows, 1 scratch row
    assert [p.auto for p in result.pools] == [True, False]


def test_integers_alone_are_not_checked() -> None:
    result = plan(thinker(500), talker(500), free={"cuda:0": MIB})
    assert (result.slots("thinker"), result.slots("talker")) == (500, 500)
    assert result.free_after["cuda:0"] < 0


def test_stages_on_two_devices_get_the_count_both_hold() -> None:
    free = {"cuda:0": 41 * THINKER.bytes, "cuda:1": 11 * TALKER.bytes}
    result = plan(thinker(), talker(device="cuda:1"), free=free)
    assert (result.slots("thinker"), result.slots("talker")) == (10, 10)
    with pytest.raises(ConfigError, match="cuda:1") as info:
        plan(thinker(), talker(device="cuda:1"), free={"cuda:0": GIB, "cuda:1": TALKER.bytes})
    assert info.value.param == "stages.talker.kv_slots"


def test_on_the_cpu_auto_is_a_fixed_count() -> None:
    result = plan(thinker(device="cpu"), talker(device="cpu"))
    assert (result.slots("thinker"), result.slots("talker")) == (CPU_KV_SLOTS, CPU_KV_SLOTS)
    assert plan(thinker(device="cpu"), max_slots=4).slots("thinker") == 4
    assert plan(thinker(device="cpu"), talker(device="cpu", limit=2)).slots("talker") == 2
    assert result.free == () and result.free_after == {}


def test_a_missing_free_figure_for_an_auto_device_is_a_bug() -> None:
    with pytest.raises(ValueError, match="cuda:0"):
        plan(thinker())


def test_largest_fitting_at_its_edges() -> None:
    assert largest_fitting(lambda n: False, 10) == 0
    assert largest_fitting(lambda n: True, 10) == 10
    assert largest_fitting(lambda n: n <= 1, 10) == 1
    assert largest_fitting(lambda n: n <= 7, 10) == 7
    assert largest_fitting(lambda n: True, 0) == 0


# --- the log line --------------------------------------------------------------------------------------------------


def test_the_log_line_states_conversations_positions_memory_and_what_is_left() -> None:
    free = 8 * GIB + 10 * (THINKER.bytes + TALKER.bytes)
    result = plan(thinker(), talker(), free={"cuda:0": free}, reserve=8 * GIB)
    assert result.summary() == (
        "KV pool: 9 conversations × 4096 positions (10 MiB thinker, 5 MiB talker); free after: 8.0 GiB "
        "(kv_slots auto: 8.0 GiB kept for graphs, activations and token2wav)"
    )
    limited = KVPlan(
        (StagePool("thinker", "cuda:0", 64, 8192, 29 * GIB, True), StagePool("talker", "cuda:1", 16, 12290, GIB, True)),
        (("cuda:0", 40 * GIB), ("cuda:1", 10 * GIB)),
        4 * GIB,
    )
    assert limited.summary().startswith(
        "KV pool: 64 conversations × 8192 positions (29.0 GiB thinker, 1.0 GiB talker of 16 slots); "
        "free after: 11.0 GiB on cuda:0, 9.0 GiB on cuda:1"
    )
    cpu = plan(thinker(device="cpu"))
    assert cpu.summary() == "KV pool: 16 conversations × 4096 positions (17 MiB thinker); on the CPU"


# --- the stage config ----------------------------------------------------------------------------------------------


def _raw() -> dict:
    return yaml.safe_load(DEFAULT_STAGE_CONFIG.read_text())


def test_kv_slots_is_auto_or_a_positive_integer() -> None:
    for stage in ("thinker", "talker"):
        for good in ("auto", 1, 24):
            raw = _raw()
            raw["stages"][stage]["kv_slots"] = good
            assert getattr(parse_stage_config(raw), stage).kv_slots == good  # auto stays auto until the engine loads
        for bad in (0, -2, "8", "AUTO", 1.5, True, None):
            raw = _raw()
            raw["stages"][stage]["kv_slots"] = bad
            with pytest.raises(ConfigError, match="positive integer or auto") as info:
                parse_stage_config(raw)
            assert info.value.param == f"stages.{stage}.kv_slots"


def test_the_reserve_and_the_cap_are_checked() -> None:
    for key, good, bads in (
        ("kv_reserve_gib", (0, 2.5, 12), (-1, "4", True, None)),
        ("kv_auto_max_slots", (1, 256), (0, -1, 2.0, "64", True)),
    ):
        for value in good:
            raw = _raw()
            raw.setdefault("engine", {})[key] = value
            assert getattr(parse_stage_config(raw).engine, key) == value
        for value in bads:
            raw = _raw()
            raw.setdefault("engine", {})[key] = value
            with pytest.raises(ConfigError) as info:
                parse_stage_config(raw)
            assert info.value.param == f"engine.{key}"


def test_the_packaged_configs_say_auto_and_the_bench_keeps_its_counts() -> None:
    for path in PACKAGED_STAGE_CONFIGS.values():
        cfg = load_stage_config(path)
        assert (cfg.thinker.kv_slots, cfg.talker.kv_slots) == ("auto", "auto")
        assert (cfg.engine.kv_reserve_gib, cfg.engine.kv_auto_max_slots) == (4, 64)
    folder = DEFAULT_STAGE_CONFIG.parent
    bench = load_stage_config(folder / "bench_forced.yaml")
    assert (bench.thinker.kv_slots, bench.talker.kv_slots) == (64, 16)
    bench3 = load_stage_config(folder / "bench_forced_qwen3_omni.yaml")
    assert (bench3.thinker.kv_slots, bench3.talker.kv_slots) == (24, 16)


# --- the documentation's table -------------------------------------------------------------------------------------


def test_the_docs_table_is_the_rule_s_output() -> None:
    script = load_script("kv_capacity")
    assert script.table() in (REPO / "docs" / "engine.md").read_text()


def test_the_table_s_qwen3_weights_are_its_parameters_in_bf16() -> None:
    """The measured 65.7 GiB is the released parameter count in bfloat16 (so the table's two sources agree)."""
    from pipeline.models.qwen3_omni import released

    script = load_script("kv_capacity")
    assert round(released.PARAMETERS_B["total"] * 1e9 * 2 / GIB, 1) == script.QWEN3_MEASURED_BF16_GIB


def test_the_table_reads_the_packaged_h100_figure_for_qwen3() -> None:
    """The packaged qwen3_omni.yaml names what auto gives on an H100 at its context; the table's rule agrees."""
    script = load_script("kv_capacity")
    h100 = script.GPUS[0]
    assert script.conversations(script.qwen3_omni(), h100, 8192) == (8, 8)
    assert "8 of 8192" in PACKAGED_STAGE_CONFIGS["qwen3_omni"].read_text()
