"""A decode step's layer arithmetic in 9 kernels instead of ~37: fused weights and three small Triton kernels.

Why: a captured decode step of the 7B thinker at batch 1 cost 8.7 ms against 4.7 ms to read its weights, and the
talker's 3.7 ms against 0.85 ms (H100). The difference is kernel count: HF's layer code makes ~37
kernels per layer (the RMSNorm alone is 6: upcast, square, mean, rsqrt, scale, weight), each a few µs on the GPU
even when replayed from a graph. Per layer this module runs:

    add + RMSNorm (1) → q|k|v projection (1 GEMM) → RoPE + KV-pool write (1) → attention (1) → o_proj (1)
    → add + RMSNorm (1) → gate|up projection (1 GEMM) → SiLU × up (1) → down_proj (1)

The arithmetic is HF's, rounding included: every elementwise step rounds to the model dtype where the eager
code does (a bf16 product is a float32 product rounded to bf16), so the fused step differs from the eager one only
by the order of float32 sums (the norm's mean, the concatenated GEMMs' tiling).

Fused weights do not cost memory: :func:`fuse_layer_weights` concatenates q/k/v and gate/up into new tensors and
points the HF modules' parameters at views of them, so prefill (which still calls the HF modules) reads the same
storage.

The kernels take CPU tensors under ``TRITON_INTERPRET=1`` (how the tests check them without a GPU).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from pipeline.kernels.decode_attention import triton

__all__ = ["FusedLayer", "add_rms_norm", "fuse_layer_weights", "fusable", "rope_and_store", "silu_mul"]


@dataclass(frozen=True)
class FusedLayer:
    """One decoder layer's weights as the fused step reads them (views; the HF modules share the storage)."""

    input_norm: torch.Tensor
    qkv_weight: torch.Tensor
    qkv_bias: torch.Tensor | None
    o_proj: torch.nn.Module
    post_norm: torch.Tensor
    gate_up_weight: torch.Tensor
    down_proj: torch.nn.Module
    eps: float


def fusable(layer) -> bool:
    """Whether ``layer`` has the Qwen2 structure the fused step reproduces exactly: RMSNorms with
    ``variance_epsilon``, bias-or-not q/k/v projections and no q/k norms, a SiLU-gated MLP without biases (a
    mixture-of-experts block is not one)."""
    attn, mlp = getattr(layer, "self_attn", None), getattr(layer, "mlp", None)
    if attn is None or mlp is None:
        return False
    if getattr(attn, "q_norm", None) is not None or getattr(attn, "k_norm", None) is not None:
        return False
    norms = (layer.input_layernorm, layer.post_attention_layernorm)
    if not all(hasattr(n, "variance_epsilon") and hasattr(n, "weight") for n in norms):
        return False
    if not all(hasattr(mlp, name) for name in ("gate_proj", "up_proj", "down_proj", "act_fn")):
        return False
    silu = isinstance(mlp.act_fn, torch.nn.SiLU) or type(mlp.act_fn).__name__ == "SiLUActivation"
    no_mlp_bias = mlp.gate_proj.bias is None and mlp.up_proj.bias is None
    same_bias = len({attn.q_proj.bias is None, attn.k_proj.bias is None, attn.v_proj.bias is None}) == 1
    return silu and no_mlp_bias and same_bias


def _concat_into_views(modules: list[torch.nn.Linear], attr: str) -> torch.Tensor:
    """Concatenate ``attr`` (weight or bias, present on every module) of ``modules`` along dim 0 and re-point each
    module's parameter at its slice of the result, so the old tensors are freed and no memory is duplicated."""
    parts: list[torch.Tensor] = [getattr(m, attr) for m in modules]
    fused = torch.cat([p.detach() for p in parts], dim=0)
    start = 0
    for module, part in zip(modules, parts):
        end = start + part.shape[0]
        getattr(module, attr).data = fused[start:end]
        start = end
    return fused


def fuse_layer_weights(layer) -> FusedLayer:
    """Fuse one layer's q/k/v and gate/up weights (in place, see the module docstring). Requires ``fusable``."""
    attn, mlp = layer.self_attn, layer.mlp
    qkv = [attn.q_proj, attn.k_proj, attn.v_proj]
    return FusedLayer(
        input_norm=layer.input_layernorm.weight,
        qkv_weight=_concat_into_views(qkv, "weight"),
        # ``fusable`` checked that q, k and v all have a bias or none has
        qkv_bias=_concat_into_views(qkv, "bias") if attn.q_proj.bias is not None else None,
        o_proj=attn.o_proj,
        post_norm=layer.post_attention_layernorm.weight,
        gate_up_weight=_concat_into_views([mlp.gate_proj, mlp.up_proj], "weight"),
        down_proj=mlp.down_proj,
        eps=float(layer.input_layernorm.variance_epsilon),
    )


def _next_pow2(n: int) -> int:
    return 1 << (n - 1).bit_length()


if triton is not None:
    import triton.language as tl

    @triton.jit
    def _add_rms_norm_kernel(
        X, Residual, ResidualOut, Weight, Out, eps, width, HAS_RESIDUAL: tl.constexpr, BLOCK: tl.constexpr
    ):
        row = tl.program_id(0)
        cols = tl.arange(0, BLOCK)
        mask = cols < width
        x = tl.load(X + row * width + cols, mask=mask, other=0.0)
        if HAS_RESIDUAL:
            r = tl.load(Residual + row * width + cols, mask=mask, other=0.0)
            # the eager `h + delta` in the model dtype: a float32 sum rounded once
            x = (x.to(tl.float32) + r.to(tl.float32)).to(ResidualOut.dtype.element_ty)
            tl.store(ResidualOut + row * width + cols, x, mask=mask)
        xf = x.to(tl.float32)
        inv = 1.0 / tl.sqrt(tl.sum(xf * xf, axis=0) / width + eps)
        normed = (xf * inv).to(Out.dtype.element_ty).to(tl.float32)  # HF: `hidden.to(input_dtype)`
        w = tl.load(Weight + cols, mask=mask, other=0.0).to(tl.float32)
        tl.store(Out + row * width + cols, (w * normed).to(Out.dtype.element_ty), mask=mask)

    @triton.jit
    def _rope_store_kernel(
        QKV,
        Cos,
        Sin,
        QOut,
        Keys,
        Values,
        Slots,
        Positions,
        Rope,
        stride_r,
        stride_ks,
        stride_kl,
        stride_kh,
        stride_vs,
        stride_vl,
        stride_vh,
        HQ: tl.constexpr,
        HKV: tl.constexpr,
        HALF: tl.constexpr,
        S0: tl.constexpr,
        S01: tl.constexpr,
    ):
        row = tl.program_id(0)
        head = tl.program_id(1)  # q heads, then k heads, then v heads: the column order of the fused GEMM
        d = tl.arange(0, HALF)
        width = (HQ + 2 * HKV) * 2 * HALF
        base = QKV + row * width + head * 2 * HALF
        lo = tl.load(base + d)
        hi = tl.load(base + HALF + d)
        pos = tl.load(Positions + row)
        slot = tl.load(Slots + row)
        if head < HQ + HKV:
            # frequency d rotates by the rope position of its TMRoPE axis (time below S0, height below S01, width)
            r_t = tl.load(Rope + row)
            r_h = tl.load(Rope + stride_r + row)
            r_w = tl.load(Rope + 2 * stride_r + row)
            rp = tl.where(d < S0, r_t, tl.where(d < S01, r_h, r_w))
            cos_lo = tl.load(Cos + rp * 2 * HALF + d).to(tl.float32)
            cos_hi = tl.load(Cos + rp * 2 * HALF + HALF + d).to(tl.float32)
            sin_lo = tl.load(Sin + rp * 2 * HALF + d).to(tl.float32)
            sin_hi = tl.load(Sin + rp * 2 * HALF + HALF + d).to(tl.float32)
            lo_f, hi_f = lo.to(tl.float32), hi.to(tl.float32)
            # eager: x * cos + rotate_half(x) * sin, each product and the sum rounded to the model dtype
            dt = lo.dtype
            out_lo = ((lo_f * cos_lo).to(dt).to(tl.float32) + (-hi_f * sin_lo).to(dt).to(tl.float32)).to(dt)
            out_hi = ((hi_f * cos_hi).to(dt).to(tl.float32) + (lo_f * sin_hi).to(dt).to(tl.float32)).to(dt)
            if head < HQ:
                dst = QOut + (row * HQ + head) * 2 * HALF
            else:
                dst = Keys + slot * stride_ks + pos * stride_kl + (head - HQ) * stride_kh
            tl.store(dst + d, out_lo)
            tl.store(dst + HALF + d, out_hi)
        else:
            dst = Values + slot * stride_vs + pos * stride_vl + (head - HQ - HKV) * stride_vh
            tl.store(dst + d, lo)
            tl.store(dst + HALF + d, hi)

    @triton.jit
    def _silu_mul_kernel(GateUp, Out, inter, BLOCK: tl.constexpr):
        row = tl.program_id(0)
        cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        mask = cols < inter
        g = tl.load(GateUp + row * 2 * inter + cols, mask=mask, other=0.0).to(tl.float32)
        u = tl.load(GateUp + row * 2 * inter + inter + cols, mask=mask, other=0.0).to(tl.float32)
        act = (g / (1.0 + tl.exp(-g))).to(Out.dtype.element_ty).to(tl.float32)  # eager: silu rounds first
        tl.store(Out + row * inter + cols, (act * u).to(Out.dtype.element_ty), mask=mask)


def _require_triton() -> None:
    if triton is None:
        raise RuntimeError("triton is not installed (CUDA builds of torch include it)")


def add_rms_norm(
    x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """``h = residual + x`` (or ``x`` without a residual), then HF's RMSNorm of ``h``; returns ``(normed, h)``.
    ``x``/``residual`` (B, H) contiguous, same dtype; ``weight`` (H,)."""
    _require_triton()
    rows, width = x.shape
    out = torch.empty_like(x)
    summed = torch.empty_like(x) if residual is not None else x
    _add_rms_norm_kernel[(rows,)](
        x,
        residual if residual is not None else x,
        summed,
        weight,
        out,
        eps,
        width,
        HAS_RESIDUAL=residual is not None,
        BLOCK=_next_pow2(width),
    )
    return out, summed


def rope_and_store(
    qkv: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    slots: torch.Tensor,
    positions: torch.Tensor,
    rope: torch.Tensor | None = None,
    *,
    heads: int,
    kv_heads: int,
    mrope_section: tuple[int, int] | None = None,
) -> torch.Tensor:
    """Split the fused projection ``qkv`` (B, (heads + 2 kv_heads) × D) into heads, rotate q and k by the rotary
    table rows ``cos``/``sin`` (rope_len, D), write k and v into the pool layer ``keys``/``values``
    (slots, max_len, kv_heads, D) at ``[slots[b], positions[b]]``; returns q (B, heads, D).

    Rotation: row b's frequency j (of D / 2) at the rope position ``rope[axis, b]`` of its TMRoPE axis — time for
    j < ``mrope_section[0]``, height below ``mrope_section[0] + mrope_section[1]``, width after (None: time for every
    j). ``rope`` (3, B) int64, rows may have stride 0 (None: ``positions`` on every axis)."""
    _require_triton()
    batch = qkv.shape[0]
    head_dim = cos.shape[-1]
    if head_dim % 2 or (head_dim // 2) & (head_dim // 2 - 1):
        raise ValueError(f"head_dim must be twice a power of two for the fused RoPE kernel, got {head_dim}")
    if rope is None:
        rope = positions.view(1, -1).expand(3, -1)
    if rope.shape != (3, batch) or rope.stride(1) != 1:
        raise ValueError(f"rope positions must be (3, {batch}) with unit row stride, got {tuple(rope.shape)}")
    s0, s1 = mrope_section if mrope_section is not None else (head_dim // 2, 0)
    q = qkv.new_empty(batch, heads, head_dim)
    _rope_store_kernel[(batch, heads + 2 * kv_heads)](
        qkv,
        cos,
        sin,
        q,
        keys,
        values,
        slots,
        positions,
        rope,
        rope.stride(0),
        keys.stride(0),
        keys.stride(1),
        keys.stride(2),
        values.stride(0),
        values.stride(1),
        values.stride(2),
        HQ=heads,
        HKV=kv_heads,
        HALF=head_dim // 2,
        S0=s0,
        S01=s0 + s1,
    )
    return q


def silu_mul(gate_up: torch.Tensor, block: int = 1024) -> torch.Tensor:
    """(B, 2I) = [gate | up] -> (B, I) = silu(gate) × up, rounded as the eager MLP rounds."""
    _require_triton()
    rows, double = gate_up.shape
    inter = double // 2
    out = gate_up.new_empty(rows, inter)
    block = min(block, _next_pow2(inter))
    _silu_mul_kernel[(rows, triton.cdiv(inter, block))](gate_up, out, inter, BLOCK=block)
    return out
