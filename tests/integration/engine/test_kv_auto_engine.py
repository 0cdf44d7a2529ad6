"""An engine built with ``kv_slots: auto`` on the CPU: both pools get the fixed CPU count (or the cap), the pools it
allocates are the plan's bytes (keys, values and each slot's sampler rows), the engine logs the plan once and reports
it in its stats; integer ``kv_slots`` are used as given."""

from __future__ import annotations

import logging

import pytest
import torch

from conftest import greedy_stage_config
from pipeline.runners.kv_sizing import CPU_KV_SLOTS

pytestmark = pytest.mark.slow


def _core(model_dir, cfg):
    from pipeline.core.engine_core import EngineCore
    from pipeline.hosting.loaders import PretrainedCheckpoint

    return EngineCore(PretrainedCheckpoint(str(model_dir)).load(cfg), cfg, seed=0)


def _allocated(stage) -> int:
    """Bytes a stage runner's pool and per-slot sampler tables hold."""
    samplers = [getattr(stage, name, None) for name in ("sampler", "residual_sampler")]
    return stage.pool.nbytes + sum(s.seen.numel() * s.seen.element_size() for s in samplers if s is not None)


@pytest.mark.parametrize("family", ["qwen2_5_omni", "qwen3_omni"])
def test_auto_on_the_cpu_builds_the_planned_pools(family, tiny_model_dir, qwen3_model_dir, caplog):
    cfg = greedy_stage_config(family=family)
    assert (cfg.thinker.kv_slots, cfg.talker.kv_slots) == ("auto", "auto")
    with caplog.at_level(logging.INFO, logger="pipeline.core.engine_core"):
        core = _core(qwen3_model_dir if family == "qwen3_omni" else tiny_model_dir, cfg)
    plan, runner = core.kv_plan, core.runner
    assert (plan.slots("thinker"), plan.slots("talker")) == (CPU_KV_SLOTS, CPU_KV_SLOTS)
    assert runner.thinker.pool.slots.capacity == runner.talker.pool.slots.capacity == CPU_KV_SLOTS
    thinker, talker = plan.pool("thinker"), plan.pool("talker")
    assert thinker is not None and talker is not None
    assert (thinker.bytes, talker.bytes) == (_allocated(runner.thinker), _allocated(runner.talker))
    assert (thinker.positions, talker.positions) == (runner.thinker.pool.max_len, runner.talker.pool.max_len)
    assert thinker.positions == cfg.thinker.max_context_tokens
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("KV pool: ")]
    assert lines == [plan.summary()]  # once, at load
    assert lines[0].startswith(f"KV pool: {CPU_KV_SLOTS} conversations × {thinker.positions} positions (")
    assert lines[0].endswith(" talker); on the CPU")
    stats = core.stats()
    assert (stats.kv_slots, stats.talker_kv_slots) == (CPU_KV_SLOTS, CPU_KV_SLOTS)
    assert stats.kv_capacity_tokens == CPU_KV_SLOTS * thinker.positions
    assert stats.talker_kv_capacity_tokens == CPU_KV_SLOTS * talker.positions


def test_integer_slots_and_the_cap_are_kept(tiny_model_dir):
    fixed = _core(tiny_model_dir, greedy_stage_config(thinker={"kv_slots": 3}, talker={"kv_slots": 2}))
    assert (fixed.runner.thinker.pool.slots.capacity, fixed.runner.talker.pool.slots.capacity) == (3, 2)
    assert [p.auto for p in fixed.kv_plan.pools] == [False, False]
    capped = _core(
        tiny_model_dir,
        greedy_stage_config(thinker={"kv_slots": "auto"}, talker={"kv_slots": 5}, engine={"kv_auto_max_slots": 4}),
    )
    assert (capped.kv_plan.slots("thinker"), capped.kv_plan.slots("talker")) == (4, 5)
    limited = _core(tiny_model_dir, greedy_stage_config(token2wav={"max_batch": 2}))
    assert (limited.kv_plan.slots("thinker"), limited.kv_plan.slots("talker")) == (CPU_KV_SLOTS, 2)


def test_a_text_only_checkpoint_has_a_thinker_pool_only(qwen3_text_model_dir):
    core = _core(qwen3_text_model_dir, greedy_stage_config(family="qwen3_omni"))
    assert [p.stage for p in core.kv_plan.pools] == ["thinker"]
    assert core.kv_plan.slots("thinker") == CPU_KV_SLOTS and core.runner.talker is None
    assert core.stats().talker_kv_slots == 0
    assert torch.device(core.kv_plan.pools[0].device).type == "cpu"
