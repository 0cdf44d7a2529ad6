"""Frame talker runners on the tiny Qwen3-Omni model, and the checks that their frames equal the eager reference's
(tests/helpers/frame_reference.py). Shared by tests/unit/engine/test_frame_talker.py, its Triton-interpreter check (a
subprocess) and the GPU test.

Three rows in slots out of order, prompts of 9, 4 and 13 positions, one row with a rope shift (a conversation with
pictures), every row with its own seed; a call of 3 rows padded to 4 as a captured batch of 4 is (the padding row in
the scratch slot at position 0, its inputs zero, sampling in the sampler's scratch row).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from pipeline.config import RESIDUAL_SAMPLING, TALKER_SAMPLING, SamplingConfig
from pipeline.models.qwen3_omni.frame_talker import Qwen3OmniFrameTalker
from pipeline.models.qwen3_omni.talker import CodecRules
from pipeline.runners.frame_talker import FrameTalkerRunner
from pipeline.runners.sampling import SampleRows, SamplerSpec
from tests.helpers.frame_reference import EagerFrames
from tests.helpers.qwen3_tiny_config import TINY_IDS, sharpen_talker, tiny_qwen3_model

SLOTS = [2, 0, 3]
PROMPTS = [9, 4, 13]
SHIFTS = [0, -2, 0]
SEEDS = [11, 12, 13]
KV_SLOTS = 4
MAX_LEN = 64
GREEDY = (SamplingConfig(do_sample=False, repetition_penalty=1.05), SamplingConfig(do_sample=False))
SAMPLED = (TALKER_SAMPLING, RESIDUAL_SAMPLING)


def tiny_frame_talker(model=None) -> tuple[Qwen3OmniFrameTalker, object]:
    """The frame talker parts of the tiny model (seed 0, talker sharpened: a wrong position changes its codes) and the
    model."""
    if model is None:
        model = tiny_qwen3_model(seed=0)
        sharpen_talker(model)
    header = [TINY_IDS.im_start, TINY_IDS.assistant, TINY_IDS.newline]
    return Qwen3OmniFrameTalker(model.talker, model.thinker.get_input_embeddings(), model.config, header), model


def make_runner(
    parts,
    sampling: tuple[SamplingConfig, SamplingConfig],
    *,
    device: str = "cpu",
    dtype: torch.dtype = torch.float32,
    cuda_graphs: bool = False,
    batch_sizes: tuple[int, ...] = (4,),
) -> FrameTalkerRunner:
    """A runner of ``parts`` with codebook 0 sampled as the reference's rules say (``sampling``: codebook 0's and the
    residual codebooks' settings)."""
    rules = CodecRules.of(parts.tokens)
    return FrameTalkerRunner(
        parts,
        device=torch.device(device),
        dtype=dtype,
        kv_slots=KV_SLOTS,
        max_len=MAX_LEN,
        sampler=SamplerSpec(sampling[0], suppress=tuple(rules.suppress), stop=(rules.stop,), salt=1),
        residual_sampler=SamplerSpec(sampling[1], salt=2),
        cuda_graphs=cuda_graphs,
        graph_batch_sizes=batch_sizes,
    )


@dataclass
class Rows:
    """The rows' state: previous frames, cache indices and frames sampled so far."""

    frames: list[list[int]]
    positions: list[int]
    counters: list[int]

    def sample(self, n: int) -> SampleRows:
        return SampleRows.of(SLOTS[:n], force_continue=[True] * n, seeds=SEEDS[:n], counters=self.counters[:n])


def start_rows(runner, n: int = 3, seed: int = 5) -> Rows:
    """Each of the first ``n`` rows' prompt prefilled and its first frame (``runner.start``: a runner or an
    :class:`EagerFrames`), from random prompt vectors of ``seed``; the opening of each at the row's rope shift."""
    talker = runner.runner if isinstance(runner, EagerFrames) else runner
    gen = torch.Generator().manual_seed(seed)
    width = talker.parts.body.config.hidden_size
    frames = []
    for slot, prompt, shift, seed_ in zip(SLOTS[:n], PROMPTS[:n], SHIFTS[:n], SEEDS[:n]):
        inputs = torch.randn(prompt, width, generator=gen).to(talker.device)
        rope = torch.arange(prompt).expand(3, -1) + torch.tensor([[0], [1], [2]]) * (shift != 0)
        talker.sampler.reset(slot, set())
        sample = SampleRows.of([slot], force_continue=[True], seeds=[seed_], counters=[0])
        frames.append(runner.start(inputs, slot=slot, start=0, sample=sample, rope=rope).tolist())
    return Rows(frames, PROMPTS[:n], [1] * n)


def text_vectors(step: int, n: int, width: int = 64) -> torch.Tensor:
    return torch.randn(n, width, generator=torch.Generator().manual_seed(100 + step))


def padded_decode(runner: FrameTalkerRunner, rows: Rows, text: torch.Tensor, pad: int) -> torch.Tensor:
    """:meth:`FrameTalkerRunner.decode` of the rows and ``pad`` padding rows as a replay of a larger batch has them;
    returns the real rows' frames."""
    n = len(rows.frames)
    scratch = runner.pool.scratch_slot
    sample = rows.sample(n)
    padded = SampleRows.of(
        [*sample.rows, *[scratch] * pad],
        force_continue=[*sample.force_continue, *[False] * pad],
        seeds=[*sample.seeds, *[0] * pad],
        counters=[*sample.counters, *[0] * pad],
    )
    out = runner.decode(
        rows.frames + [[0] * runner.groups] * pad,
        torch.cat([text, text.new_zeros(pad, text.shape[1])]).to(runner.device),
        SLOTS[:n] + [scratch] * pad,
        rows.positions + [0] * pad,
        padded,
        rope_shifts=SHIFTS[:n] + [0] * pad,
    )
    return out[:n]


def advance(rows: Rows, frames: torch.Tensor) -> None:
    rows.frames = frames.tolist()
    rows.positions = [p + 1 for p in rows.positions]
    rows.counters = [c + 1 for c in rows.counters]


@torch.inference_mode()
def check_frames_equal_eager(*, graph_safe: bool, frames: int, sampling=SAMPLED) -> None:
    """Three rows' first frames (``start``) and ``frames`` more (each call padded with one row), fed back frame by
    frame: the runner's frame step run eagerly (``graph_safe``: with the Triton attention the graphs capture) equals
    the eager reference's, frame for frame."""
    parts, model = tiny_frame_talker()
    ours = make_runner(parts, sampling)
    ours.batched.graph_safe = ours.first_frame.graph_safe = graph_safe  # what a replay runs, here eagerly
    theirs = EagerFrames(make_runner(parts, sampling), model.talker)
    mine, ref = start_rows(ours), start_rows(theirs)
    assert mine.frames == ref.frames, (mine.frames, ref.frames)
    seen = set()
    for step in range(frames):
        text = text_vectors(step, 3)
        got = padded_decode(ours, mine, text, pad=1)
        want = theirs.decode(ref.frames, text, SLOTS, ref.positions, ref.sample(3), rope_shifts=SHIFTS)
        assert torch.equal(got, want), (step, got, want)
        seen.update(got.flatten().tolist())
        advance(mine, got)
        advance(ref, want)
    assert len(seen) > 20, "the frames vary: the comparison is not between constants"


@torch.inference_mode()
def check_graphed_start_equals_eager(*, graph_safe: bool) -> None:
    """Three replies' starts with their prefills as rows of one step (the function a prefill graph captures, here run
    eagerly: ``graph_safe`` with the Triton attention the graphs capture) equal the starts with the decoder's eager
    prefill: the same first frames (greedy), the same hidden states and cached keys up to summation order (a row
    attends one query at a time)."""
    parts, model = tiny_frame_talker()
    rows, eager = make_runner(parts, GREEDY), make_runner(parts, GREEDY)
    rows.prefills.graph_safe = graph_safe
    rows.prefills.fits = lambda n: True  # type: ignore[method-assign]  # no graph is captured here: run its function
    mine, theirs = start_rows(rows), start_rows(EagerFrames(eager, model.talker))
    assert rows.prefills.eager_steps == 3, "every start took the graphed prefill's path"
    assert mine.frames == theirs.frames, (mine.frames, theirs.frames)
    assert len({code for frame in mine.frames for code in frame}) > 8, "the frames vary"
    for slot, n in zip(SLOTS, PROMPTS):
        for layer in range(len(rows.decoder.layers)):
            torch.testing.assert_close(
                rows.pool.keys[layer][slot, :n], eager.pool.keys[layer][slot, :n], rtol=1e-4, atol=1e-4
            )
    x = torch.randn(PROMPTS[2], parts.body.config.hidden_size, generator=torch.Generator().manual_seed(9))
    rope = torch.arange(PROMPTS[2]).expand(3, -1) + torch.tensor([[0], [2], [1]])
    got = rows.prefill_prompt(x, slot=1, start=0, rope=rope)
    want = eager.prefill_prompt(x, slot=1, start=0, rope=rope)
    assert rows.prefills.eager_steps == 4 and eager.prefills.eager_steps == 0
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
