"""On CUDA a reply's frame-talker start is captured: its prefill replays a prefill graph (each position a row of one
captured step) and its first frame replays the first frame's graph (one row), and it makes the first frames the start
without graphs makes (an eager prefill, the frame eagerly): greedy, bfloat16, tiny Qwen3-Omni checkpoint. The graphed
prefill's rows attend one query at a time, so its hidden states are close to the eager prefill's, not equal; the frames
(argmax codes) are expected equal. Then: a start, and the talker inputs the stage makes on its way there, queue their
device work without the host waiting for the GPU (``torch.cuda.set_sync_debug_mode("error")`` raises at any wait).

Run on a GPU host: ``python -m pytest -q tests/gpu/test_talker_start_graphs.py``."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from pipeline.runners.sampling import SampleRows
from tests.helpers.frame_talkers import GREEDY, PROMPTS, make_runner, start_rows

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")

CUDA = {"thinker": "cuda", "talker": "cuda", "token2wav": "cuda"}
BF16 = torch.bfloat16


@pytest.fixture(scope="module")
def checkpoint(qwen3_model_dir):
    from pipeline.models.qwen3_omni.checkpoint import load_checkpoint

    return load_checkpoint(qwen3_model_dir, devices=CUDA, dtypes={"thinker": BF16, "talker": BF16})


@pytest.fixture(scope="module")
def parts(checkpoint):
    from pipeline.models.qwen3_omni.family import FAMILY

    return FAMILY.frame_talker_parts(checkpoint, device=torch.device("cuda"), dtype=BF16)


def _runner(parts, graphs: bool, prefill_sizes: tuple[int, ...] | None = None):
    runner = make_runner(parts, GREEDY, device="cuda", dtype=BF16, cuda_graphs=graphs, batch_sizes=(1, 3))
    if prefill_sizes is not None:
        runner.prefills.batch_sizes = prefill_sizes
    runner.capture()
    return runner


@torch.inference_mode()
def test_a_captured_start_makes_the_frames_of_the_eager_start(parts):
    captured, eager = _runner(parts, graphs=True), _runner(parts, graphs=False)
    assert captured.prefills.captured and captured.first_frame.captured == (1,)
    assert eager.prefills.captured == () and eager.first_frame.captured == ()
    mine, theirs = start_rows(captured), start_rows(eager)
    assert mine.frames == theirs.frames
    assert len({code for frame in mine.frames for code in frame}) > 8, "the frames vary"
    # every start replayed both graphs; the eager runner replayed none
    assert (captured.prefills.replays, captured.first_frame.replays, captured.first_frame.eager_steps) == (3, 3, 0)
    assert (eager.prefills.replays, eager.first_frame.replays) == (0, 0)
    # the prefill's hidden states: close (rows attend one query at a time), and the caches hold close keys
    x = torch.randn(PROMPTS[0], parts.body.config.hidden_size, generator=torch.Generator().manual_seed(3)).cuda()
    got = captured.prefill_prompt(x, slot=1, start=0)
    want = eager.prefill_prompt(x, slot=1, start=0)
    torch.testing.assert_close(got.float(), want.float(), rtol=3e-2, atol=3e-2)


@torch.inference_mode()
def test_a_prefill_longer_than_every_prefill_graph_runs_eagerly(parts):
    captured = _runner(parts, graphs=True, prefill_sizes=(8,))
    start_rows(captured, n=1)  # 9 positions: more than the one prefill graph holds
    assert (captured.prefills.replays, captured.prefills.eager_steps, captured.first_frame.replays) == (0, 0, 1)


@pytest.mark.parametrize("graphs", [True, False], ids=["captured", "eager"])
@torch.inference_mode()
def test_a_start_queues_its_work_without_waiting(parts, graphs):
    """The stage's talker inputs (the prompt part with an audio position, the reply opening) and the start, with 3-D
    rope positions from numpy: no host wait anywhere before the first frame is queued."""
    runner = _runner(parts, graphs)
    thinker_width = parts.text_width
    tokens = parts.tokens
    keys = [tokens.im_start, tokens.user, 11, ("audio", 0), ("audio", 1), 12]
    vectors = torch.randn(len(keys), thinker_width, device="cuda", dtype=BF16)
    first = torch.randn(thinker_width, device="cuda", dtype=BF16)
    voice = next(iter(tokens.speakers))
    sample = SampleRows.of([0], force_continue=[True], seeds=[5], counters=[0])
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        prompt = parts.prompt_inputs(vectors, keys)
        opening = parts.reply_start(first, voice)
        inputs = torch.cat([prompt, opening])
        rope = np.tile(np.arange(inputs.shape[0]), (3, 1))
        runner.sampler.reset(0, set())
        frame = runner.start(inputs, slot=0, start=0, sample=sample, rope=rope)
        with pytest.raises(RuntimeError):  # the mode does catch a wait: a read
            frame.tolist()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert frame.shape == (parts.groups,) and frame.dtype == torch.long
    assert (runner.first_frame.replays == 1) == graphs
