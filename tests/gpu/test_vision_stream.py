"""The vision tower beside the decode steps on the GPU, on both families' tiny checkpoints: pictures encoded on the
vision worker's stream equal the same encode on the engine's stream (embeddings and deepstack features, bit for bit),
and a decode step queued on the engine's stream after the flush that handed the pictures over does not wait for
them. Checked by stream order, not by timing: the worker's stream is first held by a long sleep kernel; the decode
step and a read of a picture's embeddings on the engine's stream complete while it still sleeps (the read sees the
NaNs written before the flush), and the pictures turn ready only after it."""

from __future__ import annotations

import time

import numpy as np
import pytest
import torch

from conftest import greedy_stage_config

SLEEP_CYCLES = 2_000_000_000
"""About a second on a GPU clocked near 2 GHz: far longer than a tiny decode step and a copy."""
WAIT_S = 60.0


def _core(model_dir, family: str):
    from pipeline.core.engine_core import EngineCore
    from pipeline.hosting.loaders import PretrainedCheckpoint

    cfg = greedy_stage_config(
        "cuda",
        family=family,
        thinker={"vision_worker": "on"},
        token2wav={"worker_thread": "off", **({"compile": "off"} if family == "qwen2_5_omni" else {})},
        engine={"process": "off"},
    )
    return EngineCore(PretrainedCheckpoint(str(model_dir)).load(cfg), cfg, seed=0)


def _wait(condition, what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.002)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("family", ["qwen2_5_omni", "qwen3_omni"])
@torch.inference_mode()
def test_the_side_stream_encode_equals_the_same_stream_one_and_decode_does_not_wait_for_it(request, family):
    model_dir = request.getfixturevalue("tiny_model_dir" if family == "qwen2_5_omni" else "qwen3_model_dir")
    core = _core(model_dir, family)
    encodes, thinker = core.image_encodes, core.runner.thinker
    assert encodes is not None and encodes.worker is not None and encodes.worker.stream is not None
    rng = np.random.default_rng(3)
    pictures = [rng.integers(0, 256, size, dtype=np.uint8) for size in ((60, 90, 3), (120, 40, 3))]
    engine_stream = torch.cuda.Stream(priority=-1)  # as the engine thread's decode stream
    try:
        with torch.cuda.stream(engine_stream):
            inputs = [encodes.prep.preprocess([p]) for p in pictures]
            same_stream = thinker.encode_images([(vi.pixel_values, vi.grid_thw) for vi in inputs])
            blocks = [encodes.picture([p]) for p in pictures]
            for block in blocks:
                for tensor in (block.embeds, *block.deepstack):
                    tensor.fill_(float("nan"))
            _wait(lambda: encodes.prep.pending == 0, "the preprocessing")
            with torch.cuda.stream(encodes.worker.stream):
                torch.cuda._sleep(SLEEP_CYCLES)  # the worker's stream is busy: its encode queues behind this
            assert encodes.flush() == 0 and not encodes.worker.idle, "both pictures handed to the worker, one job"
            step = thinker.decode([0], [thinker.pool.scratch_slot], [0])
            read = blocks[0].embeds.clone()
            after = torch.cuda.Event()
            after.record(engine_stream)
        after.synchronize()
        assert not encodes.worker.stream.query(), "the worker's stream still sleeps"
        assert torch.isfinite(step.logits).all(), "the decode step ran"
        assert torch.isnan(read).all(), "read before the worker wrote: the engine's stream did not wait for it"
        assert not any(block.ready for block in blocks)
        with torch.cuda.stream(engine_stream):
            _wait(lambda: (encodes.flush(), all(block.ready for block in blocks))[1], "the encode")
            for block, want in zip(blocks, same_stream):
                assert block.error is None
                tokens, deepstack = (want, ()) if isinstance(want, torch.Tensor) else (want.tokens, want.deepstack)
                assert torch.equal(block.embeds, tokens)
                assert len(block.deepstack) == len(deepstack) and (family == "qwen2_5_omni") == (not deepstack)
                assert all(torch.equal(got, feature) for got, feature in zip(block.deepstack, deepstack))
        torch.cuda.synchronize()
    finally:
        core.close()
