"""On CUDA the frame talker's frame (talker step, codebook 0, the code predictor's 15 codebooks, their sampling) is
captured once per batch size and a replay makes the frames the same step makes eagerly: greedy, bfloat16 (transformers'
grouped-mm experts capture in bfloat16, the implementation a loaded checkpoint gets there), tiny Qwen3-Omni checkpoint.
The eager runner steps with the same kernels (the Triton attention) at the same shapes (captured sizes 1 and 3, no
padding), so the frames are expected to be equal, not close. Then a whole spoken reply with graphs on equals the one
with graphs off.

Run on a GPU host: ``python -m pytest -q tests/gpu/test_frame_graphs.py``."""

from __future__ import annotations

import pytest
import torch

from conftest import greedy_stage_config, run_spoken_reply
from tests.helpers.frame_talkers import GREEDY, SHIFTS, SLOTS, advance, make_runner, start_rows, text_vectors

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")

FRAMES = 20
CUDA = {"thinker": "cuda", "talker": "cuda", "token2wav": "cuda"}


@pytest.fixture(scope="module")
def checkpoint(qwen3_model_dir):
    from pipeline.models.qwen3_omni.checkpoint import load_checkpoint

    return load_checkpoint(qwen3_model_dir, devices=CUDA, dtypes={"thinker": torch.bfloat16, "talker": torch.bfloat16})


def test_the_loaded_parts_run_experts_a_graph_captures(checkpoint):
    """The experts implementation chosen at load for this GPU (grouped_mm on an H100 or H200 in bfloat16: the unit
    test pins the choice), on every experts block of both parts."""
    from pipeline.models.qwen3_omni.experts import experts_implementation

    want = experts_implementation("cuda", torch.bfloat16, torch.cuda.get_device_capability())
    for part in (checkpoint.thinker, checkpoint.talker):
        blocks = [m for m in part.modules() if type(m).__name__.endswith("Experts")]
        assert blocks and all(m.config._experts_implementation == want for m in blocks)


@pytest.mark.parametrize("rows", [1, 3])
@torch.inference_mode()
def test_captured_frames_equal_eager_frames(checkpoint, rows):
    from pipeline.models.qwen3_omni.family import FAMILY

    cuda = torch.device("cuda")
    parts = FAMILY.frame_talker_parts(checkpoint, device=cuda, dtype=torch.bfloat16)
    common = dict(device="cuda", dtype=torch.bfloat16, batch_sizes=(1, 3))
    captured = make_runner(parts, GREEDY, cuda_graphs=True, **common)
    captured.capture()
    eager = make_runner(parts, GREEDY, cuda_graphs=False, **common)
    assert captured.batched.captured == (1, 3) and eager.batched.captured == ()
    mine, theirs = start_rows(captured, n=rows), start_rows(eager, n=rows)
    assert mine.frames == theirs.frames
    slots, shifts = SLOTS[:rows], SHIFTS[:rows]
    for step in range(FRAMES):
        text = text_vectors(step, rows, parts.text_width).to(cuda)
        got = captured.decode(mine.frames, text, slots, mine.positions, mine.sample(rows), rope_shifts=shifts)
        want = eager.decode(theirs.frames, text, slots, theirs.positions, theirs.sample(rows), rope_shifts=shifts)
        assert torch.equal(got, want), (step, got, want)
        advance(mine, got)
        advance(theirs, want)
    assert (captured.batched.replays, captured.batched.eager_steps, eager.batched.eager_steps) == (FRAMES, 0, FRAMES)

    # a chain replays the graph with its inputs advanced on the device: the frames of steps one by one
    text = text_vectors(FRAMES, rows, parts.text_width).to(cuda)
    sample = mine.sample(rows)
    chained = captured.decode_chain(mine.frames, text, slots, mine.positions, sample, steps=5, rope_shifts=shifts)
    for step in range(5):
        want = eager.decode(theirs.frames, text, slots, theirs.positions, theirs.sample(rows), rope_shifts=shifts)
        assert torch.equal(chained[step], want), step
        advance(theirs, want)


@torch.inference_mode()
def test_a_reply_with_captured_frames_equals_one_without(qwen3_model_dir):
    from pipeline.core.engine_core import EngineCore
    from pipeline.models.qwen3_omni.checkpoint import load_checkpoint

    def reply(graphs: bool):
        lm = {"dtype": "bfloat16", "cuda_graphs": graphs, "kv_slots": 2}
        cfg = greedy_stage_config(
            "cuda",
            family="qwen3_omni",
            thinker={**lm, "max_context_tokens": 1024, "min_tokens": 6, "max_tokens": 6},
            talker={**lm, "min_tokens": 30, "max_tokens": 30},
            token2wav={"worker_thread": "off"},
        )
        dtypes = {"thinker": torch.bfloat16, "talker": torch.bfloat16}
        core = EngineCore(load_checkpoint(qwen3_model_dir, devices=CUDA, dtypes=dtypes), cfg, seed=7)
        codes, _, _ = run_spoken_reply(core)
        return codes, core.runner.talker.batched.replays

    codes, replays = reply(graphs=True)
    want, eager_replays = reply(graphs=False)
    assert len(codes) == 30 and codes == want
    assert replays > 0 and eager_replays == 0
