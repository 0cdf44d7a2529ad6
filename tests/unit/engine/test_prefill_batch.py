"""The step's prefill chunks: admission under the job and row budgets, and (GPU) several conversations' chunks in one
graph replay computing what each computes alone."""

from __future__ import annotations

import pytest
import torch

from pipeline.scheduler.prefill_batch import PrefillBatch, PrefillJob
from tests.helpers.runners import thinker_runner


def job(rows: int, conv="c") -> PrefillJob:
    return PrefillJob(conv, 0, list(range(rows)), [0] * rows, [], 0, last=True, logits=False)


def test_jobs_are_admitted_up_to_the_job_budget():
    batch = PrefillBatch(max_jobs=2, max_rows=None)
    assert batch.admit(job(5)) and batch.admit(job(900))
    assert not batch.has_room() and not batch.admit(job(1))
    assert batch.rows == 905


def test_the_row_budget_defers_what_does_not_fit_but_never_a_step_s_first_chunk():
    batch = PrefillBatch(max_jobs=8, max_rows=512)
    assert batch.admit(job(500))
    assert not batch.admit(job(13)), "over 512 positions: next step"
    assert batch.admit(job(12)) and batch.rows == 512
    oversized = PrefillBatch(max_jobs=8, max_rows=512)
    assert oversized.admit(job(600)), "a chunk longer than every graph still runs (alone, eagerly)"
    assert not oversized.has_room() and not oversized.admit(job(1))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@torch.inference_mode()
def test_chunks_of_several_slots_in_one_replay_match_each_alone_on_the_gpu(tiny_model_dir):
    from pipeline.models.qwen2_5_omni.checkpoint import load_checkpoint

    ckpt = load_checkpoint(tiny_model_dir, devices={"thinker": "cuda"}, dtypes={"thinker": torch.float32})
    batched = thinker_runner(ckpt, device=torch.device("cuda"), dtype=torch.float32, kv_slots=4, max_len=256)
    alone = thinker_runner(
        ckpt, device=torch.device("cuda"), dtype=torch.float32, kv_slots=4, max_len=256, cuda_graphs=False
    )
    batched.capture()
    assert batched.prefill_rows == 512 and alone.prefill_rows is None
    hidden = ckpt.thinker.config.text_config.hidden_size
    torch.manual_seed(0)
    for slot in (0, 2):  # earlier positions, so the batch's spans start mid-slot
        x = torch.randn(20, hidden, device="cuda")
        batched.prefill(x, slot, 0)
        alone.prefill(x, slot, 0)
    spans = [
        (torch.randn(7, hidden, device="cuda"), 0, 20, True),
        (torch.randn(30, hidden, device="cuda"), 1, 0, False),
        (torch.randn(3, hidden, device="cuda"), 2, 20, True),
    ]
    replays = batched.prefills.replays
    got = batched.prefill_many(spans)
    assert batched.prefills.replays == replays + 1, "one replay for the three spans"
    for (x, slot, start, logits), out in zip(spans, got):
        want = alone.prefill(x, slot, start, logits=logits)
        torch.testing.assert_close(out.hidden, want.hidden, rtol=1e-4, atol=1e-4)
        assert (out.last_logits is None) == (not logits)
        if logits:
            torch.testing.assert_close(out.last_logits, want.last_logits, rtol=1e-4, atol=1e-4)
    for slot, end in ((0, 27), (1, 30), (2, 23)):
        torch.testing.assert_close(
            batched.pool.keys[0][slot, :end], alone.pool.keys[0][slot, :end], rtol=1e-4, atol=1e-4
        )
