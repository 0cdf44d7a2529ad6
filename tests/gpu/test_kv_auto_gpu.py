"""``kv_slots: auto`` on a GPU: the pools are sized from the device's free memory once the weights are on it, the
allocated pools are the plan's bytes, and what the engine allocates after them (graphs, activations, token2wav's
batches) stays within ``engine.kv_reserve_gib``.

Run on a host with a GPU: ``python -m pytest -s tests/gpu/test_kv_auto_gpu.py`` (``-s`` prints each model's plan and
what it used of the reserve). The ``tiny`` cases take seconds; ``random:7b`` builds the Qwen2.5-Omni-7B architecture
(about 3 minutes with token2wav's compile), ``random:qwen3-omni-30b-a3b`` the Qwen3-Omni one (65.7 GiB of weights:
a GPU of 80 GB or more, about 2 minutes)."""

from __future__ import annotations

import gc

import pytest
import torch

from conftest import greedy_stage_config, start_spoken_reply

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")

TEXT_TOKENS = 6
CODES = {"qwen2_5_omni": 120, "qwen3_omni": 30}
"""2.4 s of audio per reply: the first chunk, the ramp and steady chunks."""


def _free_gpu() -> None:
    gc.collect()
    torch.cuda.empty_cache()


def _pool_bytes(runner) -> int:
    """Device bytes the stages' pools and their per-slot sampler rows hold."""
    total = 0
    for stage in (runner.thinker, runner.talker):
        if stage is None:
            continue
        total += stage.pool.nbytes
        for sampler in (getattr(stage, "sampler", None), getattr(stage, "residual_sampler", None)):
            if sampler is not None:
                total += sampler.seen.numel() * sampler.seen.element_size()
    return total


@torch.inference_mode()
def test_auto_sizes_the_pools_to_the_free_memory_and_allocates_the_plan(tiny_model_dir):
    from pipeline.core.engine_core import EngineCore
    from pipeline.hosting.loaders import PretrainedCheckpoint
    from pipeline.kernels.devices import free_memory
    from pipeline.runners.kv_sizing import GIB

    cfg = greedy_stage_config("cuda", token2wav={"compile": "off"})
    assert (cfg.thinker.kv_slots, cfg.talker.kv_slots) == ("auto", "auto")  # the packaged setting
    ckpt = PretrainedCheckpoint(str(tiny_model_dir)).load(cfg)
    device = torch.device("cuda", torch.cuda.current_device())
    free = free_memory(device)
    core = EngineCore(ckpt, cfg, seed=0)
    plan = core.kv_plan
    # the tiny model's slots are a few MiB: the cap binds, and the talker's is token2wav.max_batch
    assert plan.slots("thinker") == cfg.engine.kv_auto_max_slots
    assert plan.slots("talker") == cfg.token2wav.max_batch
    assert core.runner.thinker.pool.slots.capacity == plan.slots("thinker")
    assert core.runner.talker.pool.slots.capacity == plan.slots("talker")
    assert _pool_bytes(core.runner) == sum(p.bytes for p in plan.pools)
    assert dict(plan.free) == {str(device): pytest.approx(free, abs=64 << 20)}
    stats = core.stats()
    assert (stats.kv_slots, stats.talker_kv_slots) == (plan.slots("thinker"), plan.slots("talker"))
    print(plan.summary(), f"({free / GIB:.1f} GiB free before)")
    del core, ckpt
    _free_gpu()


@torch.inference_mode()
def test_auto_refuses_a_reserve_larger_than_the_free_memory(tiny_model_dir):
    from pipeline.core.engine_core import EngineCore
    from pipeline.errors import ConfigError
    from pipeline.hosting.loaders import PretrainedCheckpoint

    cfg = greedy_stage_config("cuda", engine={"kv_reserve_gib": 100_000}, token2wav={"compile": "off"})
    ckpt = PretrainedCheckpoint(str(tiny_model_dir)).load(cfg)
    with pytest.raises(ConfigError, match="engine.kv_reserve_gib") as info:
        EngineCore(ckpt, cfg, seed=0)
    assert info.value.param == "stages.thinker.kv_slots"
    del ckpt
    _free_gpu()


@pytest.mark.parametrize("model", ["tiny", "random:7b", "random:qwen3-omni-30b-a3b"])
@torch.inference_mode()
def test_what_the_engine_allocates_after_the_pools_fits_the_reserve(model, tiny_model_dir):
    """The packaged stage config (bf16 for the large models, token2wav as packaged, auto slots) serves as many spoken
    replies at once as the talker's slots and a token2wav job hold, each with a prompt prefilled; the memory torch
    reserved at its peak beyond the weights and pools, plus what the driver gave outside torch meanwhile (graphs,
    kernels), is within the reserve."""
    from pipeline.core.engine_core import EngineCore
    from pipeline.hosting.loaders import PretrainedCheckpoint, RandomCheckpoint
    from pipeline.models.qwen2_5_omni.tiny import PRESETS as QWEN25
    from pipeline.models.qwen3_omni.tiny import PRESETS as QWEN3
    from pipeline.response_events import ResponseDone
    from pipeline.runners.kv_sizing import GIB

    family = "qwen3_omni" if "qwen3" in model else "qwen2_5_omni"
    weights_gib = 66.1 if family == "qwen3_omni" else 20.8
    if model != "tiny" and torch.cuda.get_device_properties(0).total_memory < (weights_gib + 6) * GIB:
        pytest.skip(f"{model} needs {weights_gib} GiB of weights and room for its pools")
    codes = CODES[family]
    dtype = "float32" if model == "tiny" else "auto"  # as the bench runs each (auto: bfloat16)
    cfg = greedy_stage_config(
        "cuda",
        family=family,
        thinker={"dtype": dtype, "min_tokens": TEXT_TOKENS},
        talker={"dtype": dtype, "min_tokens": codes, "max_tokens": codes},
    )
    if model == "tiny":
        loader = PretrainedCheckpoint(str(tiny_model_dir))
    else:
        loader = RandomCheckpoint((QWEN3["30b-a3b"] if family == "qwen3_omni" else QWEN25["7b"])())
    ckpt = loader.load(cfg)
    _free_gpu()
    device = torch.device("cuda", torch.cuda.current_device())
    torch.cuda.reset_peak_memory_stats(device)
    reserved0, (free0, total) = torch.cuda.memory_reserved(device), torch.cuda.mem_get_info(device)
    outside0 = total - free0 - reserved0  # the driver's memory outside torch's allocator: context, kernels, graphs
    core = EngineCore(ckpt, cfg, seed=0)
    replies = min(core.kv_plan.slots("talker"), cfg.token2wav.max_batch)
    events = [start_spoken_reply(core, f"c{i}", max_text_tokens=TEXT_TOKENS) for i in range(replies)]
    for _ in range(2000):
        if all(any(isinstance(e, ResponseDone) for e in ev) for ev in events):
            break
        core.step()
    assert all(any(isinstance(e, ResponseDone) for e in ev) for ev in events)
    torch.cuda.synchronize(device)
    free1 = torch.cuda.mem_get_info(device)[0]
    outside = (total - free1 - torch.cuda.memory_reserved(device)) - outside0
    pools = sum(p.bytes for p in core.kv_plan.pools)
    beyond = torch.cuda.max_memory_reserved(device) - reserved0 - pools + max(outside, 0)
    reserve = cfg.engine.kv_reserve_gib * GIB
    print(
        f"{model}: {core.kv_plan.summary()}; after {replies} spoken replies: {beyond / GIB:.2f} GiB used beyond the "
        f"pools at the peak ({max(outside, 0) / GIB:.2f} GiB outside torch), {free1 / GIB:.1f} GiB free now"
    )
    assert beyond <= reserve
    del core, ckpt
    _free_gpu()
