"""``talker.chain_steps``: while the talker is the engine's only work, several of its decode steps are queued at once,
each fed on the device with the code the step before sampled. Same codes, same audio as one step at a time; the chain
ends where a chunk becomes ready, and never runs while anything else waits for the engine."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch
import yaml

from conftest import greedy_stage_config, run_spoken_reply
from pipeline.config import DEFAULT_STAGE_CONFIG, ConfigError, SamplingConfig, parse_stage_config
from pipeline.runners.sampling import SampleRows

pytestmark = pytest.mark.slow

SAMPLED = SamplingConfig(do_sample=True, temperature=0.9, top_k=40, top_p=0.8, repetition_penalty=1.05)
"""The reference's talker sampling: the chain must carry the noise counters, not only the codes."""


def make_core(tiny_model_dir, chain_steps: int, device: str = "cpu", min_codes: int = 40, max_codes: int = 40):
    from pipeline.core.engine_core import EngineCore
    from pipeline.models.qwen2_5_omni.checkpoint import load_checkpoint

    cfg = greedy_stage_config(
        device,
        thinker={"min_tokens": 6, "max_tokens": 6},
        talker={"min_tokens": min_codes, "max_tokens": max_codes, "chain_steps": chain_steps},
        token2wav={"worker_thread": "off", "compile": "off"},
    )
    cfg = replace(cfg, talker=replace(cfg.talker, sampling=SAMPLED))
    devices = {"thinker": device, "talker": device, "token2wav": device}
    dtypes = {"thinker": torch.float32, "talker": torch.float32}
    return EngineCore(load_checkpoint(tiny_model_dir, devices=devices, dtypes=dtypes), cfg, seed=7)


def chain_and_steps(core, steps: int, shifts: list[int] | None = None) -> tuple[list[list[int]], torch.Tensor]:
    """Two rows with their own seeds and counters (and rope shifts), from the same cache contents: the codes of
    ``decode`` called step by step with each code fed back (slots 0-1), and of one chain (slots 2-3)."""
    talker, special = core.runner.talker, core.special
    width = talker.proj.in_features
    prompt = torch.randn(5, width, generator=torch.Generator().manual_seed(3))
    for slot in range(4):
        talker.prefill(prompt, codec_pad=special.codec_pad, codec_bos=special.codec_bos, slot=slot)
        talker.sampler.reset(slot, {special.codec_pad, special.codec_bos})
    vectors = core.runner.thinker.embed([core.special.tts_text_pad]).expand(2, -1)
    seeds = [11, 12]

    def rows(slots, counters):
        return SampleRows.of(slots, force_continue=[True, False], seeds=seeds, counters=counters)

    codes, one_by_one = [3, 5], []
    for k in range(steps):
        _, sampled = talker.decode(
            codes, vectors, [0, 1], [5 + k, 5 + k], rows([0, 1], [3 + k, 3 + k]), rope_shifts=shifts
        )
        codes = sampled.tolist()
        one_by_one.append(codes)
    chained = talker.decode_chain(
        [3, 5], vectors, [2, 3], [5, 5], rows([2, 3], [3, 3]), steps=steps, rope_shifts=shifts
    )
    assert torch.equal(talker.sampler.seen[0:2], talker.sampler.seen[2:4])  # the repetition penalty's table too
    with pytest.raises(ValueError, match="at least one step"):
        talker.decode_chain([1], vectors[:1], [2], [5], rows([2, 3], [3, 3]), steps=0)
    return one_by_one, chained


@torch.inference_mode()
def test_a_chain_samples_what_steps_one_by_one_sample(tiny_model_dir):
    """Runner level: the chain's codes equal ``decode`` called step by step with each code fed back."""
    one_by_one, chained = chain_and_steps(make_core(tiny_model_dir, 1), steps=7)
    assert chained.shape == (7, 2) and chained.tolist() == one_by_one


@torch.inference_mode()
def test_a_chain_advances_rope_positions_like_steps_one_by_one(sharp_model_dir):
    """Rows with rope shifts (a conversation with pictures): the chain advances the rope positions with the cache
    indices, as steps one by one do; on the sharpened checkpoint the shifts change the codes, so this checks them."""
    core = make_core(sharp_model_dir, 1)
    one_by_one, chained = chain_and_steps(core, steps=7, shifts=[-3, -4])
    assert chained.tolist() == one_by_one
    assert chain_and_steps(core, steps=7)[1].tolist() != one_by_one


@torch.inference_mode()
def test_chains_change_when_codes_come_not_what_they_are(tiny_model_dir):
    off, on = make_core(tiny_model_dir, 1), make_core(tiny_model_dir, 8)
    codes_off, audio_off, progress_off = run_spoken_reply(off)
    codes_on, audio_on, progress_on = run_spoken_reply(on)
    assert len(codes_on) == 40 and codes_on == codes_off
    np.testing.assert_array_equal(audio_on, audio_off)
    assert off.stats().talker_chains_total == 0 < on.stats().talker_chains_total
    assert on.stats().talker_tokens_total == off.stats().talker_tokens_total
    assert len(progress_on) < len(progress_off)  # fewer engine steps for the same reply
    jumps = [(before, after) for before, after in zip(progress_on, progress_on[1:]) if after[1] - before[1] > 1]
    assert jumps and all(after[1] - before[1] <= 8 for before, after in jumps)
    assert all(before[0] == after[0] == 6 for before, after in jumps), "no chain while the thinker writes"
    # each chunk is made when its last code arrives, with chains as without: at the same code counts
    first_codes = [dict((chunks, codes) for _, codes, chunks in reversed(p)) for p in (progress_off, progress_on)]
    assert first_codes[0][1] == first_codes[1][1] == 24  # the quick first chunk's codes
    assert first_codes[0] == first_codes[1]


@torch.inference_mode()
def test_a_chain_stops_at_min_tokens_and_codes_after_a_stop_are_dropped(tiny_model_dir):
    """Between ``min_tokens`` and ``max_tokens`` the stop code may come: with the stop suppression one flag per chain,
    a chain never crosses ``min_tokens``, and the codes a chain sampled after a stop are not the reply's."""
    off = make_core(tiny_model_dir, 1, min_codes=30, max_codes=120)
    on = make_core(tiny_model_dir, 8, min_codes=30, max_codes=120)
    codes_off, audio_off, _ = run_spoken_reply(off)
    codes_on, audio_on, progress_on = run_spoken_reply(on)
    assert codes_on == codes_off and len(codes_on) >= 30
    np.testing.assert_array_equal(audio_on, audio_off)
    counts = [codes for _, codes, _ in progress_on]
    assert 30 in counts, "a chain ends at min_tokens"


@torch.inference_mode()
def test_no_chain_while_commands_wait(tiny_model_dir):
    core = make_core(tiny_model_dir, 8)
    core.commands_waiting = lambda: True
    run_spoken_reply(core)
    assert core.stats().talker_chains_total == 0


def test_chain_steps_is_a_positive_talker_setting():
    cfg = greedy_stage_config(talker={"chain_steps": 4})
    assert cfg.talker.chain_steps == 4 and not hasattr(cfg.thinker, "chain_steps")
    raw = yaml.safe_load(DEFAULT_STAGE_CONFIG.read_text())
    raw["stages"]["talker"]["chain_steps"] = 0
    with pytest.raises(ConfigError, match="talker.chain_steps must be a positive integer"):
        parse_stage_config(raw)
    raw["stages"]["talker"]["chain_steps"] = 8
    raw["stages"]["thinker"]["chain_steps"] = 8
    with pytest.raises(ConfigError, match="unknown field 'stages.thinker.chain_steps'"):
        parse_stage_config(raw)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@torch.inference_mode()
def test_on_the_gpu_a_chain_replays_one_graph_per_step(tiny_model_dir):
    on = make_core(tiny_model_dir, 8, device="cuda")
    replays = on.talker.batched.replays
    codes_on, audio_on, _ = run_spoken_reply(on)
    assert on.stats().talker_chains_total > 0 and on.talker.batched.eager_steps == 0
    assert on.talker.batched.replays - replays == len(codes_on) - 1  # every code but the prefill's from a replay
    off = make_core(tiny_model_dir, 1, device="cuda")
    codes_off, audio_off, _ = run_spoken_reply(off)
    assert codes_on == codes_off
    np.testing.assert_allclose(audio_on, audio_off, atol=1e-5)
