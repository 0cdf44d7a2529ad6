"""token2wav's GPU path: static shapes (packing DiT windows with masked padding) and, on a
CUDA machine, CUDA-graph replays against the eager path (same noise, same codes) on the tiny token2wav of
tests/helpers/token2wav.py. The CPU tests check the pieces the graphs rely on; the GPU tests skip without CUDA."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.models.qwen2_5_omni.chunk_schedule import ChunkingConfig
from pipeline.models.qwen2_5_omni.token2wav_graphs import (
    PAD_BLOCK,
    CapturedCall,
    GraphCaptureError,
    WindowJob,
    bucket_at_least,
    pack_windows,
    slot_bucket,
    slot_sizes,
)
from pipeline.models.qwen2_5_omni.token2wav_stream import StreamingToken2Wav
from tests.helpers.token2wav import BATCH_LENGTHS, GPU_TOLERANCE, build_token2wav, drive_together, run_stream, utterance

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


# ---------------------------------------------------------------------------------------------------
# Static shapes (CPU)


def test_buckets() -> None:
    assert [bucket_at_least(n, (144, 72)) for n in (1, 72, 73, 144, 145)] == [72, 72, 144, 144, None]
    assert [slot_bucket(n, 8) for n in (1, 2, 3, 5, 8)] == [1, 2, 4, 8, 8]
    assert [slot_bucket(n, 6) for n in (3, 5, 6)] == [4, 6, 6]
    for bad in (0, 9):
        with pytest.raises(ValueError):
            slot_bucket(bad, 8)
    assert slot_sizes(16) == (1, 2, 4, 8, 16)
    assert slot_sizes(12) == (1, 2, 4, 8, 12)


def job(length: int, first_frame: int, seed: int, groups: int = 2, width: int = 3) -> WindowJob:
    g = torch.Generator().manual_seed(seed)
    return WindowJob(
        torch.randn(1, length, 4, generator=g), torch.randn(groups, length, width, generator=g), first_frame
    )


def test_pack_windows_layout() -> None:
    """Rows are group-major (row g * slots + i), real frames first, padding zero-filled with positions that go
    on counting; blank slots are all padding."""
    jobs = [job(5, first_frame=6, seed=1), job(3, first_frame=0, seed=2)]
    packed = pack_windows(jobs, frames=8, slots=4, block_size=2)
    assert packed.noise.shape == (4, 8, 4) and packed.features.shape == (8, 8, 3)
    assert packed.positions.shape == (8, 8) and packed.block_diff.shape == (8, 8, 8)
    assert packed.lengths == (5, 3)
    for slot, j in enumerate(jobs):
        n = j.frames
        torch.testing.assert_close(packed.noise[slot, :n], j.noise[0], rtol=0, atol=0)
        assert not packed.noise[slot, n:].any()
        for group in range(2):
            row = group * 4 + slot
            torch.testing.assert_close(packed.features[row, :n], j.features[group], rtol=0, atol=0)
            assert not packed.features[row, n:].any()
            assert packed.positions[row].tolist() == list(range(j.first_frame, j.first_frame + 8))
        torch.testing.assert_close(packed.window(packed.noise, slot), j.noise, rtol=0, atol=0)
    assert not packed.noise[2:].any() and not packed.features[[2, 3, 6, 7]].any()
    assert not packed.block_diff[[2, 3, 6, 7]].any()  # blank slots: one padding block, all visible to each other


@settings(max_examples=40, deadline=None)
@given(
    lengths=st.lists(st.integers(1, 12), min_size=1, max_size=3),
    first_blocks=st.lists(st.integers(0, 50), min_size=3, max_size=3),
    block_size=st.sampled_from([1, 2, 4]),
)
def test_padding_is_outside_every_real_frames_attention(lengths, first_blocks, block_size) -> None:
    """Among real frames the block differences are those of the unpadded window; between a real and a padding
    frame they exceed any look-ahead/look-back reach (the DiT's layers reach one block); padding frames see each
    other (a fully masked row would be NaN)."""
    jobs = [job(n, first_frame=b * block_size, seed=i) for i, (n, b) in enumerate(zip(lengths, first_blocks))]
    packed = pack_windows(jobs, frames=12, slots=4, block_size=block_size)
    for slot, j in enumerate(jobs):
        n = j.frames
        blocks = torch.arange(j.first_frame, j.first_frame + n) // block_size
        for row in (slot, 4 + slot):
            diff = packed.block_diff[row]
            assert torch.equal(diff[:n, :n], blocks.unsqueeze(0) - blocks.unsqueeze(1))
            assert (diff[:n, n:].abs() > 1000).all() and (diff[n:, :n].abs() > 1000).all()
            assert not diff[n:, n:].any()
    assert PAD_BLOCK < -1000


def test_pack_windows_refuses_what_does_not_fit() -> None:
    with pytest.raises(ValueError, match="slots"):
        pack_windows([job(2, 0, seed=i) for i in range(3)], frames=4, slots=2, block_size=2)
    with pytest.raises(ValueError, match="longer"):
        pack_windows([job(5, 0, seed=0)], frames=4, slots=1, block_size=2)


def test_captured_call_needs_cuda_tensors() -> None:
    with pytest.raises(GraphCaptureError):
        CapturedCall(lambda x: x + 1, (torch.zeros(2),))


# ---------------------------------------------------------------------------------------------------
# CUDA graphs (GPU)


@needs_cuda
def test_captured_call_replays_with_new_inputs() -> None:
    def fn(a, b):
        return (a @ b).relu() + 1, a.sum()

    a, b = torch.randn(8, 16, device="cuda"), torch.randn(16, 4, device="cuda")
    call = CapturedCall(fn, (a, b))
    for seed in range(3):
        g = torch.Generator("cuda").manual_seed(seed)
        a, b = torch.randn(8, 16, device="cuda", generator=g), torch.randn(16, 4, device="cuda", generator=g)
        out, total = call(a, b)
        expected, expected_total = fn(a, b)
        torch.testing.assert_close(out, expected)
        torch.testing.assert_close(total, expected_total)
    assert call.replays == 3
    with pytest.raises(GraphCaptureError, match="shapes"):
        call(a[:4], b)


@needs_cuda
def test_captured_calls_capture_on_their_own_stream_unless_given_one() -> None:
    """Each call captures on its own stream by default (cuBLAS keeps a workspace per stream, so graphs that may
    replay at the same time must not share one, pytorch/pytorch#193402); calls given a stream share it."""
    a, b = torch.randn(8, 16, device="cuda"), torch.randn(16, 4, device="cuda")
    first, second = CapturedCall(torch.matmul, (a, b)), CapturedCall(torch.matmul, (a, b))
    assert first.capture_stream != second.capture_stream
    assert first.capture_stream != torch.cuda.current_stream()
    shared = torch.cuda.Stream()
    calls = [CapturedCall(torch.matmul, (a, b), capture_stream=shared) for _ in range(2)]
    assert all(call.capture_stream == shared for call in calls)
    torch.testing.assert_close(calls[1](a, b), a @ b)


@pytest.fixture(scope="module")
def cuda_model():
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    return build_token2wav().to("cuda")


@needs_cuda
@pytest.mark.parametrize("n_codes", [23, 70, 141])
def test_graphs_equal_the_eager_path(cuda_model, n_codes: int) -> None:
    """Every DiT solve replays a graph (windows padded to the first/steady lengths); the vocoder replays for the
    first and steady chunk lengths and runs eagerly for the others; the audio equals the eager path's."""
    codes, cond, ref_mel, noise = utterance(n_codes, seed=n_codes)
    eager = StreamingToken2Wav(cuda_model, cuda_graphs=False)
    graphed = StreamingToken2Wav(cuda_model)
    assert graphed.cuda_graphs and not eager.cuda_graphs
    expected = run_stream(eager, codes, cond, ref_mel, noise)
    chunks = run_stream(graphed, codes, cond, ref_mel, noise)
    assert [len(c) for c in chunks] == [len(c) for c in expected]
    diff = np.abs(np.concatenate(chunks) - np.concatenate(expected)).max()
    assert np.abs(np.concatenate(expected)).max() > 0.1
    assert diff < GPU_TOLERANCE, f"max |graphs - eager| = {diff:.3g}"
    stats = graphed.graph_stats()
    assert stats.eager_dit_solves == 0 and stats.dit_replays == len(chunks)
    assert (stats.vocoder_replays, stats.eager_vocoder_calls) == VOCODER_CALLS[n_codes]
    assert set(stats.vocoder_graphs) <= {(48, 1), (112, 1)} and set(stats.dit_graphs) <= {(72, 1), (144, 1)}


VOCODER_CALLS = {  # (replayed, eager) vocoder calls per utterance length in codes
    23: (0, 1),  # one chunk of 46 frames (finished before the first regular chunk)
    70: (2, 1),  # 48, 40 + 72, then 40 + 20 frames
    141: (4, 1),  # 48, three of 40 + 72, then 40 + 18
}


@needs_cuda
def test_step_many_with_graphs_equals_eager_steps(cuda_model) -> None:
    cases = [utterance(n, seed=10 + n) for n in BATCH_LENGTHS]
    graphed = StreamingToken2Wav(cuda_model)
    together, batches = drive_together(graphed, cases)
    assert batches == [3, 2, 2, 1]
    eager = StreamingToken2Wav(cuda_model, cuda_graphs=False)
    for case, chunks in zip(cases, together):
        alone = run_stream(eager, *case)
        diff = np.abs(np.concatenate(chunks) - np.concatenate(alone)).max()
        assert diff < GPU_TOLERANCE, f"max |graphs - eager| = {diff:.3g}"
    stats = graphed.graph_stats()
    assert stats.eager_dit_solves == 0 and (72, 4) in stats.dit_graphs and (144, 2) in stats.dit_graphs


@needs_cuda
def test_tf32_matmuls_stay_close_and_leave_the_global_switch_alone(cuda_model) -> None:
    """Opt-in TF32 DiT products: the audio stays within a few per mille of the float32 path (tf32 rounds inputs to
    10 mantissa bits); the process-wide switch is only on while the synthesizer works."""
    codes, cond, ref_mel, noise = utterance(70, seed=3)
    before = torch.backends.cuda.matmul.allow_tf32
    fast = StreamingToken2Wav(cuda_model, tf32_matmul=True)
    chunks = run_stream(fast, codes, cond, ref_mel, noise)
    assert torch.backends.cuda.matmul.allow_tf32 == before
    expected = np.concatenate(
        run_stream(StreamingToken2Wav(cuda_model, cuda_graphs=False), codes, cond, ref_mel, noise)
    )
    diff = np.abs(np.concatenate(chunks) - expected).max()
    assert diff < 2e-2 * np.abs(expected).max(), f"max |tf32 - float32| = {diff:.3g}"


@needs_cuda
def test_warm_up_captures_every_regular_shape(cuda_model) -> None:
    t2w = StreamingToken2Wav(cuda_model, ChunkingConfig(), max_batch=4)
    t2w.warm_up(max_batch=3)
    expected_dit = tuple((frames, slots) for frames in (72, 144) for slots in (1, 2, 4))
    stats = t2w.graph_stats()
    expected_vocoder = tuple((frames, slots) for frames in (48, 112) for slots in (1, 2, 4))
    assert stats.dit_graphs == expected_dit and stats.vocoder_graphs == expected_vocoder
    assert stats.dit_replays == stats.vocoder_replays == 0
    # every graph of the synthesizer on its one capture stream, which no decode step's graphs use
    graphs = [*t2w._dit_batches.captured.values(), *t2w._vocoder.captured.values()]
    assert {call.capture_stream for call in graphs} == {t2w.capture_stream}
    run_stream(t2w, *utterance(100, seed=5))
    after = t2w.graph_stats()
    assert after.dit_graphs == expected_dit and after.vocoder_graphs == expected_vocoder  # nothing new captured
    assert after.dit_replays > 0 and after.vocoder_replays > 0
