"""Counter-based uniform noise for sampling: a pure function of (row seed, row counter, column, salt).

Why not torch's RNG: a CUDA graph replays a draw without generator state, and a response's draws must not depend on
which other rows share its batch. A hash of the row's own seed and counter gives both.

Two implementations with one contract, equal bit for bit:

- :func:`uniform_noise_reference`: torch integer ops, any device. ~90 small kernels: fine eagerly, costly inside a
  decode graph, whose launch time grows by ~3 us per kernel.
- :func:`uniform_noise_triton`: one Triton kernel (CUDA with Triton only), what the decode graphs run.

Contract: ``seeds`` and ``counters`` (B,) int64 (taken modulo 2**32), ``width`` columns, ``salt`` an int; returns
(B, width) float32 in the open interval (0, 1), uniform on a grid of 2**24 values. The hash is 32-bit "lowbias32"
(xor-shift / multiply rounds): row = mix(mix(seed) + mix(counter + salt * 0x9E3779B9)), then
value = mix(row ^ mix(column + 0x632BE5AB)), all modulo 2**32; the top 24 bits, centred in their interval.
"""

from __future__ import annotations

import torch

from pipeline.kernels.decode_attention import triton_available

try:
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - CPU installs without triton
    triton = None

__all__ = ["uniform_noise", "uniform_noise_reference", "uniform_noise_triton"]

_MASK32 = 0xFFFFFFFF
_GOLDEN = 0x9E3779B9
_COLUMN_KEY = 0x632BE5AB
_MUL1, _MUL2 = 0x7FEB352D, 0x846CA68B


def _mul32(x: torch.Tensor, m: int) -> torch.Tensor:
    """``x * m mod 2**32`` for int64 ``x`` in [0, 2**32): split in 16-bit halves so no product overflows int64."""
    lo, hi = x & 0xFFFF, x >> 16
    return (lo * m + (((hi * m) & 0xFFFF) << 16)) & _MASK32


def _mix32(x: torch.Tensor) -> torch.Tensor:
    x = x ^ (x >> 16)
    x = _mul32(x, _MUL1)
    x = x ^ (x >> 15)
    x = _mul32(x, _MUL2)
    return x ^ (x >> 16)


def uniform_noise_reference(seeds: torch.Tensor, counters: torch.Tensor, width: int, salt: int = 0) -> torch.Tensor:
    row = _mix32((_mix32(seeds & _MASK32) + _mix32((counters + salt * _GOLDEN) & _MASK32)) & _MASK32)
    cols = torch.arange(width, device=seeds.device, dtype=torch.int64)
    bits = _mix32((row[:, None] ^ _mix32(cols + _COLUMN_KEY)[None, :]) & _MASK32)
    return ((bits >> 8).to(torch.float32) + 0.5) * (1.0 / (1 << 24))


if triton is not None:

    @triton.jit
    def _mix32_triton(x):
        # int64 holding 32-bit values; a product may wrap past 2**63, its low 32 bits (all that is kept) stay exact
        x = x ^ (x >> 16)
        x = (x * 0x7FEB352D) & 0xFFFFFFFF
        x = x ^ (x >> 15)
        x = (x * 0x846CA68B) & 0xFFFFFFFF
        return x ^ (x >> 16)

    @triton.jit
    def _uniform_noise_kernel(Seeds, Counters, Out, width, salt_term, BLOCK: tl.constexpr):
        row = tl.program_id(0)
        seed = tl.load(Seeds + row) & 0xFFFFFFFF
        counter = (tl.load(Counters + row) + salt_term) & 0xFFFFFFFF
        h = _mix32_triton((_mix32_triton(seed) + _mix32_triton(counter)) & 0xFFFFFFFF)
        cols = tl.arange(0, BLOCK).to(tl.int64)
        bits = _mix32_triton(h ^ _mix32_triton(cols + 0x632BE5AB))
        value = ((bits >> 8).to(tl.float32) + 0.5) * (1.0 / 16777216.0)
        tl.store(Out + row * width + cols, value, mask=cols < width)


def uniform_noise_triton(seeds: torch.Tensor, counters: torch.Tensor, width: int, salt: int = 0) -> torch.Tensor:
    if triton is None:
        raise RuntimeError("triton is not installed")
    out = torch.empty(seeds.shape[0], width, dtype=torch.float32, device=seeds.device)
    block = triton.next_power_of_2(width)
    _uniform_noise_kernel[(seeds.shape[0],)](seeds, counters, out, width, (salt * _GOLDEN) & _MASK32, BLOCK=block)
    return out


def uniform_noise(seeds: torch.Tensor, counters: torch.Tensor, width: int, salt: int = 0) -> torch.Tensor:
    """The Triton kernel where it runs (CUDA with Triton), else the reference (see the module docstring)."""
    if triton_available(seeds.device) and width <= 1 << 17:
        return uniform_noise_triton(seeds, counters, width, salt)
    return uniform_noise_reference(seeds, counters, width, salt)
