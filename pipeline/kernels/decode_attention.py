"""Attention of one new query per batch row over that row's slot of a :class:`~.kv_pool.KVPool` layer.

Rows have different slots and different lengths (each conversation is at its own position), which is what
HF's ``StaticCache`` cannot express (one cache position per batch). Two implementations with one contract:

- :func:`attend_reference`: a loop of ``scaled_dot_product_attention`` calls, one per row. Any device, exact,
  but it reads the lengths on the host (a device sync), so it cannot be captured in a CUDA graph.
- :func:`attend_triton`: Triton, every row and head in parallel, the lengths read on the device; it is what the
  captured decode graphs run. Each program reads only its row's ``length`` positions; with few rows, several
  programs share a row's positions and a second kernel combines their partial softmax sums (flash-decoding).

Contract: ``q`` (B, Hq, D); ``keys``/``values`` (slots, max_len, Hkv, D) with Hq a multiple of Hkv (grouped
query attention: q head h reads kv head h // (Hq / Hkv)); ``slots`` and ``lengths`` (B,) int64, the row
attends to positions ``[0, length)`` of its slot (the new token's key already written at ``length - 1``).
Returns (B, Hq, D) in ``q``'s dtype.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

__all__ = ["attend_reference", "attend_triton", "attention_splits", "triton_available"]


def attend_reference(
    q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, slots: torch.Tensor, lengths: torch.Tensor, scale: float
) -> torch.Tensor:
    out = torch.empty_like(q)
    for row, (slot, length) in enumerate(zip(slots.tolist(), lengths.tolist())):
        k = keys[slot, :length].transpose(0, 1).unsqueeze(0)  # (1, Hkv, L, D)
        v = values[slot, :length].transpose(0, 1).unsqueeze(0)
        att = F.scaled_dot_product_attention(
            q[row].unsqueeze(0).unsqueeze(2), k, v, scale=scale, enable_gqa=k.shape[1] != q.shape[1]
        )
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
        Q,
        K,
        V,
        Out,
        PartM,
        PartL,
        PartAcc,
        Slots,
        Lengths,
        scale,
        stride_qb,
        stride_qh,
        stride_ks,
        stride_kl,
        stride_kh,
        stride_vs,
        stride_vl,
        stride_vh,
        stride_ob,
        stride_oh,
        GROUP: tl.constexpr,
        HEAD_DIM: tl.constexpr,
        BLOCK_N: tl.constexpr,
        SPLITS: tl.constexpr,
    ):
        # One program per (row, head, share of the row's positions). SPLITS == 1: the share is the whole row and the
        # program writes the output; otherwise the shares are whole blocks (a short row leaves its last shares empty,
        # which store a zero weight) and the program writes its partial softmax sums for _combine_kernel.
        row = tl.program_id(0)
        head = tl.program_id(1)
        split = tl.program_id(2)
        kv_head = head // GROUP
        slot = tl.load(Slots + row)
        length = tl.load(Lengths + row)
        if SPLITS == 1:  # bounds the compiler sees whole: this loop ran ~30 % slower written as a share
            begin = 0
            end = length
        else:
            share = tl.cdiv(tl.cdiv(length, SPLITS), BLOCK_N) * BLOCK_N
            begin = split * share
            end = tl.minimum(begin + share, length)
        d = tl.arange(0, HEAD_DIM)
        q = tl.load(Q + row * stride_qb + head * stride_qh + d).to(tl.float32) * scale
        k_base = K + slot * stride_ks + kv_head * stride_kh
        v_base = V + slot * stride_vs + kv_head * stride_vh
        m = tl.full((), float("-inf"), tl.float32)
        total = tl.full((), 0.0, tl.float32)
        acc = tl.zeros((HEAD_DIM,), tl.float32)
        for start in range(begin, end, BLOCK_N):
            n = start + tl.arange(0, BLOCK_N)
            valid = n < end
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
        if SPLITS == 1:
            tl.store(Out + row * stride_ob + head * stride_oh + d, (acc / total).to(Out.dtype.element_ty))
        else:
            at = (row * tl.num_programs(1) + head) * SPLITS + split
            tl.store(PartM + at, m)
            tl.store(PartL + at, total)
            tl.store(PartAcc + at * HEAD_DIM + d, acc)

    @triton.jit
    def _combine_kernel(PartM, PartL, PartAcc, Out, stride_ob, stride_oh, HEAD_DIM: tl.constexpr, SPLITS: tl.constexpr):
        row = tl.program_id(0)
        head = tl.program_id(1)
        heads = tl.num_programs(1)
        base = (row * heads + head) * SPLITS
        s = tl.arange(0, SPLITS)
        d = tl.arange(0, HEAD_DIM)
        m = tl.load(PartM + base + s)
        top = tl.max(m, axis=0)  # the first share always holds position 0, so top is finite
        weight = tl.where(m == float("-inf"), 0.0, tl.exp(m - top))
        total = tl.sum(weight * tl.load(PartL + base + s), axis=0)
        acc = tl.sum(weight[:, None] * tl.load(PartAcc + (base + s)[:, None] * HEAD_DIM + d[None, :]), axis=0)
        tl.store(Out + row * stride_ob + head * stride_oh + d, (acc / total).to(Out.dtype.element_ty))


def attention_splits(rows: int, heads: int, device: torch.device, max_splits: int = 16) -> int:
    """How many programs share each (row, head)'s positions: the most (a power of two up to ``max_splits``) that keeps
    the programs within about two per SM. Why: one program per (row, head) walks all of a row's positions alone, so at
    batch 1 the talker's 14 heads ran on 14 of the H100's 132 SMs (13 µs a layer for ~300 positions); large
    batches have enough programs without splitting."""
    device = torch.device(device)
    sms = torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else 132
    splits = 1
    while splits < max_splits and rows * heads * splits * 2 <= 2 * sms:
        splits *= 2
    return splits


def attend_triton(
    q: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    slots: torch.Tensor,
    lengths: torch.Tensor,
    scale: float,
    block_n: int = 64,
    splits: int | None = None,
) -> torch.Tensor:
    """``splits``: programs per (row, head), each over a share of the row's positions, their partial softmax sums
    combined by a second kernel (default: :func:`attention_splits`); with 1 each program writes its output. Shares are
    whole blocks of ``block_n`` positions, so a row shorter than ``splits`` blocks leaves shares empty."""
    if triton is None:
        raise RuntimeError("triton is not installed")
    batch, heads, head_dim = q.shape
    if head_dim & (head_dim - 1):
        raise ValueError(f"head_dim must be a power of two for the Triton kernel, got {head_dim}")
    group = heads // keys.shape[2]
    out = torch.empty_like(q)
    if splits is None:
        splits = attention_splits(batch, heads, q.device)
    strides = (
        q.stride(0),
        q.stride(1),
        keys.stride(0),
        keys.stride(1),
        keys.stride(2),
        values.stride(0),
        values.stride(1),
        values.stride(2),
        out.stride(0),
        out.stride(1),
    )
    if splits & (splits - 1):
        raise ValueError(f"splits must be a power of two, got {splits}")
    if splits == 1:  # the output straight from the one program per (row, head); no partial sums
        part_m = part_l = part_acc = out
    else:
        part_m = torch.empty(batch, heads, splits, dtype=torch.float32, device=q.device)
        part_l = torch.empty_like(part_m)
        part_acc = torch.empty(batch, heads, splits, head_dim, dtype=torch.float32, device=q.device)
    _decode_attention_kernel[(batch, heads, splits)](
        q,
        keys,
        values,
        out,
        part_m,
        part_l,
        part_acc,
        slots,
        lengths,
        scale,
        *strides,
        GROUP=group,
        HEAD_DIM=head_dim,
        BLOCK_N=block_n,
        SPLITS=splits,
    )
    if splits > 1:
        _combine_kernel[(batch, heads)](
            part_m, part_l, part_acc, out, out.stride(0), out.stride(1), HEAD_DIM=head_dim, SPLITS=splits
        )
    return out
