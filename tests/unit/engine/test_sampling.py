"""The batched sampler: transformers' logits processing, a draw that samples exactly its distribution from hashed
noise, determinism per row whatever the batch, and (GPU) the same tokens from a decode graph as from eager code."""

from __future__ import annotations

import pytest
import torch

from pipeline.config import SamplingConfig
from pipeline.kernels.noise import uniform_noise_reference as uniform_noise
from pipeline.runners.sampling import BatchSampler, SampleRows, SamplerSpec
from tests.helpers.runners import thinker_runner
from tests.helpers.triton_check import TritonCheck


def hf_processed(cfg: SamplingConfig, logits: torch.Tensor, seen: list[int], suppress: list[int]) -> torch.Tensor:
    """One row through transformers' own logits processors, in ``generate``'s order (the reference)."""
    from transformers.generation.logits_process import (
        RepetitionPenaltyLogitsProcessor,
        SuppressTokensLogitsProcessor,
        TemperatureLogitsWarper,
        TopKLogitsWarper,
        TopPLogitsWarper,
    )

    ids = torch.tensor([seen], dtype=torch.long)
    scores = logits.unsqueeze(0).clone()
    if cfg.repetition_penalty != 1.0 and seen:
        scores = RepetitionPenaltyLogitsProcessor(cfg.repetition_penalty)(ids, scores)
    if suppress:
        scores = SuppressTokensLogitsProcessor(suppress, device="cpu")(ids, scores)
    if cfg.do_sample:
        scores = TemperatureLogitsWarper(cfg.temperature)(ids, scores)
        if cfg.top_k:
            scores = TopKLogitsWarper(cfg.top_k)(ids, scores)
        if cfg.top_p < 1.0:
            scores = TopPLogitsWarper(cfg.top_p)(ids, scores)
    return scores[0]


def sample(sampler: BatchSampler, logits, rows, *, seeds=None, counters=None, forced=None) -> list[int]:
    n = len(rows)
    return sampler.sample(
        logits, rows, force_continue=forced or [False] * n, seeds=seeds or [0] * n, counters=counters or [0] * n
    )


@pytest.mark.parametrize("cfg", [SamplingConfig(), SamplingConfig(repetition_penalty=1.3)])
def test_greedy_equals_transformers_processing(cfg):
    torch.manual_seed(0)
    logits = torch.randn(4, 50)
    seen = [[1, 2, 3], [], [int(logits[2].argmax())], [7]]
    sampler = BatchSampler(cfg, vocab=50, rows=6, device=torch.device("cpu"), suppress=[9], stop=[0, 1])
    for row, ids in zip((5, 0, 2, 3), seen):
        sampler.reset(row, ids)
    forced = [False, True, False, True]
    got = sample(sampler, logits, [5, 0, 2, 3], forced=forced)
    for b, ids in enumerate(seen):
        suppress = [9, 0, 1] if forced[b] else [9]
        assert got[b] == int(hf_processed(cfg, logits[b], ids, suppress).argmax())
    assert all(sampler.seen[row, token] for row, token in zip((5, 0, 2, 3), got)), "sampled ids count as seen"


def test_draws_follow_the_distribution_transformers_processing_gives():
    """Over many counters, each row's token frequencies match the softmax of transformers' processed logits (top-k,
    top-p, temperature, repetition penalty), and no token outside its support is ever drawn."""
    cfg = SamplingConfig(do_sample=True, temperature=0.9, top_k=10, top_p=0.8, repetition_penalty=1.05)
    logits = torch.randn(3, 40, generator=torch.Generator().manual_seed(1))
    draws = 6000
    sampler = BatchSampler(cfg, vocab=40, rows=3, device=torch.device("cpu"))
    counts = torch.zeros(3, 40)
    for start in range(0, draws, 500):
        batch = torch.arange(start, start + 500)
        rows = [0, 1, 2] * 500
        sampler.seen.zero_()
        sampler.reset(1, [4, 5])
        got = sample(
            sampler, logits.repeat(500, 1), rows, seeds=[11, 12, 13] * 500, counters=batch.repeat_interleave(3).tolist()
        )
        for row, token in zip(rows, got):
            counts[row, token] += 1
    for b, seen in enumerate(([], [4, 5], [])):
        want = hf_processed(cfg, logits[b], seen, []).softmax(-1)
        freq = counts[b] / draws
        assert torch.all(freq[want == 0] == 0), "a token outside top-k / top-p was drawn"
        assert torch.allclose(freq, want, atol=0.025), (freq, want)


def test_a_row_samples_the_same_token_alone_or_in_any_batch():
    cfg = SamplingConfig(do_sample=True, temperature=1.0, top_k=5, top_p=0.9)
    logits = torch.randn(6, 30, generator=torch.Generator().manual_seed(2))
    alone = [
        sample(
            BatchSampler(cfg, vocab=30, rows=8, device=torch.device("cpu")),
            logits[b : b + 1],
            [b],
            seeds=[100 + b],
            counters=[7],
        )[0]
        for b in range(6)
    ]
    order = [4, 1, 5, 0, 3, 2]
    mixed = sample(
        BatchSampler(cfg, vocab=30, rows=8, device=torch.device("cpu")),
        logits[order],
        order,
        seeds=[100 + b for b in order],
        counters=[7] * 6,
    )
    assert mixed == [alone[b] for b in order]


def test_seeds_counters_and_salt_change_the_draw():
    cfg = SamplingConfig(do_sample=True, temperature=1.0, top_k=0)
    logits = torch.zeros(1, 1000)  # uniform: every draw equally likely
    sampler = BatchSampler(cfg, vocab=1000, rows=1, device=torch.device("cpu"))
    by_counter = {sample(sampler, logits, [0], seeds=[5], counters=[c])[0] for c in range(50)}
    by_seed = {sample(sampler, logits, [0], seeds=[s], counters=[3])[0] for s in range(50)}
    salted = BatchSampler(cfg, vocab=1000, rows=1, device=torch.device("cpu"), salt=1)
    assert len(by_counter) > 40 and len(by_seed) > 40
    assert [sample(salted, logits, [0], seeds=[5], counters=[c])[0] for c in range(20)] != [
        sample(sampler, logits, [0], seeds=[5], counters=[c])[0] for c in range(20)
    ]


def test_uniform_noise_is_uniform_in_the_open_interval():
    u = uniform_noise(torch.arange(64), torch.arange(64) * 3, 500)
    assert u.shape == (64, 500) and u.dtype == torch.float32
    assert 0 < float(u.min()) and float(u.max()) < 1
    hist = torch.histc(u, bins=10, min=0, max=1) / u.numel()
    assert torch.allclose(hist, torch.full((10,), 0.1), atol=0.01), hist
    assert abs(float(torch.corrcoef(torch.stack([u[:, :-1].flatten(), u[:, 1:].flatten()]))[0, 1])) < 0.02
    torch.testing.assert_close(
        uniform_noise(torch.tensor([2**32 + 7]), torch.tensor([1]), 4),
        uniform_noise(torch.tensor([7]), torch.tensor([1]), 4),
    )  # seeds are taken mod 2**32


def test_top_k_keeps_to_the_k_most_likely_ids():
    cfg = SamplingConfig(do_sample=True, temperature=1.0, top_k=2)
    logits = torch.tensor([[0.0, 5.0, 4.0, -1.0]] * 64)
    sampler = BatchSampler(cfg, vocab=4, rows=64, device=torch.device("cpu"))
    got = sample(sampler, logits, list(range(64)), seeds=list(range(64)))
    assert set(got) <= {1, 2} and len(set(got)) == 2


def test_a_decode_step_with_a_sampler_samples_what_the_sampler_gives_for_its_logits(tiny_model_dir):
    from pipeline.models.qwen2_5_omni.checkpoint import load_checkpoint

    ckpt = load_checkpoint(tiny_model_dir, devices={"thinker": "cpu"}, dtypes={"thinker": torch.float32})
    cfg = SamplingConfig(do_sample=True, temperature=0.7, top_k=20, top_p=0.8, repetition_penalty=1.05)
    spec = SamplerSpec(cfg, stop=(3,), salt=0)
    runner = thinker_runner(ckpt, device=torch.device("cpu"), dtype=torch.float32, kv_slots=4, max_len=64, sampler=spec)
    hidden = ckpt.thinker.config.text_config.hidden_size
    for slot, n in ((0, 7), (2, 12)):
        runner.prefill(torch.randn(n, hidden), slot, 0)
    rows = SampleRows.of([0, 2], force_continue=[True, False], seeds=[9, 10], counters=[1, 4])
    step = runner.decode([5, 6], [0, 2], [7, 12], rows)
    reference = spec.build(vocab=runner.lm_head.out_features, rows=5, device=torch.device("cpu"))
    assert step.tokens.tolist() == reference.sample_device(step.logits, rows.on(torch.device("cpu"))).tolist()
    assert runner.sampler.seen[0, step.tokens[0]] and runner.sampler.seen[2, step.tokens[1]]
    assert not runner.sampler.seen[1].any() and not runner.sampler.seen[3].any()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@torch.inference_mode()
def test_a_captured_step_samples_what_the_eager_step_samples_on_the_gpu(tiny_model_dir):
    """Sampling inside the decode graph: a batch of 3 (padded to the graph of 4) draws the eager step's tokens, and
    the padding row marks nothing seen outside the scratch row."""
    from pipeline.models.qwen2_5_omni.checkpoint import load_checkpoint

    ckpt = load_checkpoint(tiny_model_dir, devices={"thinker": "cuda"}, dtypes={"thinker": torch.float32})
    cfg = SamplingConfig(do_sample=True, temperature=0.7, top_k=20, top_p=0.8, repetition_penalty=1.05)
    runner = thinker_runner(
        ckpt, device=torch.device("cuda"), dtype=torch.float32, kv_slots=4, max_len=64, sampler=SamplerSpec(cfg)
    )
    runner.batched.capture()
    hidden = ckpt.thinker.config.text_config.hidden_size
    for slot, n in ((0, 7), (2, 12), (3, 3)):
        runner.prefill(torch.randn(n, hidden, device="cuda"), slot, 0)
    rows = SampleRows.of([0, 2, 3], force_continue=[False] * 3, seeds=[1, 2, 3], counters=[5, 6, 7])
    graphed = runner.decode([5, 6, 7], [0, 2, 3], [7, 12, 3], rows)
    tokens, logits = graphed.tokens.tolist(), graphed.logits.clone()
    assert runner.batched.replays == 1
    assert not runner.sampler.seen[1].any(), "the padding row sampled into the scratch row only"
    runner.sampler.seen.zero_()
    assert runner.sampler.sample_device(logits, rows.on(torch.device("cuda"))).tolist() == tokens


NOISE_CHECK = """
import torch
from pipeline.kernels.noise import uniform_noise_reference, uniform_noise_triton
device = "cuda" if torch.cuda.is_available() else "cpu"
seeds = torch.tensor([0, 1, 2**32 - 1, 123456789, 2**40 + 5], device=device)
counters = torch.tensor([0, 7, 2**31, 99, 2**33], device=device)
for width, salt in ((40, 0), (20, 1), (8448, 1)):
    want = uniform_noise_reference(seeds, counters, width, salt)
    got = uniform_noise_triton(seeds, counters, width, salt)
    assert torch.equal(got, want), (width, salt, (got - want).abs().max())
print("ok")
"""


NOISE = TritonCheck(NOISE_CHECK, timeout_s=300)


@pytest.mark.slow
@pytest.mark.background(NOISE)
def test_the_triton_noise_kernel_equals_the_reference_bit_for_bit():
    """On the GPU the compiled kernel; without one, the same kernel in Triton's interpreter."""
    NOISE.assert_ok()
