"""A reply's start queues its device work without the host waiting for the GPU: the talker's prefill is prepared right
behind the thinker's decode step on the same stream, and a host wait there left the GPU idle while the host did the
prefill's bookkeeping (one reply profiled on an H100: ~5 ms waiting inside the speaker's bos embedding).
``torch.cuda.set_sync_debug_mode("error")`` makes any call that waits for the device (a copy from pageable memory, a
read) raise."""

from __future__ import annotations

import pytest
import torch

from conftest import greedy_stage_config


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@torch.inference_mode()
def test_a_talker_start_queues_its_work_without_waiting(tiny_model_dir):
    from pipeline.core.engine_core import EngineCore
    from pipeline.models.qwen2_5_omni.checkpoint import load_checkpoint

    cfg = greedy_stage_config("cuda", token2wav={"worker_thread": "off", "compile": "off"})
    ckpt = load_checkpoint(
        tiny_model_dir,
        devices={"thinker": "cuda", "talker": "cuda", "token2wav": "cuda"},
        dtypes={"thinker": torch.float32, "talker": torch.float32},
    )  # the config's dtypes
    core = EngineCore(ckpt, cfg, seed=0)
    special, bos_token = core.special, next(iter(ckpt.speakers.values())).bos_token
    ids = [special.codec_pad, special.codec_bos]
    prompt = torch.randn(5, core.runner.talker.proj.in_features, device="cuda", dtype=core.runner.talker.dtype)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        bos = core.runner.thinker.embed([bos_token])
        core.runner.talker.sampler.reset(0, ids)
        logits = core.runner.talker.prefill(
            torch.cat([prompt, bos.to(prompt.dtype), prompt[:1]]), codec_pad=ids[0], codec_bos=ids[1], slot=0
        )
        with pytest.raises(RuntimeError):  # the mode does catch a wait: a read
            logits.sum().item()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert logits.shape == (core.runner.talker.head.out_features,) and torch.isfinite(logits).all()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA: without prefill graphs there is no row budget")
@torch.inference_mode()
def test_the_scheduler_admits_a_step_s_prefill_chunks_up_to_the_captured_prefill_graph(tiny_model_dir):
    """A step's prefill chunks run as one replay of the largest prefill graph; the scheduler's row budget must be that
    graph's size (a budget read before the graphs were captured was None: a burst of new conversations then ran one
    eager prefill of every chunk, a step of several hundred ms on the H100)."""
    from pipeline.core.engine_core import EngineCore
    from pipeline.models.qwen2_5_omni.checkpoint import load_checkpoint

    cfg = greedy_stage_config("cuda", token2wav={"worker_thread": "off", "compile": "off"})
    ckpt = load_checkpoint(
        tiny_model_dir,
        devices={"thinker": "cuda", "talker": "cuda", "token2wav": "cuda"},
        dtypes={"thinker": torch.float32, "talker": torch.float32},
    )
    core = EngineCore(ckpt, cfg, seed=0)
    assert core.runner.thinker.prefill_rows == 512
    assert core.scheduler.cfg.prefill_rows == core.runner.thinker.prefill_rows
