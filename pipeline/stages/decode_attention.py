"""Attention of one new query per batch row over that row's slot of a :class:`~.kv_pool.KVPool` layer.

Rows have different slots and different lengths (each conversation is at its own position), which is what
HF's ``StaticCache`` cannot express (one cache position per batch). Two implementations with one contract:

- :func:`attend_reference`: a loop of ``scaled_dot_product_attention`` calls, one per row. Any device, exact,
  but it reads the lengths on the host (a device sync), so it cannot be captured in a CUDA graph.
- :func:`attend_triton`: one Triton kernel, every row and head in parallel, the lengths read on the device; it
  is what the captured decode graphs run. Each program reads only its row's ``length`` positions.

Contract: ``q`` (B, Hq, D); ``keys``/``values`` (slots, max_len, Hkv, D) with Hq a multiple of Hkv (grouped
query attention: q head h reads kv head h // (Hq / Hkv)); ``slots`` and ``lengths`` (B,) int64, the row
attends to positions ``[0, length)`` of its slot (the new token's key already written at ``length - 1``).
Returns (B, Hq, D) in ``q``'s dtype.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

__all__ = ["attend_reference", "attend_triton", "triton_available"]


def attend_reference(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, slots: torch.Tensor,
                     lengths: torch.Tensor, scale: float) -> torch.Tensor:  # fmt: skip
    out = torch.empty_like(q)
    for row, (slot, length) in enumerate(zip(slots.tolist(), lengths.tolist())):
        k = keys[slot, :length].transpose(0, 1).unsqueeze(0)  # (1, Hkv, L, D)
        v = values[slot, :length].transpose(0, 1).unsqueeze(0)
        att = F.scaled_dot_product_attention(q[row].unsqueeze(0).unsqueeze(2), k, v, scale=scale,
                                             enable_gqa=k.shape[1] != q.shape[1])  # fmt: skip
        out[row] = att[0, :, 0]
    return out


try:  # Triton ships with CUDA builds of torch; CPU-only installs use the reference path
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - depends on the install
    triton = None


def triton_available(device: torch.device) -> bool:
    return triton is not None and torch.device(device).type == "cuda"


if triton is not None:

    @triton.jit
    def _decode_attention_kernel(
        Q, K, V, Out, Slots, Lengths, scale,
        stride_qb, stride_qh, stride_ks, stride_kl, stride_kh, stride_vs, stride_vl, stride_vh,
        stride_ob, stride_oh,
        GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr,
    ):  # fmt: skip
        row = tl.program_id(0)
        head = tl.program_id(1)
        kv_head = head // GROUP
        slot = tl.load(Slots + row)
        length = tl.load(Lengths + row)
        d = tl.arange(0, HEAD_DIM)
        q = tl.load(Q + row * stride_qb + head * stride_qh + d).to(tl.float32) * scale
        k_base = K + slot * stride_ks + kv_head * stride_kh
        v_base = V + slot * stride_vs + kv_head * stride_vh
        m = tl.full((), float("-inf"), tl.float32)
        total = tl.full((), 0.0, tl.float32)
        acc = tl.zeros((HEAD_DIM,), tl.float32)
        for start in range(0, length, BLOCK_N):
            n = start + tl.arange(0, BLOCK_N)
            valid = n < length
            k = tl.load(k_base + n[:, None] * stride_kl + d[None, :], mask=valid[:, None], other=0.0)
            s = tl.sum(k.to(tl.float32) * q[None, :], axis=1)
            s = tl.where(valid, s, float("-inf"))
            m_new = tl.maximum(m, tl.max(s, axis=0))
            p = tl.exp(s - m_new)
            alpha = tl.exp(m - m_new)
            v = tl.load(v_base + n[:, None] * stride_vl + d[None, :], mask=valid[:, None], other=0.0)
            acc = acc * alpha + tl.sum(p[:, None] * v.to(tl.float32), axis=0)
            total = total * alpha + tl.sum(p, axis=0)
            m = m_new
        tl.store(Out + row * stride_ob + head * stride_oh + d, (acc / total).to(Out.dtype.element_ty))


def attend_triton(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, slots: torch.Tensor,
                  lengths: torch.Tensor, scale: float, block_n: int = 64) -> torch.Tensor:  # fmt: skip
    if triton is None:
        raise RuntimeError("triton is not installed")
    batch, heads, head_dim = q.shape
    if head_dim & (head_dim - 1):
        raise ValueError(f"head_dim must be a power of two for the Triton kernel, got {head_dim}")
    group = heads // keys.shape[2]
    out = torch.empty_like(q)
    _decode_attention_kernel[(batch, heads)](
        q, keys, values, out, slots, lengths, scale,
        q.stride(0), q.stride(1), keys.stride(0), keys.stride(1), keys.stride(2),
        values.stride(0), values.stride(1), values.stride(2), out.stride(0), out.stride(1),
        GROUP=group, HEAD_DIM=head_dim, BLOCK_N=block_n,
    )  # fmt: skip
    return out
