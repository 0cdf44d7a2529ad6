"""The DiT's block attention as one Triton kernel (pipeline/models/qwen2_5_omni/dit_attention.py).

What is checked: the kernel equals the SDPA attention (:func:`.dit.sdpa_attention`), and a block through it the SDPA
block, up to half-precision rounding, with padded windows, every reach the 7B uses, RoPE on the first head and windows
that start mid-utterance (on block boundaries, the kernel's contract, which the synthesizer checks); a wrong reach or
a missing rotation would be caught (the same comparison then fails by an order of magnitude); the choice's config
(``dit_attention``) and its refusals. The kernel runs compiled on a GPU and in Triton's interpreter on the CPU (a
subprocess); the interpreter's bfloat16 ``tl.dot`` came out wrong (scores of ~1e9 from unit inputs, Triton 3.9), so
there the check runs in float16, which takes the same code path. The GPU tests compile, capture and stream a whole
synthesizer with the kernel against the SDPA one.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from pipeline.config import parse_stage_config
from pipeline.errors import ConfigError
from pipeline.models.qwen2_5_omni.token2wav_stream import StreamingToken2Wav
from tests.helpers.token2wav import (
    assert_refused,
    build_token2wav,
    graphs_compiled,
    on_the_talker,
    run_stream,
    stages,
    utterance,
)
from tests.helpers.triton_check import TritonCheck

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

BLOCK_CHECK = """
import torch
from pipeline.models.qwen2_5_omni.dit import DitAttention, DitBlock, sdpa_attention
from pipeline.models.qwen2_5_omni.dit_attention import dit_attention
from pipeline.models.qwen2_5_omni.token2wav_graphs import PAD_BLOCK

torch.set_num_threads(1)
cuda = torch.cuda.is_available()
device, dtype = ("cuda", torch.bfloat16) if cuda else ("cpu", torch.float16)
generator = torch.Generator().manual_seed(0)
BLOCK = 24

def randn(*shape, scale=1.0):
    return (torch.randn(*shape, generator=generator) * scale).to(device, dtype)

def layout(heads, head_dim, slots, frames, lengths, first_frame):
    rows = 2 * slots  # conditioned and unconditioned rows, group-major as pack_windows lays them out
    blocks = torch.full((rows, frames), PAD_BLOCK, dtype=torch.long)
    for slot, length in enumerate(lengths):
        blocks[slot::slots, :length] = torch.arange(first_frame, first_frame + length) // BLOCK
    block_diff = (blocks.unsqueeze(1) - blocks.unsqueeze(2)).to(device)
    positions = torch.arange(first_frame, first_frame + frames).float()
    angles = positions[:, None] / 10000 ** (torch.arange(0, head_dim, 2).float() / head_dim)[None, :]
    angles = torch.cat([angles, angles], dim=-1)
    cos = angles.cos().expand(rows, frames, head_dim).to(device, dtype).contiguous()
    sin = angles.sin().expand(rows, frames, head_dim).to(device, dtype).contiguous()
    return block_diff, cos, sin

def mask_of(block_diff, reach):
    ahead, back = reach
    return ((block_diff >= -back) & (block_diff <= ahead)).unsqueeze(1)

def case(heads, head_dim, slots, frames, lengths, first_frame, reach):
    block_diff, cos, sin = layout(heads, head_dim, slots, frames, lengths, first_frame)
    qkv = randn(2 * slots, frames, 3 * heads * head_dim)
    ids = block_diff[:, 0, :].contiguous()
    exact = sdpa_attention(qkv.float(), mask_of(block_diff, reach), cos.float(), sin.float(), heads)
    half = sdpa_attention(qkv, mask_of(block_diff, reach), cos, sin, heads).float()

    real = block_diff[:, 0, :] > PAD_BLOCK // 2  # padding frames differ by design (see dit_attention) and are unused

    def kernel(reach, sin=sin):
        return dit_attention(qkv, cos, sin, ids, torch.tensor(reach, device=device), heads, BLOCK).float()[real]

    got = kernel(reach)
    assert torch.isfinite(got).all()
    exact, half = exact[real], half[real]
    peak = exact.abs().max().item()
    error, sdpa_error = ((x - exact).abs().max().item() / peak for x in (got, half))
    # the kernel rounds as SDPA does in the same precision (probabilities to half precision before the value product)
    assert error < 1.5 * sdpa_error + 1e-3, (heads, head_dim, slots, frames, first_frame, reach, error, sdpa_error)
    # what the comparison catches: another reach, or the first head left unrotated
    for wrong in (kernel((0, 0) if reach != (0, 0) else (1, 0)), kernel(reach, sin=torch.zeros_like(sin))):
        assert (wrong - exact).abs().max().item() / peak > 10 * (sdpa_error + 1e-3)
    if len(set(lengths)) > 1:  # padding frames: finite
        assert torch.isfinite(dit_attention(qkv, cos, sin, ids, torch.tensor(reach, device=device), heads, BLOCK)).all()

# the 7B's three reaches and both; first-chunk and steady lengths; padded batches of two; windows starting
# mid-utterance (on a block boundary, as the synthesizer lays them out); a last window ending mid-block
case(2, 16, 1, 48, (48,), 0, (0, 0))
case(2, 16, 2, 72, (72, 50), 24, (1, 0))
case(2, 32, 1, 144, (144,), 48, (0, 1))
case(4, 16, 2, 40, (40, 17), 0, (1, 1))
case(2, 16, 1, 72, (61,), 24, (1, 1))
if cuda:  # the 7B's head layout (16 heads of 64), a steady window of 16 streams
    case(16, 64, 16, 144, (144,) * 15 + (100,), 96, (0, 0))

# a whole block through DitBlock: Triton attention against SDPA, as dit_velocity calls them
heads, head_dim, dim, frames = 2, 16, 64, 72
block_diff, cos, sin = layout(heads, head_dim, 2, frames, (72, 40), 48)
inner = heads * head_dim
weights = (randn(3 * inner, dim, scale=0.2), randn(3 * inner, scale=0.1), randn(dim, inner, scale=0.2),
           randn(dim, scale=0.1), randn(2 * dim, dim, scale=0.2), randn(2 * dim, scale=0.1),
           randn(dim, 2 * dim, scale=0.2), randn(dim, scale=0.1))
hidden, modulation = randn(4, frames, dim), randn(6, dim, scale=0.5)
sdpa = DitBlock(DitAttention.SDPA)(hidden, modulation, *weights, mask_of(block_diff, (1, 0)), cos, sin, heads=heads,
                                   block_size=BLOCK).float()
triton = DitBlock(DitAttention.TRITON)(hidden, modulation, *weights, block_diff[:, 0, :].contiguous(),
                                       torch.tensor((1, 0), device=device), cos, sin, heads=heads,
                                       block_size=BLOCK).float()
real = block_diff[:, 0, :] > PAD_BLOCK // 2
assert (triton - sdpa)[real].abs().max().item() < 0.05 * sdpa[real].abs().max().item()
print("ok")
"""


BLOCK = TritonCheck(BLOCK_CHECK)


@pytest.mark.background(BLOCK)
def test_the_triton_attention_equals_sdpa() -> None:
    """On the GPU the compiled kernel in bfloat16; without one, the same kernel in Triton's interpreter in float16."""
    BLOCK.assert_ok()


def test_triton_attention_needs_cuda_and_half_precision() -> None:
    model = build_token2wav()
    for kwargs in ({}, {"dit_dtype": torch.bfloat16}):
        with pytest.raises(ConfigError) as info:
            StreamingToken2Wav(model, dit_attention="triton", **kwargs)
        assert info.value.param == "dit_attention" and "needs Triton, the DiT on CUDA" in str(info.value)
    with pytest.raises(ConfigError) as info:
        StreamingToken2Wav(model, dit_attention="flash")
    assert info.value.param == "dit_attention" and "sdpa, triton" in str(info.value)
    assert StreamingToken2Wav(model, dit_attention="sdpa").dit_attention.value == "sdpa"


def test_stage_config_dit_attention_field() -> None:
    assert parse_stage_config(stages(device="cpu")).token2wav.settings.dit_attention == "sdpa"  # auto: no Triton kernel
    for value in ("triton", "sdpa"):
        assert parse_stage_config(stages(dit_attention=value)).token2wav.settings.dit_attention == value
    for bad in ("flash", True, 1):
        assert_refused(stages(dit_attention=bad), "stages.token2wav.dit_attention")
    assert_refused(on_the_talker("dit_attention", "triton"), "stages.talker.dit_attention")


@needs_cuda
def test_auto_picks_triton_when_compiled_on_cuda_in_half_precision() -> None:
    pytest.importorskip("triton")
    assert parse_stage_config(stages(device="cuda")).token2wav.settings.dit_attention == "triton"
    assert parse_stage_config(stages(device="cuda", compile="off")).token2wav.settings.dit_attention == "sdpa"
    assert parse_stage_config(stages(device="cuda", dit_dtype="float32")).token2wav.settings.dit_attention == "sdpa"


@needs_cuda
def test_a_compiled_synthesizer_with_triton_attention_streams_like_sdpa() -> None:
    """As the engine builds it on a GPU (bfloat16 blocks, compiled, graphs, fused vocoder), the Triton attention against
    SDPA: one compiled graph for every block, every solve a replay, and the same audio up to bfloat16 rounding."""
    pytest.importorskip("triton")
    model = build_token2wav().to("cuda")
    made = {}
    for attention in ("triton", "sdpa"):
        t2w = StreamingToken2Wav(
            model, compile_dit=True, fused_vocoder=True, max_batch=4, dit_dtype=torch.bfloat16, dit_attention=attention
        )
        before = graphs_compiled()
        t2w.warm_up(max_batch=4)
        assert graphs_compiled() - before == 1
        made[attention] = t2w
    case = utterance(141, seed=141)
    ours, expected = (np.concatenate(run_stream(made[a], *case)) for a in ("triton", "sdpa"))
    peak = np.abs(expected).max()
    assert peak > 0.05
    assert np.abs(ours - expected).max() < 2e-2 * peak
    assert made["triton"].graph_stats().eager_dit_solves == 0
