"""The CUDA decode paths rotate by TMRoPE positions as the eager one does: a conversation with pictures (explicit 3-D
positions in the prefill, a rope shift in every decode row) answered by the thinker on the GPU through eager steps,
CUDA graphs (graphed prefill rows with 3-D positions, graphed decode) and graphs with the fused RoPE kernel, on the
sharpened checkpoint where a wrong position changes the greedy tokens. float32, so the paths differ only by
summation order."""

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


async def _turns(engine) -> tuple[list, list]:
    conv = engine.conversation()
    replies = []
    await conv.add_content("u1", PARTS[:2])
    await engine.wait_idle()  # the first picture prefilled in the background: the rest is a second chunk
    await conv.add_content("u2", PARTS[2:])
    for item in ("a1", "a2"):
        done = await conv.respond(item_id=item, modalities=frozenset({"text"}), max_output_tokens=12).wait()
        assert done.error is None, done.error
        replies.append(list(done.text_token_ids))
        await conv.add_content(f"u-{item}", ("and now?", PARTS[1]))
    await conv.close()
    return replies[0], replies[1]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_decode_paths_equal_the_eager_one_with_pictures(sharp_model_dir):
    from pipeline.engine import OmniEngine

    results = {}
    for name, graphs, fused in (("eager", False, False), ("graphs", True, False), ("graphs+fused", True, True)):
        cfg = greedy_stage_config("cuda", thinker={"cuda_graphs": graphs, "fused_decode": fused})
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
