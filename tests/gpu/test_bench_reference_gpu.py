"""The bench's Qwen3-Omni reference on the GPU: transformers' generate on the tiny checkpoint placed on CUDA (thinker
and talker in bf16, code2wav in float32, as the bench's stage config places them) makes the forced text and frames. The
30B-A3B architecture runs the same code through ``omni-realtime bench --model random:qwen3-omni-30b-a3b --reference 1``
(BENCHMARKS.md)."""

from __future__ import annotations

import pytest
import torch

from pipeline.hosting.loaders import PretrainedCheckpoint
from pipeline.models import family_of
from realtime.bench.models import ReplyRequest, bench_stage_config, reply_length
from realtime.bench.reference_generate import reference_generator
from realtime.bench.speech import load_speech_folder
from tests.helpers.paths import TESTS


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_the_qwen3_reference_runs_on_the_gpu(qwen3_model_dir):
    cfg = bench_stage_config(
        None, device="cuda", length=ReplyRequest(2.0, text_tokens=8).resolve(12.5), family="qwen3_omni"
    )
    ckpt = PretrainedCheckpoint(str(qwen3_model_dir)).load(cfg)
    assert next(ckpt.thinker.parameters()).device.type == "cuda"
    reference = reference_generator(ckpt, reply_length(cfg), family_of("qwen3_omni"))
    speech = load_speech_folder(TESTS / "fixtures" / "speech", max_seconds=3.0)[0]
    reference(speech)  # warm
    served = reference(speech)
    assert (served.thinker_tokens, served.talker_tokens) == (8, 25)
    assert 24 * 1920 / 24_000 < served.audio_s <= 25 * 1920 / 24_000
    assert 0 < served.seconds < 60
