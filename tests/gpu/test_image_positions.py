"""The CUDA decode paths rotate by TMRoPE positions as the eager one does: a conversation with pictures (explicit 3-D
positions in the prefill, a rope shift in every decode row) answered by the thinker on the GPU through eager steps,
CUDA graphs (graphed prefill rows with 3-D positions, graphed decode) and graphs with the fused RoPE kernel, on the
sharpened checkpoint where a wrong position changes the greedy tokens; likewise the talker's codes of spoken replies
(its prompt at the thinker's 3-D positions, its decode rows and chains at a rope shift). float32, so the paths differ
only by summation order."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
import torch

from conftest import greedy_stage_config

PARTS = (
    "Look:",
    np.random.default_rng(1).integers(0, 256, (60, 90, 3), dtype=np.uint8),
    "and",
    np.random.default_rng(2).integers(0, 256, (120, 40, 3), dtype=np.uint8),
    "what is it?",
)


async def _turns(engine, modalities: frozenset = frozenset({"text"}), codes: bool = False) -> tuple[list, list]:
    """Two replies to a conversation with pictures: their text ids, or with ``codes`` their codec codes."""
    conv = engine.conversation()
    replies = []
    await conv.add_content("u1", PARTS[:2])
    await engine.wait_idle()  # the first picture prefilled in the background: the rest is a second chunk
    await conv.add_content("u2", PARTS[2:])
    for item in ("a1", "a2"):
        done = await conv.respond(item_id=item, modalities=modalities, max_output_tokens=12).wait()
        assert done.error is None, done.error
        replies.append(list(done.audio_codes if codes else done.text_token_ids))
        await conv.add_content(f"u-{item}", ("and now?", PARTS[1]))
    await conv.close()
    return replies[0], replies[1]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_decode_paths_equal_the_eager_one_with_pictures(sharp_model_dir):
    from pipeline.engine import OmniEngine

    results = {}
    for name, graphs, fused in (("eager", False, False), ("graphs", True, False), ("graphs+fused", True, True)):
        cfg = greedy_stage_config(
            "cuda", thinker={"cuda_graphs": graphs, "fused_decode": fused}, engine={"process": "off"}
        )
        engine = OmniEngine.from_pretrained(sharp_model_dir, cfg, seed=0)
        try:
            thinker = engine.core.runner.thinker
            assert (thinker.decoder.fused is not None) == fused
            results[name] = asyncio.run(_turns(engine))
            if graphs:
                assert thinker.batched.replays > 0 and thinker.prefills.replays > 0, "the graphs ran"
        finally:
            engine.close()
    cpu = OmniEngine.from_pretrained(sharp_model_dir, greedy_stage_config(), seed=0)
    try:
        results["cpu"] = asyncio.run(_turns(cpu))
    finally:
        cpu.close()
    assert results["graphs"] == results["eager"], results
    assert results["graphs+fused"] == results["eager"], results
    assert results["cpu"] == results["eager"], results


async def _spoken_turns(engine) -> tuple[tuple[list, list], int]:
    """The codes of two spoken replies (:func:`_turns`) and the engine's chained talker steps so far."""
    codes = await _turns(engine, frozenset({"text", "audio"}), codes=True)
    return codes, (await engine.stats()).talker_chains_total


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_talker_paths_equal_the_eager_one_with_pictures(sharp_model_dir):
    """The talker's codes of spoken replies through eager steps, CUDA graphs (graphed prefill rows with 3-D positions,
    graphed decode rows and chains with a rope shift) and graphs with the fused RoPE kernel, and on the CPU."""
    from pipeline.engine import OmniEngine

    results = {}
    for name, graphs, fused in (("eager", False, False), ("graphs", True, False), ("graphs+fused", True, True)):
        stage = {"cuda_graphs": graphs, "fused_decode": fused}
        cfg = greedy_stage_config("cuda", thinker=stage, talker={**stage, "max_tokens": 80}, engine={"process": "off"})
        engine = OmniEngine.from_pretrained(sharp_model_dir, cfg, seed=0)
        try:
            talker = engine.core.runner.talker
            assert (talker.decoder.fused is not None) == fused
            results[name], chains = asyncio.run(_spoken_turns(engine))
            if graphs:
                assert talker.batched.replays > 0 and talker.prefills.replays > 0, "the graphs ran"
            assert chains > 0, "chained talker steps ran"
        finally:
            engine.close()
    cpu = OmniEngine.from_pretrained(sharp_model_dir, greedy_stage_config(talker={"max_tokens": 80}), seed=0)
    try:
        results["cpu"], _ = asyncio.run(_spoken_turns(cpu))
    finally:
        cpu.close()
    assert all(len(codes) > 30 for codes in results["eager"]), results
    assert results["graphs"] == results["eager"], results
    assert results["graphs+fused"] == results["eager"], results
    assert results["cpu"] == results["eager"], results
