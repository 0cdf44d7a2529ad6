"""The DiT's block attention as one Triton kernel that reads the query/key/value product in place.

Through ``scaled_dot_product_attention`` a DiT block's attention is five kernels on the H100: the
RoPE of the first head for queries and keys (two), their concatenation with the other heads (one), cuDNN's attention
over a (rows, 1, L, L) mask, and the transpose of its output back to (rows, L, heads * head_dim). In the steady
window they took ~28% of an evaluation's kernel time at one stream, ~30% at sixteen (``profile_token2wav.py``):
every tensor is tiny, so each kernel costs its launch and a pass over memory. :func:`dit_attention` does all five in
one kernel:

- it reads queries, keys and values straight from the block's (rows, L, 3 * inner) product (q | k | v, each
  ``heads`` heads of ``head_dim``), rotating the first head's queries and keys as it loads them;
- the mask is computed from each frame's attention block id and the layer's reach, never materialized;
- it writes (rows, L, inner), the layout the output projection reads.

The arithmetic is transformers' ``DiTAttention`` (and :func:`.dit.dit_block`'s): RoPE on head 0 only, over the head
dimension deinterleaved (even indices, then odd) and rotated by halves; softmax scale ``head_dim ** -0.5``; a query at
block ``qb`` sees keys at blocks ``qb - back .. qb + ahead``. Queries and keys of head 0 are taken in the deinterleaved
order, which changes nothing in their dot products. Precision: the rotation in float32, rounded once to the input
dtype (as inductor's fused kernel does); products in the tensor cores with float32 accumulation, probabilities
rounded to the input dtype before the value product (as flash attention does).

:func:`dit_attention` is registered as the custom op ``omni_realtime::dit_attention`` so that ``torch.compile`` keeps
it as one call inside the compiled block, and the CUDA graphs record its kernel. It needs Triton; on the CPU the
tests run it through Triton's interpreter (``TRITON_INTERPRET=1``).
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["NUM_STAGES", "NUM_WARPS", "dit_attention", "dit_attention_available", "launch"]

NUM_WARPS = 4
NUM_STAGES = 1
"""Launch settings: the fastest of the tile and launch settings timed on an H100 at 1 and 16 streams. A program
holds one attention block of queries (24 frames for Qwen2.5-Omni, in a tile of 32) and reads the blocks in its
reach one at a time."""

try:  # Triton ships with CUDA builds of torch; CPU-only installs keep the SDPA block
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - depends on the install
    triton = None


def dit_attention_available(device: torch.device, dtype: torch.dtype) -> bool:
    """Whether :func:`dit_attention` can run the DiT's attention there: Triton with CUDA, half precision (float32
    blocks keep SDPA, which computes them in float32; the kernel's products would round to TF32)."""
    return triton is not None and torch.device(device).type == "cuda" and dtype in (torch.bfloat16, torch.float16)


if triton is not None:

    @triton.jit
    def _load_head(base, frames, valid, stride_l, cos_ptr, sin_ptr, stride_cl, ROTATE, HEAD_DIM: tl.constexpr):
        """(frames, HEAD_DIM) of one head, starting at ``base``; with ``ROTATE`` (head 0 of queries and keys) the
        head dimension deinterleaved and rotated by halves, in float32, rounded once to the input dtype."""
        dims = tl.arange(0, HEAD_DIM)
        half: tl.constexpr = HEAD_DIM // 2
        rows = frames[:, None] * stride_l
        if ROTATE:
            source = tl.where(dims < half, 2 * dims, 2 * (dims - half) + 1)  # deinterleaved order
            partner = (dims + half) % HEAD_DIM
            partner_source = tl.where(partner < half, 2 * partner, 2 * (partner - half) + 1)
            x = tl.load(base + rows + source[None, :], mask=valid[:, None], other=0.0).to(tl.float32)
            other = tl.load(base + rows + partner_source[None, :], mask=valid[:, None], other=0.0).to(tl.float32)
            table = frames[:, None] * stride_cl + dims[None, :]
            cos = tl.load(cos_ptr + table, mask=valid[:, None], other=0.0).to(tl.float32)
            sin = tl.load(sin_ptr + table, mask=valid[:, None], other=0.0).to(tl.float32)
            sign = tl.where(dims < half, -1.0, 1.0)
            head = (x * cos + sign[None, :] * other * sin).to(base.dtype.element_ty)
        else:
            head = tl.load(base + rows + dims[None, :], mask=valid[:, None], other=0.0)
        return head

    @triton.jit
    def _dit_attention_kernel(
        QKV,
        Cos,
        Sin,
        Blocks,
        Reach,
        Out,
        length,
        block_size,
        scale,
        stride_qr,
        stride_ql,
        stride_cr,
        stride_cl,
        stride_br,
        stride_bl,
        stride_or,
        stride_ol,
        INNER: tl.constexpr,
        HEAD_DIM: tl.constexpr,
        BLOCK: tl.constexpr,
    ):
        # One program per (attention block, head, row): the window starts on a block boundary, so the block's
        # queries are frames [t * block_size, (t + 1) * block_size) and the keys in reach are whole blocks
        # t - back .. t + ahead, one loop iteration each, with an online softmax (most layers: one iteration, their
        # own block). Which keys a query sees is still decided by the block ids, which keep padding frames apart.
        tile, head, row = tl.program_id(0), tl.program_id(1), tl.program_id(2)
        ahead = tl.load(Reach)
        back = tl.load(Reach + 1)
        rotate = head == 0
        base = QKV + row * stride_qr + head * HEAD_DIM
        cos_ptr, sin_ptr = Cos + row * stride_cr, Sin + row * stride_cr
        offsets = tl.arange(0, BLOCK)
        queries = tile * block_size + offsets
        query_valid = (offsets < block_size) & (queries < length)
        q = _load_head(base, queries, query_valid, stride_ql, cos_ptr, sin_ptr, stride_cl, rotate, HEAD_DIM)
        query_blocks = tl.load(Blocks + row * stride_br + queries * stride_bl, mask=query_valid, other=0)
        best = tl.full((BLOCK,), float("-inf"), tl.float32)
        total = tl.zeros((BLOCK,), tl.float32)
        acc = tl.zeros((BLOCK, HEAD_DIM), tl.float32)
        dims = tl.arange(0, HEAD_DIM)
        for key_tile in range(tl.maximum(tile - back, 0), tl.minimum(tile + ahead + 1, tl.cdiv(length, block_size))):
            keys = key_tile * block_size + offsets
            key_valid = (offsets < block_size) & (keys < length)
            key_blocks = tl.load(Blocks + row * stride_br + keys * stride_bl, mask=key_valid, other=0)
            k = _load_head(base + INNER, keys, key_valid, stride_ql, cos_ptr, sin_ptr, stride_cl, rotate, HEAD_DIM)
            v = tl.load(
                base + 2 * INNER + keys[:, None] * stride_ql + dims[None, :], mask=key_valid[:, None], other=0.0
            )
            diff = key_blocks[None, :] - query_blocks[:, None]
            allowed = key_valid[None, :] & (diff >= -back) & (diff <= ahead)
            scores = tl.where(allowed, tl.dot(q, tl.trans(k)) * scale, float("-inf"))
            new_best = tl.maximum(best, tl.max(scores, 1))
            shift = tl.where(new_best == float("-inf"), 0.0, new_best)  # a row with nothing allowed yet
            weights = tl.exp(scores - shift[:, None])
            decay = tl.exp(best - shift)
            total = total * decay + tl.sum(weights, 1)
            acc = acc * decay[:, None] + tl.dot(weights.to(v.dtype), v)
            best = new_best
        total = tl.where(total == 0.0, 1.0, total)  # padding queries outside every reach: zeros, not NaN
        out = Out + row * stride_or + queries[:, None] * stride_ol + head * HEAD_DIM + dims[None, :]
        tl.store(out, (acc / total[:, None]).to(Out.dtype.element_ty), mask=query_valid[:, None])


@torch.library.custom_op("omni_realtime::dit_attention", mutates_args=())
def dit_attention(
    qkv: Tensor, cos: Tensor, sin: Tensor, blocks: Tensor, reach: Tensor, heads: int, block_size: int
) -> Tensor:
    """The attention of one DiT block: ``qkv`` (rows, L, 3 * inner) the block's query/key/value product (inner =
    ``heads`` * head_dim, last dimension contiguous); ``cos``/``sin`` (rows, L, head_dim) the RoPE tables;
    ``blocks`` (rows, L) integer attention block of each frame (any per-row offset: only differences count; padding
    frames far from every real block); ``reach`` (2,) int64 on the device, (look-ahead, look-back) in blocks;
    ``block_size`` frames per block. Contract: every window starts on a block boundary (frame ``i`` of a row is in the
    row's ``i // block_size``-th block, as the synthesizer lays windows out: chunk boundaries fall on blocks); the
    kernel reads keys block by block on that layout. A padding query attends to the padding keys in its reach (SDPA:
    to all of them); no real frame sees padding, so this changes nothing the synthesizer keeps. Returns (rows, L,
    inner) in ``qkv``'s dtype. Queued on the current stream; no host synchronisation."""
    return launch(qkv, cos, sin, blocks, reach, heads, block_size)


def launch(
    qkv: Tensor,
    cos: Tensor,
    sin: Tensor,
    blocks: Tensor,
    reach: Tensor,
    heads: int,
    block_size: int,
    *,
    num_warps: int | None = None,
    num_stages: int | None = None,
) -> Tensor:
    """:func:`dit_attention`'s kernel with other launch settings, for timing alternatives; None takes the packaged
    ones."""
    rows, length, width = qkv.shape
    inner = width // 3
    head_dim = inner // heads
    if qkv.stride(2) != 1 or cos.stride(2) != 1 or sin.stride() != cos.stride():
        raise ValueError("dit_attention needs qkv, cos and sin contiguous in their last dimension, cos and sin alike")
    out = qkv.new_empty(rows, length, inner)
    if rows == 0 or length == 0:
        return out
    grid = (triton.cdiv(length, block_size), heads, rows)
    _dit_attention_kernel[grid](
        qkv,
        cos,
        sin,
        blocks,
        reach,
        out,
        length,
        block_size,
        head_dim**-0.5,
        qkv.stride(0),
        qkv.stride(1),
        cos.stride(0),
        cos.stride(1),
        blocks.stride(0),
        blocks.stride(1),
        out.stride(0),
        out.stride(1),
        INNER=inner,
        HEAD_DIM=head_dim,
        BLOCK=max(16, triton.next_power_of_2(block_size)),
        num_warps=num_warps or NUM_WARPS,
        num_stages=num_stages or NUM_STAGES,
    )
    return out


@dit_attention.register_fake
def _(qkv: Tensor, cos: Tensor, sin: Tensor, blocks: Tensor, reach: Tensor, heads: int, block_size: int) -> Tensor:
    rows, length, width = qkv.shape
    return qkv.new_empty(rows, length, width // 3)
