"""token2wav's DiT blocks through torch.compile (``compile_dit``; the stage config's ``token2wav.compile``).

What is checked: the compiled synthesizer's audio equals the uncompiled one's up to float rounding, through the
unpadded single-stream path and the padded batches of ``step_many``; ``warm_up`` compiles one graph for every DiT block
(whatever its attention reach), and no window shape, batch size or chunk compiles another; a failure to compile raises a
ConfigError naming the option instead of falling back; the config field and its ``auto``. CPU tests run inductor's
C++ backend (needs a C++ compiler) on the tiny token2wav of tests/helpers/token2wav.py; the GPU tests (skipped without
CUDA) record the compiled solve in CUDA graphs and compare it with the eager, uncompiled solve.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from pipeline.config import parse_stage_config
from pipeline.errors import ConfigError
from pipeline.models.qwen2_5_omni import dit as dit_module
from pipeline.models.qwen2_5_omni.token2wav_graphs import WindowJob
from pipeline.models.qwen2_5_omni.token2wav_stream import StreamingToken2Wav
from pipeline.runners.token2wav_worker import Token2WavWorker
from tests.helpers.token2wav import (
    BATCH_LENGTHS,
    FLOAT_NOISE,
    GPU_TOLERANCE,
    MEL_DIM,
    assert_refused,
    build_token2wav,
    drive_together,
    graphs_compiled,
    on_the_talker,
    run_stream,
    stages,
    utterance,
)

pytestmark = pytest.mark.slow

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

COMPILE_TOLERANCE = FLOAT_NOISE
"""Compiled vs uncompiled audio, absolute, against a ~0.4 peak. Inductor computes the same float32 arithmetic in
other kernels (layer-norm statistics, GELU and the modulations fused, sums in another order), so the two differ by
rounding: measured 2.4e-7 at most over the utterances below (CPU). This is the bound the suite already uses for other
re-associations (a padded batch vs an unpadded window); a real error (a block skipped, a wrong mask or position)
moves the audio by orders of magnitude more (streaming vs one-shot context differences alone exceed it)."""


def attention_reaches(model) -> set[tuple[int, int]]:
    return {
        (layer.look_ahead_block, layer.look_backward_block) for layer in model.code2wav_dit_model.transformer_blocks
    }


@pytest.fixture(scope="module")
def model():
    return build_token2wav()


@pytest.fixture(scope="module")
def compiled(model):
    """One compiled, warmed-up synthesizer for the module (compiling is the slow part: ~10-30 s per graph on two
    CPU cores) and the number of graphs its warm-up compiled."""
    t2w = StreamingToken2Wav(model, compile_dit=True)
    before = graphs_compiled()
    t2w.warm_up(max_batch=8)
    return t2w, graphs_compiled() - before


def test_warm_up_compiles_one_graph_for_every_block(model, compiled) -> None:
    """The tiny DiT has the 7B's three kinds of block (look-back, look-ahead, neither) in 4 layers: one graph serves
    them all (the mask is an input), whatever the window shapes (frames and rows are dynamic)."""
    t2w, count = compiled
    assert attention_reaches(model) == {(0, 1), (1, 0), (0, 0)}
    assert count == 1
    assert t2w.compile_seconds > 0 and t2w.graph_stats().dit_compiled
    uncompiled = StreamingToken2Wav(model)
    assert not uncompiled.compile_dit and not uncompiled.graph_stats().dit_compiled
    uncompiled.warm_up()  # nothing to compile or capture on the CPU
    assert uncompiled.compile_seconds == 0


def test_compiled_dit_equals_the_uncompiled_path(model, compiled) -> None:
    """Single streams (unpadded windows of every length of the schedule: first, steady, short last chunks) and
    batches of streams (windows padded to the first/steady lengths, 1 to 4 slots): the same audio up to rounding,
    and not one graph compiled after the warm-up."""
    t2w, _ = compiled
    reference = StreamingToken2Wav(model)
    after_warm_up = graphs_compiled()
    for n_codes in (23, 70, 141):
        case = utterance(n_codes, seed=n_codes)
        expected = run_stream(reference, *case)
        chunks = run_stream(t2w, *case)
        assert [len(c) for c in chunks] == [len(c) for c in expected]
        np.testing.assert_allclose(np.concatenate(chunks), np.concatenate(expected), rtol=0, atol=COMPILE_TOLERANCE)
        assert np.abs(np.concatenate(expected)).max() > 0.1
    cases = [utterance(n, seed=10 + n) for n in BATCH_LENGTHS]
    together, batches = drive_together(t2w, cases)
    expected, _ = drive_together(reference, cases)
    assert batches == [3, 2, 2, 1]
    for chunks, alone in zip(together, expected):
        np.testing.assert_allclose(np.concatenate(chunks), np.concatenate(alone), rtol=0, atol=COMPILE_TOLERANCE)
    assert graphs_compiled() == after_warm_up


def test_a_compile_failure_at_warm_up_names_the_option(model, monkeypatch) -> None:
    """A block dynamo cannot trace whole (here: a graph break in the RoPE head, as a torch update could bring) stops
    the warm-up with a ConfigError naming the option; the synthesizer does not quietly run the block uncompiled."""
    rope_head = dit_module._rope_head

    def breaking_rope_head(*args):
        torch._dynamo.graph_break()
        return rope_head(*args)

    monkeypatch.setattr(dit_module, "_rope_head", breaking_rope_head)
    t2w = StreamingToken2Wav(model, compile_dit=True)
    with pytest.raises(ConfigError) as info:
        t2w.warm_up()
    assert info.value.param == "compile_dit"
    assert "compiling the DiT blocks failed" in str(info.value) and "stages.token2wav.compile: off" in str(info.value)


# ---------------------------------------------------------------------------------------------------
# Stage config


def test_stage_config_worker_thread_field() -> None:
    """``worker_thread``: ``auto`` = the worker with CUDA, inline on the CPU; a bare YAML on / off (a boolean) reads
    as the word; resolved to a bool at load."""
    assert parse_stage_config(stages(device="cpu")).token2wav.worker_thread is False
    assert parse_stage_config(stages(device="cuda")).token2wav.worker_thread is True
    assert parse_stage_config(stages(device="cuda", worker_thread="off")).token2wav.worker_thread is False
    assert parse_stage_config(stages(device="cpu", worker_thread="on")).token2wav.worker_thread is True
    for value, expected in ((True, True), (False, False), ("auto", parse_stage_config(stages()).token2wav.on_cuda)):
        assert parse_stage_config(stages(worker_thread=value)).token2wav.worker_thread == expected
    assert_refused(stages(worker_thread="sometimes"), "stages.token2wav.worker_thread")


def test_stage_config_dit_dtype_field() -> None:
    assert parse_stage_config(stages(device="cpu")).token2wav.settings.dit_dtype == "float32"  # auto on the CPU
    assert parse_stage_config(stages(device="cuda")).token2wav.settings.dit_dtype == "bfloat16"
    assert (
        parse_stage_config(stages(device="cuda", dit_dtype="float32")).token2wav.settings.torch_dit_dtype
        == torch.float32
    )
    assert parse_stage_config(stages(dit_dtype="float16")).token2wav.settings.torch_dit_dtype == torch.float16
    for bad in ("int8", "half", 16):
        assert_refused(stages(dit_dtype=bad), "stages.token2wav.dit_dtype")
    assert_refused(on_the_talker("dit_dtype", "bfloat16"), "stages.talker.dit_dtype")


def test_stage_config_compile_field() -> None:
    for value, expected in (("on", True), ("off", False), (True, True), (False, False)):
        assert parse_stage_config(stages(compile=value)).token2wav.settings.compile is expected  # YAML reads on as True
    assert parse_stage_config(stages(device="cpu")).token2wav.settings.compile is False  # auto: off on the CPU
    assert parse_stage_config(stages(device="cpu", compile="on")).token2wav.settings.compile is True
    assert parse_stage_config(stages(device="cuda")).token2wav.settings.compile is True  # auto: on with CUDA
    assert parse_stage_config(stages(device="cuda", compile="off")).token2wav.settings.compile is False
    for bad in ("yes", 1, "max-autotune"):
        assert_refused(stages(compile=bad), "stages.token2wav.compile")
    assert_refused(on_the_talker("compile", "on"), "stages.talker.compile")


def test_the_cpu_engine_runs_the_dit_uncompiled_by_default(tiny_engine) -> None:
    assert tiny_engine.cfg.token2wav.settings.compile is False
    assert not tiny_engine.core.token2wav.compile_dit


# ---------------------------------------------------------------------------------------------------
# CUDA graphs of the compiled solve (GPU)

GPU_SOLVE_TOLERANCE = 1e-4
"""Compiled and graph-replayed DiT solve vs the eager, uncompiled one on the same GPU, relative to the mel's peak:
float32 rounding of the fused kernels, compounded over 36 evaluations (uncompiled, the replayed solve equals the
eager one bit for bit on a GPU, padded windows included)."""


@pytest.fixture(scope="module")
def cuda_model():
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    return build_token2wav().to("cuda")


@pytest.fixture(scope="module")
def cuda_compiled(cuda_model):
    t2w = StreamingToken2Wav(cuda_model, compile_dit=True, fused_vocoder=True, max_batch=4)
    before = graphs_compiled()
    t2w.warm_up(max_batch=4)
    return t2w, graphs_compiled() - before


@needs_cuda
@pytest.mark.parametrize("frames", [72, 144, 100])
def test_captured_compiled_solve_equals_the_eager_uncompiled_solve(cuda_model, cuda_compiled, frames: int) -> None:
    """The DiT ODE solve of one window replayed from a graph captured around the compiled blocks (100 frames: padded
    to the 144-frame graph) vs the same window solved eagerly by the transformers blocks."""
    t2w, _ = cuda_compiled
    eager = StreamingToken2Wav(cuda_model, cuda_graphs=False)
    dit = cuda_model.code2wav_dit_model
    width = dit.input_embed.proj.in_features - dit.config.mel_dim
    g = torch.Generator().manual_seed(frames)
    job = WindowJob(
        torch.randn(1, frames, MEL_DIM, generator=g).cuda(),
        torch.randn(2, frames, width, generator=g).cuda(),
        first_frame=48,
    )
    replays = t2w.graph_stats().dit_replays
    with torch.inference_mode():
        (ours,) = t2w._dit_batches.solve([job])
        (expected,) = eager._dit_batches.solve([job])
    assert t2w.graph_stats().dit_replays == replays + 1
    peak = expected.abs().max().item()
    assert (ours - expected).abs().max().item() < GPU_SOLVE_TOLERANCE * peak


@needs_cuda
def test_compiled_graphs_stream_like_the_eager_path(cuda_model, cuda_compiled) -> None:
    """Whole utterances through the compiled, graph-captured synthesizer with the fused vocoder activations (as the
    engine builds it), stepped alone and batched on the token2wav worker's thread and CUDA stream (as the engine runs
    it): audio within the graphs tests' tolerance of the eager uncompiled path (:data:`GPU_TOLERANCE`: the vocoder's
    cuDNN rounding), every DiT solve a replay, and no graph
    compiled after the warm-up."""
    t2w, count = cuda_compiled
    assert count == 1
    after_warm_up = graphs_compiled()
    eager = StreamingToken2Wav(cuda_model, cuda_graphs=False)
    case = utterance(141, seed=141)
    diff = np.abs(np.concatenate(run_stream(t2w, *case)) - np.concatenate(run_stream(eager, *case))).max()
    assert diff < GPU_TOLERANCE, f"max |compiled graphs - eager| = {diff:.3g}"
    cases = [utterance(n, seed=10 + n) for n in BATCH_LENGTHS]
    worker = Token2WavWorker(t2w, torch.device("cuda"))
    try:
        streams = []
        for codes, cond, ref_mel, noise in cases:
            stream = t2w.start(cond, ref_mel, noise=noise, max_codes=len(codes))
            stream.push(codes)
            stream.finish()
            streams.append(stream)
        chunks: list[list[np.ndarray]] = [[] for _ in streams]
        while not all(s.done for s in streams):
            ready = [s for s in streams if s.ready()]
            worker.submit(ready, urgent=any(s.chunks_emitted == 0 for s in ready))
            (result,) = worker.poll(wait=True)
            assert result.error is None, result.error
            for stream, samples in zip(result.streams, result.chunks):
                chunks[streams.index(stream)].append(samples)
    finally:
        worker.close()
    for case, got in zip(cases, chunks):
        expected = np.concatenate(run_stream(eager, *case))
        assert np.abs(np.concatenate(got) - expected).max() < GPU_TOLERANCE
    stats = t2w.graph_stats()
    assert stats.eager_dit_solves == 0 and stats.dit_compiled and stats.vocoder_fused
    assert graphs_compiled() == after_warm_up


@needs_cuda
def test_compiled_graphs_with_tf32_stay_close(cuda_model) -> None:
    """TF32 products in the compiled blocks (the packaged GPU setting; compiled and captured under the synthesizer's
    TF32 switch, which dynamo guards): within TF32's error of the float32 eager path, every solve a replay, and the
    process-wide switch left as it was."""
    before = torch.backends.cuda.matmul.allow_tf32
    fast = StreamingToken2Wav(cuda_model, tf32_matmul=True, compile_dit=True)
    fast.warm_up(max_batch=1)
    assert torch.backends.cuda.matmul.allow_tf32 == before
    case = utterance(70, seed=3)
    chunks = np.concatenate(run_stream(fast, *case))
    expected = np.concatenate(run_stream(StreamingToken2Wav(cuda_model, cuda_graphs=False), *case))
    assert np.abs(chunks - expected).max() < 2e-2 * np.abs(expected).max()
    assert fast.graph_stats().eager_dit_solves == 0
