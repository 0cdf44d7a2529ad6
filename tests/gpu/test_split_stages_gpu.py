"""Stages on two GPUs of one host: token2wav alone, or talker and token2wav, on cuda:1 while the thinker decodes on
cuda:0 make the same reply as one GPU (greedy text, forced lengths, a seeded engine): the same codes, the same text,
audio of the same length and the same samples up to the tolerance below.

Audio tolerance: the same kernels run on the same GPU model in every placement, so the samples are expected to be
equal; ``AUDIO_ATOL`` (1e-3 of full scale) allows only for a kernel variant that a library picks per device or stream
(cuBLAS workspaces are per stream) and for float rounding in the bfloat16 DiT. A chunk lost, repeated or synthesized
from the wrong codes or noise differs by the order of the signal itself.

Run on a host with two GPUs: ``python -m pytest tests/gpu/test_split_stages_gpu.py`` (the ``random:7b`` cases build the
7B architecture three times, a few minutes; ``-k tiny`` runs the tiny model only)."""

from __future__ import annotations

import asyncio
import gc

import numpy as np
import pytest
import torch

from conftest import greedy_stage_config, run_spoken_reply

pytestmark = pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA devices")

AUDIO_ATOL = 1e-3
PLACEMENTS = {
    "one_gpu": ("cuda:0", "cuda:0", "cuda:0"),
    "token2wav_on_1": ("cuda:0", "cuda:0", "cuda:1"),
    "talker_and_token2wav_on_1": ("cuda:0", "cuda:1", "cuda:1"),
}
TEXT_TOKENS, CODES = 6, 120  # 2.4 s of audio: the first chunk, the ramp and steady chunks
SEED = 7


def config(model: str, placement: str, *, worker: bool):
    """Greedy, forced reply lengths, small KV pools; LM dtype as the bench runs the model (float32 for the tiny one,
    bfloat16 for 7B); token2wav as packaged on CUDA (compiled DiT, Triton attention and vocoder, graphs)."""
    thinker, talker, token2wav = PLACEMENTS[placement]
    dtype = "float32" if model == "tiny" else "bfloat16"
    lm = {"dtype": dtype, "kv_slots": 2}
    return greedy_stage_config(
        "cuda:0",
        thinker={**lm, "device": thinker, "max_context_tokens": 1024, "min_tokens": TEXT_TOKENS},
        talker={**lm, "device": talker, "min_tokens": CODES, "max_tokens": CODES},
        token2wav={"device": token2wav, "worker_thread": "on" if worker else "off", "max_batch": 2},
    )


def loader(model: str, tiny_model_dir):
    from pipeline.hosting.loaders import PretrainedCheckpoint, RandomCheckpoint
    from pipeline.models.qwen2_5_omni.tiny import PRESETS

    return PretrainedCheckpoint(str(tiny_model_dir)) if model == "tiny" else RandomCheckpoint(PRESETS["7b"]())


def free_gpus() -> None:
    gc.collect()
    for index in range(torch.cuda.device_count()):
        with torch.cuda.device(index):
            torch.cuda.empty_cache()


@torch.inference_mode()
def reply_on_core(model: str, placement: str, tiny_model_dir) -> tuple[list[int], np.ndarray]:
    """One spoken reply stepped on an :class:`EngineCore` in this thread (token2wav in the step): codes and audio.
    Checks that each stage's weights and runner are where the placement says."""
    from pipeline.core.engine_core import EngineCore

    cfg = config(model, placement, worker=False)
    ckpt = loader(model, tiny_model_dir).load(cfg)
    want = [torch.device(d) for d in PLACEMENTS[placement]]
    for part, device in zip((ckpt.thinker, ckpt.talker, ckpt.token2wav), want):
        assert {p.device for p in part.parameters()} == {device}
    core = EngineCore(ckpt, cfg, seed=SEED)
    assert (core.runner.thinker.device, core.runner.talker.device, core.token2wav.device) == tuple(want)
    codes, audio, _ = run_spoken_reply(core, max_text_tokens=TEXT_TOKENS)
    memory = core.stats().device_memory_bytes
    assert memory == sum(torch.cuda.memory_allocated(d) for d in core.devices)
    core.close()
    del core, ckpt
    free_gpus()
    return codes, audio


@pytest.fixture(scope="module")
def one_gpu_replies() -> dict:
    """Each model's one-GPU reply (codes, audio), made once by the first test that needs it."""
    return {}


def assert_same_audio(audio: np.ndarray, reference: np.ndarray) -> None:
    assert audio.shape == reference.shape
    assert np.abs(reference).max() > 1e-3  # a silent reference would compare equal to anything near silence
    np.testing.assert_allclose(audio, reference, rtol=0, atol=AUDIO_ATOL)


@pytest.mark.parametrize("placement", ["token2wav_on_1", "talker_and_token2wav_on_1"])
@pytest.mark.parametrize("model", ["tiny", "7b"])
def test_a_split_engine_makes_the_one_gpu_reply(model, placement, tiny_model_dir, one_gpu_replies):
    if model not in one_gpu_replies:
        one_gpu_replies[model] = reply_on_core(model, "one_gpu", tiny_model_dir)
    codes, audio = reply_on_core(model, placement, tiny_model_dir)
    want_codes, want_audio = one_gpu_replies[model]
    assert len(codes) == CODES and codes == want_codes
    assert_same_audio(audio, want_audio)


async def spoken_turn(engine) -> tuple[tuple[int, ...], np.ndarray]:
    """The reply's text token ids and its audio (all its codes: the last chunk counts them)."""
    from pipeline.response_events import AudioChunk, ResponseDone, ResponseStatus

    conv = engine.conversation()
    await conv.add_text("u1", "Hello from the second GPU.")
    events = [ev async for ev in conv.respond(item_id="a1", max_output_tokens=TEXT_TOKENS)]
    await conv.close()
    done, chunks = events[-1], [ev for ev in events if isinstance(ev, AudioChunk)]
    # The forced text length is also the response's cap, so the reply ends as cut by it.
    assert isinstance(done, ResponseDone), done
    assert (done.status, done.reason) == (ResponseStatus.INCOMPLETE, "max_output_tokens"), done
    assert chunks[-1].codec_tokens_so_far == CODES
    return done.text_token_ids, np.concatenate([ev.pcm for ev in chunks])


def reply_in_engine_process(placement: str, tiny_model_dir) -> tuple[tuple[int, ...], np.ndarray]:
    """The production path: the engine core in a child process, its engine thread on a high-priority stream of each
    decode device, token2wav on its worker thread."""
    from pipeline.engine import OmniEngine

    cfg = config("tiny", placement, worker=True)
    assert cfg.engine.process
    engine = OmniEngine.from_loader(loader("tiny", tiny_model_dir), cfg, seed=SEED, torch_threads=1)
    try:
        return asyncio.run(spoken_turn(engine))
    finally:
        engine.close()


def test_an_engine_process_with_token2wav_on_the_second_gpu_makes_the_one_gpu_reply(tiny_model_dir):
    text, audio = reply_in_engine_process("one_gpu", tiny_model_dir)
    for placement in ("token2wav_on_1", "talker_and_token2wav_on_1"):
        split_text, split_audio = reply_in_engine_process(placement, tiny_model_dir)
        assert split_text == text
        assert_same_audio(split_audio, audio)
