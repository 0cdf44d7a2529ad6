"""A spoken Qwen3-Omni reply through the engine (tiny checkpoints, CPU) is the one the eager frame path made before a
frame became one graph-captured step: the same frames (all 16 codebooks) and the same audio, greedy and sampled,
though the engine now chains frames once the text is over and the reference makes them one per step with HF's code
predictor over a ``DynamicCache`` (tests/helpers/frame_reference.py)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch

from conftest import greedy_stage_config, run_spoken_reply
from pipeline.config import RESIDUAL_SAMPLING, TALKER_SAMPLING
from tests.helpers.frame_reference import EagerFrames

pytestmark = pytest.mark.slow

FRAMES = 30


def make_core(model_dir, *, sampled: bool, reference: bool):
    from pipeline.core.engine_core import EngineCore
    from pipeline.models.qwen3_omni.checkpoint import load_checkpoint

    cfg = greedy_stage_config(
        family="qwen3_omni",
        thinker={"min_tokens": 6, "max_tokens": 6},
        talker={"min_tokens": FRAMES, "max_tokens": FRAMES, "chain_steps": 1 if reference else 8},
        token2wav={"worker_thread": "off"},
    )
    if sampled:
        cfg = replace(cfg, talker=replace(cfg.talker, sampling=TALKER_SAMPLING, residual_sampling=RESIDUAL_SAMPLING))
    devices = {"thinker": "cpu", "talker": "cpu", "token2wav": "cpu"}
    ckpt = load_checkpoint(model_dir, devices=devices, dtypes={"thinker": torch.float32, "talker": torch.float32})
    core = EngineCore(ckpt, cfg, seed=7)
    if reference:
        EagerFrames(core.runner.talker, ckpt.talker).install()
    return core


# each checkpoint once, each sampling mode once: the sharpened checkpoint (where wrong positions change the codes)
# greedy, the plain one sampled (where the per-codebook noise counters show)
@pytest.mark.parametrize(
    ("model_dir", "sampled"),
    [("qwen3_sharp_model_dir", False), ("qwen3_model_dir", True)],
    ids=["sharp-greedy", "plain-sampled"],
)
@torch.inference_mode()
def test_a_reply_is_the_one_the_eager_frames_made(request, model_dir, sampled):
    model_dir = request.getfixturevalue(model_dir)
    ours = make_core(model_dir, sampled=sampled, reference=False)
    codes, audio, _ = run_spoken_reply(ours)
    want_codes, want_audio, _ = run_spoken_reply(make_core(model_dir, sampled=sampled, reference=True))
    assert len(codes) == FRAMES and codes == want_codes
    np.testing.assert_array_equal(audio, want_audio)
    assert ours.observer.counters["talker_chains_total"] > 0, "the frames after the text came in chains"
    assert len({frame[1:] for frame in codes}) > FRAMES // 2, "the residual codebooks vary"
