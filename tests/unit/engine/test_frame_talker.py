"""The frame talker's frame as one fixed-shape step (pipeline/runners/frame_talker.py, residual_predictor.py): the
code predictor over its own KV pool equals transformers' code predictor run as ``generate`` runs it (the eager
reference, tests/helpers/qwen3_code_predictor.py), greedily and sampled; the whole frame step, padded as a captured
batch is, equals the eager path it replaced frame for frame (on the CPU attention here, with the Triton attention the
graphs capture in Triton's interpreter); a chain equals frames one by one. Tiny random Qwen3-Omni, float32."""

from __future__ import annotations

import pytest
import torch

from pipeline.config import RESIDUAL_SAMPLING
from pipeline.models.qwen3_omni.code_predictor import Qwen3OmniCodePredictor
from pipeline.models.qwen3_omni.experts import experts_implementation, use_capturable_experts
from pipeline.runners.residual_predictor import PooledResidualPredictor
from pipeline.runners.sampling import DeviceSampleRows, SampleRows, SamplerSpec
from tests.helpers.frame_talkers import (
    GREEDY,
    SAMPLED,
    SHIFTS,
    SLOTS,
    advance,
    check_frames_equal_eager,
    check_graphed_start_equals_eager,
    make_runner,
    start_rows,
    text_vectors,
    tiny_frame_talker,
)
from tests.helpers.qwen3_code_predictor import CodePredictor, TopKTopP, greedy
from tests.helpers.qwen3_tiny_config import tiny_qwen3_model
from tests.helpers.triton_check import TritonCheck

GROUPS = 16


@pytest.fixture(scope="module")
def model():
    return tiny_qwen3_model(seed=0)


@pytest.fixture(scope="module")
def predictors(model):
    pooled = PooledResidualPredictor(
        Qwen3OmniCodePredictor(model.talker), groups=GROUPS, rows=6, dtype=torch.float32, device=torch.device("cpu")
    )
    return pooled, CodePredictor(model.talker)


def _inputs(seed: int = 4, rows: int = 5) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(rows, 64, generator=gen) * 3, torch.randint(0, 64, (rows,), generator=gen)


SLOTS_OUT_OF_ORDER = torch.tensor([4, 0, 2, 5, 1])


@torch.inference_mode()
def test_the_pooled_code_predictor_equals_the_reference_greedily(predictors):
    pooled, reference = predictors
    hidden, code0 = _inputs()
    ours = pooled.predict(hidden, code0, greedy, slots=SLOTS_OUT_OF_ORDER, graph_safe=False)
    assert ours.shape == (5, GROUPS - 1) and ours.dtype == torch.long
    assert torch.equal(ours, reference.predict(hidden, code0, greedy))
    assert len(set(ours.flatten().tolist())) > 10, "the codes vary"
    # nothing is kept between calls: other slots, and each row alone in the scratch slot, give the same codes
    again = pooled.predict(hidden, code0, greedy, slots=torch.tensor([0, 1, 2, 3, 4]), graph_safe=False)
    assert torch.equal(again, ours)
    scratch = torch.tensor([pooled.scratch_slot])
    for b in range(5):
        alone = pooled.predict(hidden[b : b + 1], code0[b : b + 1], greedy, slots=scratch, graph_safe=False)
        assert torch.equal(alone, ours[b : b + 1])


@torch.inference_mode()
def test_the_pooled_code_predictor_samples_what_the_reference_samples(predictors):
    """Seeded draws (the reference's own warpers with a generator per row, and the engine's in-graph sampler with its
    seeds and counters): the same seeds give the same codes, other seeds other codes."""
    pooled, reference = predictors
    hidden, code0 = _inputs(seed=6)

    def warpers(seeds):
        return TopKTopP([torch.Generator().manual_seed(s) for s in seeds])

    seeds = [21, 22, 23, 24, 25]
    ours = pooled.predict(hidden, code0, warpers(seeds), slots=SLOTS_OUT_OF_ORDER, graph_safe=False)
    assert torch.equal(ours, reference.predict(hidden, code0, warpers(seeds)))
    other = pooled.predict(hidden, code0, warpers([31, 32, 33, 34, 35]), slots=SLOTS_OUT_OF_ORDER, graph_safe=False)
    assert not torch.equal(other, ours)

    sampler = SamplerSpec(RESIDUAL_SAMPLING, salt=2).build(vocab=64, rows=1, device=torch.device("cpu"))

    def engine_draws(seed_list):
        rows = torch.zeros(5, dtype=torch.long)
        seeds_ = torch.tensor(seed_list)

        def pick(logits, step):
            counters = torch.full((5,), 7 * GROUPS + step)
            return sampler.sample_device(logits, DeviceSampleRows(rows, rows.bool(), seeds_, counters))

        return pick

    ours = pooled.predict(hidden, code0, engine_draws(seeds), slots=SLOTS_OUT_OF_ORDER, graph_safe=False)
    assert torch.equal(ours, reference.predict(hidden, code0, engine_draws(seeds)))
    assert not torch.equal(ours, reference.predict(hidden, code0, greedy))


def test_the_frame_step_padded_equals_the_eager_frames():
    """Three rows at different positions (one with a rope shift), seeded sampling, two dozen frames, each call padded
    with a scratch row as a captured batch of 4 is: the frames the old eager path made, frame for frame."""
    check_frames_equal_eager(graph_safe=False, frames=24)


def test_greedy_frames_equal_the_eager_frames():
    check_frames_equal_eager(graph_safe=False, frames=8, sampling=GREEDY)


@torch.inference_mode()
def test_a_chain_of_frames_makes_the_frames_of_steps_one_by_one():
    """``decode_chain``: each frame fed back on the device with positions, rope positions and noise counters one
    further; the same frames as ``decode`` called frame by frame with the same text vector."""
    parts, _ = tiny_frame_talker()
    one, chained = make_runner(parts, SAMPLED), make_runner(parts, SAMPLED)
    rows, chain_rows = start_rows(one), start_rows(chained)
    text = text_vectors(0, 3)
    frames = []
    for _ in range(6):
        out = one.decode(rows.frames, text, SLOTS, rows.positions, rows.sample(3), rope_shifts=SHIFTS)
        frames.append(out)
        advance(rows, out)
    got = chained.decode_chain(
        chain_rows.frames,
        text,
        SLOTS,
        chain_rows.positions,
        chain_rows.sample(3),
        steps=6,
        rope_shifts=SHIFTS,
    )
    assert got.shape == (6, 3, GROUPS) and torch.equal(got, torch.stack(frames))
    assert torch.equal(one.sampler.seen, chained.sampler.seen)  # the repetition penalty's table too


@torch.inference_mode()
def test_bad_frame_batches_are_refused():
    parts, _ = tiny_frame_talker()
    runner = make_runner(parts, GREEDY)
    rows = start_rows(runner, n=1)
    text = text_vectors(0, 1)
    with pytest.raises(ValueError, match="codes"):
        runner.decode([rows.frames[0][:3]], text, SLOTS[:1], rows.positions, rows.sample(1))
    n = runner.predictor.rows + 1
    many = SampleRows.of([0] * n, force_continue=[False] * n, seeds=[0] * n, counters=[0] * n)
    with pytest.raises(ValueError, match="at most"):
        runner.decode(rows.frames * n, text.expand(n, -1), [0] * n, [9] * n, many)


def test_the_experts_implementation_is_one_a_graph_captures(model):
    """grouped_mm where torch's grouped GEMM reads its offsets on the device (bfloat16 on Hopper or Blackwell; the CPU
    captures nothing), batched_mm elsewhere on CUDA; set on every experts block of a part, whatever it had."""
    assert experts_implementation("cuda", torch.bfloat16, (9, 0)) == "grouped_mm"
    assert experts_implementation("cuda:1", torch.bfloat16, (10, 0)) == "grouped_mm"
    assert experts_implementation("cuda", torch.float32, (9, 0)) == "batched_mm"
    assert experts_implementation("cuda", torch.bfloat16, (8, 0)) == "batched_mm"
    assert experts_implementation("cpu", torch.float32, None) == "grouped_mm"
    for part in (model.thinker, model.talker):
        part.set_experts_implementation("eager")
        assert use_capturable_experts(part) == "grouped_mm"
        blocks = [m for m in part.modules() if type(m).__name__.endswith("Experts")]
        assert blocks and all(m.config._experts_implementation == "grouped_mm" for m in blocks)
    assert use_capturable_experts(None) is None


# The frame step with the Triton attention its graphs capture, in Triton's interpreter (no CUDA here): each attention
# call is interpreted program by program (~0.3 s), 32 calls a frame (2 talker layers, 2 predictor layers x 15 calls).
FRAMES_CHECK = """
import functools
import torch
torch.set_num_threads(1)
import pipeline.runners.decoder as decoder
from tests.helpers.frame_talkers import check_frames_equal_eager
decoder.attend_triton = functools.partial(decoder.attend_triton, splits=1)
check_frames_equal_eager(graph_safe=True, frames=6)
print("ok")
"""

FRAMES = TritonCheck(FRAMES_CHECK, timeout_s=1200, interpreter_only=True)  # with CUDA: tests/gpu/test_frame_graphs.py


@pytest.mark.slow
@pytest.mark.background(FRAMES)
def test_the_graph_safe_frame_step_equals_the_eager_frames_in_the_triton_interpreter():
    FRAMES.assert_ok()


def test_a_start_with_the_graphed_prefill_s_rows_equals_the_eager_start():
    """The prefill's path when it fits a prefill graph (its captured function run eagerly, with the CPU attention
    here): the eager prefill's first frames, hidden states and cached keys."""
    check_graphed_start_equals_eager(graph_safe=False)


# The same with the Triton attention the prefill graphs capture, in Triton's interpreter: 2 talker layers a prefill.
START_CHECK = """
import torch
torch.set_num_threads(1)
from tests.helpers.frame_talkers import check_graphed_start_equals_eager
check_graphed_start_equals_eager(graph_safe=True)
print("ok")
"""

# with CUDA: tests/gpu/test_talker_start_graphs.py
START = TritonCheck(START_CHECK, timeout_s=600, interpreter_only=True)


@pytest.mark.background(START)
def test_the_graph_safe_prefill_rows_equal_the_eager_start_in_the_triton_interpreter():
    START.assert_ok()
