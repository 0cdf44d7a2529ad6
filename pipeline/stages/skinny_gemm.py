"""``x @ weight.T + bias`` for a few rows (a decode step's batch) as one Triton kernel with many programs.

Why: at batch 1 cuBLAS picks tiles so wide that the talker's largest products run on a third of the H100's SMs. Its
gate|up product (896 -> 9728, 17 MB of weights) took 25 µs, 0.7 TB/s, and its down product (4864 -> 896) 14 µs plus
a split-K reduction: together more than half of the talker's kernel time (BENCHMARKS.md §14). A decode step's
products read every weight once and do little arithmetic per byte, so they are fast when enough programs read at
once: here every program owns ``block_n`` output columns (and, with ``split_k`` > 1, a share of the inner dimension,
summed by a second kernel in a fixed order, so results do not depend on timing), and rows are padded to 16 for
``tl.dot``.

:func:`skinny_linear` takes a :class:`GemmConfig`; which config (or cuBLAS) is fastest depends on the shape and the
GPU, so :class:`LinearPlanner` times the candidates once per shape on the device and remembers the winner.

Arithmetic: bfloat16/float16 products exactly, sums in float32, the bias added in float32, one rounding to the
output dtype, as cuBLAS computes them but for the order of the float32 sums; float32 inputs are multiplied in full
float32 (no TF32). The kernels run on CPU tensors under ``TRITON_INTERPRET=1`` (how the tests check them).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from pipeline.stages.decode_attention import triton

__all__ = ["CANDIDATES", "MAX_ROWS", "GemmConfig", "LinearPlanner", "skinny_linear"]

log = logging.getLogger(__name__)

MAX_ROWS = 16
"""The most rows :func:`skinny_linear` takes (one ``tl.dot`` tile of rows); larger batches are cuBLAS's."""

BLOCK_M = 16  # tl.dot's smallest tile


@dataclass(frozen=True)
class GemmConfig:
    """One way to run :func:`skinny_linear`: output columns per program, inner-dimension step, how many programs
    share the inner dimension (``split_k``), Triton's warps and pipeline stages."""

    block_n: int = 32
    block_k: int = 128
    split_k: int = 1
    warps: int = 4
    stages: int = 3


CANDIDATES: tuple[GemmConfig, ...] = tuple(
    GemmConfig(block_n=n, block_k=k, split_k=s, warps=4, stages=st)
    for n in (16, 32, 64) for k in (128, 256) for s in (1, 2, 4, 8) for st in (3, 4)
)
"""What :class:`LinearPlanner` tries beside cuBLAS."""


if triton is not None:
    import triton.language as tl

    @triton.jit
    def _skinny_kernel(X, W, Bias, Out, Partial, M, N, K, stride_xm, stride_wn, stride_om,
                       HAS_BIAS: tl.constexpr, SPLIT_K: tl.constexpr, IEEE: tl.constexpr, BLOCK_M: tl.constexpr,
                       BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):  # fmt: skip
        pid_n = tl.program_id(0)
        pid_k = tl.program_id(1)
        rm = tl.arange(0, BLOCK_M)
        rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        k_share = tl.cdiv(tl.cdiv(K, SPLIT_K), BLOCK_K) * BLOCK_K
        k_start = pid_k * k_share
        k_end = tl.minimum(k_start + k_share, K)
        acc = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
        for k0 in range(k_start, k_end, BLOCK_K):
            rk = k0 + tl.arange(0, BLOCK_K)
            x = tl.load(X + rm[:, None] * stride_xm + rk[None, :], mask=(rm[:, None] < M) & (rk[None, :] < k_end),
                        other=0.0)  # fmt: skip
            w = tl.load(W + rn[:, None] * stride_wn + rk[None, :], mask=(rn[:, None] < N) & (rk[None, :] < k_end),
                        other=0.0)  # fmt: skip
            if IEEE:
                acc = tl.dot(x, tl.trans(w), acc, input_precision="ieee")
            else:
                acc = tl.dot(x, tl.trans(w), acc)
        out_mask = (rm[:, None] < M) & (rn[None, :] < N)
        if SPLIT_K == 1:
            if HAS_BIAS:
                acc += tl.load(Bias + rn, mask=rn < N, other=0.0).to(tl.float32)[None, :]
            tl.store(Out + rm[:, None] * stride_om + rn[None, :], acc.to(Out.dtype.element_ty), mask=out_mask)
        else:
            tl.store(Partial + pid_k * M * N + rm[:, None] * N + rn[None, :], acc, mask=out_mask)

    @triton.jit
    def _split_sum_kernel(Partial, Bias, Out, M, N, stride_om, HAS_BIAS: tl.constexpr, SPLIT_K: tl.constexpr,
                          BLOCK: tl.constexpr):  # fmt: skip
        row = tl.program_id(0)
        cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        mask = cols < N
        acc = tl.zeros((BLOCK,), tl.float32)
        for s in range(SPLIT_K):  # a fixed order: the same sum whatever the programs' timing
            acc += tl.load(Partial + s * M * N + row * N + cols, mask=mask, other=0.0)
        if HAS_BIAS:
            acc += tl.load(Bias + cols, mask=mask, other=0.0).to(tl.float32)
        tl.store(Out + row * stride_om + cols, acc.to(Out.dtype.element_ty), mask=mask)


def skinny_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, cfg: GemmConfig) -> torch.Tensor:
    """``F.linear(x, weight, bias)`` for ``x`` (M <= :data:`MAX_ROWS`, K) with unit stride in K, ``weight`` (N, K)
    contiguous; returns (M, N) in ``x``'s dtype."""
    if triton is None:
        raise RuntimeError("triton is not installed (CUDA builds of torch include it)")
    rows, inner = x.shape
    if rows > MAX_ROWS:
        raise ValueError(f"skinny_linear takes at most {MAX_ROWS} rows, got {rows}")
    if x.stride(1) != 1 or not weight.is_contiguous():
        raise ValueError("skinny_linear needs x with unit stride in K and a contiguous weight")
    cols = weight.shape[0]
    out = x.new_empty(rows, cols)
    split = min(cfg.split_k, triton.cdiv(inner, cfg.block_k))
    partial = out if split == 1 else torch.empty(split, rows, cols, dtype=torch.float32, device=x.device)
    has_bias = bias is not None
    _skinny_kernel[(triton.cdiv(cols, cfg.block_n), split)](
        x, weight, bias if has_bias else weight, out, partial, rows, cols, inner, x.stride(0), weight.stride(0),
        out.stride(0), HAS_BIAS=has_bias, SPLIT_K=split, IEEE=x.dtype == torch.float32, BLOCK_M=BLOCK_M,
        BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, num_warps=cfg.warps, num_stages=cfg.stages,
    )  # fmt: skip
    if split > 1:
        block = 256
        _split_sum_kernel[(rows, triton.cdiv(cols, block))](
            partial, bias if has_bias else partial, out, rows, cols, out.stride(0), HAS_BIAS=has_bias, SPLIT_K=split,
            BLOCK=block,
        )  # fmt: skip
    return out


PlanKey = tuple[int, int, int, bool, torch.dtype, torch.device]


class LinearPlanner:
    """Picks, per shape, the fastest of cuBLAS and the :data:`CANDIDATES`, timed on the device, and runs it.

    ``linear(x, weight, bias)`` is ``F.linear``'s contract. Rows beyond :data:`MAX_ROWS`, CPU tensors, or a planner
    that is off (``enabled=False``) go straight to ``F.linear``. Inside :meth:`planning` (the runners' graph capture
    at start), a shape's first call outside a CUDA graph capture times every candidate (each in a graph of ``calls``
    launches, so launch gaps do not count; a few ms per candidate) and keeps the winner. Decode steps run eagerly
    before their graphs are captured (:class:`~pipeline.cuda_graphs.CapturedCall`'s warm-up), so every captured shape
    is timed; a shape first seen later (an eager step) runs cuBLAS, so serving never stalls on a timing. Not
    thread-safe: one planner per stage, used on its engine thread.
    """

    def __init__(self, *, enabled: bool = True, candidates: Sequence[GemmConfig] = CANDIDATES, calls: int = 20,
                 repeats: int = 3) -> None:  # fmt: skip
        self.enabled = enabled and triton is not None
        self.candidates = tuple(candidates)
        self.calls, self.repeats = calls, repeats
        self.plans: dict[PlanKey, GemmConfig | None] = {}
        """shape -> the chosen config, None for cuBLAS."""
        self.timings: dict[PlanKey, dict[str, float]] = {}
        """shape -> µs per call of each candidate ("cublas" and repr of each config), for reports."""
        self._planning = False

    @contextmanager
    def planning(self):
        """Shapes first seen inside this block are timed and planned (see the class docstring)."""
        self._planning = True
        try:
            yield self
        finally:
            self._planning = False

    def linear(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        if not self.enabled or x.device.type != "cuda" or x.dim() != 2 or x.shape[0] > MAX_ROWS:
            return F.linear(x, weight, bias)
        key = (x.shape[0], weight.shape[0], weight.shape[1], bias is not None, x.dtype, x.device)
        if key not in self.plans:
            if not self._planning or torch.cuda.is_current_stream_capturing():
                return F.linear(x, weight, bias)
            self.plans[key] = self._plan(key, x, weight, bias)
        cfg = self.plans[key]
        if cfg is None:
            return F.linear(x, weight, bias)
        return skinny_linear(x if x.stride(1) == 1 else x.contiguous(), weight, bias, cfg)

    def _plan(self, key: PlanKey, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> GemmConfig | None:
        if not weight.is_contiguous():
            return None
        probe = torch.randn(x.shape, dtype=x.dtype, device=x.device)
        timed: dict[str, float] = {"cublas": self._time(lambda: F.linear(probe, weight, bias))}
        best, best_us = None, timed["cublas"]
        for cfg in self.candidates:
            try:
                us = self._time(lambda: skinny_linear(probe, weight, bias, cfg))
            except Exception as exc:  # noqa: BLE001 - a config this GPU cannot run (e.g. shared memory) is skipped
                log.info("skinny_linear %s skipped for rows/out/in %s: %s", cfg, key[:3], exc)
                timed[repr(cfg)] = float("inf")
                continue
            timed[repr(cfg)] = us
            if us < best_us:
                best, best_us = cfg, us
        self.timings[key] = timed
        return best

    def _time(self, fn) -> float:
        """µs per call of ``fn``, from a CUDA graph of ``calls`` calls, best of ``repeats`` replays."""
        stream = torch.cuda.Stream(device=torch.cuda.current_device())
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            fn()  # compile and warm up outside the capture
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, stream=stream, capture_error_mode="thread_local"):
                for _ in range(self.calls):
                    fn()
            best = float("inf")
            for _ in range(self.repeats):
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record(stream)
                graph.replay()
                end.record(stream)
                end.synchronize()
                best = min(best, start.elapsed_time(end) * 1000 / self.calls)
        torch.cuda.current_stream().wait_stream(stream)
        return best
