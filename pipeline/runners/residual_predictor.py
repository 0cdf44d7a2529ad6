"""A frame talker's residual predictor (:class:`~pipeline.models.frame_talker.ResidualPredictor`, Qwen3-Omni's code
predictor) run over a KV pool of its own, with fixed shapes: a whole frame's residual codebooks are device work a CUDA
graph captures.

Each call predicts one frame per row, from scratch: row b writes its positions ``0 .. opening_len + groups - 3`` in
predictor slot ``slots[b]`` before it reads them, so nothing is kept between calls and a slot needs no reset. The
opening's positions run as one decode call of ``opening_len x B`` rows (the pooled decoder writes every row's key and
value before any row attends, so a row sees the earlier positions of its slot written by the same call, as in
:func:`~pipeline.runners.decode_graphs.graphed_prefill`), then one decode call of B rows per further codebook.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from pipeline.models.frame_talker import ResidualPredictor
from pipeline.runners.decoder import PooledDecoder

__all__ = ["PooledResidualPredictor", "ResidualSample"]

ResidualSample = Callable[[torch.Tensor, int], torch.Tensor]
"""``sample(logits (B, V) float32, step) -> (B,) int64``: the codes of residual codebook ``step + 1`` (step 0 ..
groups - 2), device work without host synchronisation."""


class PooledResidualPredictor:
    def __init__(
        self, parts: ResidualPredictor, *, groups: int, rows: int, dtype: torch.dtype, device: torch.device
    ) -> None:
        """``groups``: codes per frame (codebook 0 included); ``rows``: the most rows a call may have (slots
        ``0 .. rows - 1``, plus :attr:`scratch_slot`)."""
        if groups < 2:
            raise ValueError(f"a frame with residual codebooks has at least 2 groups, got {groups}")
        self.parts = parts
        self.groups = groups
        self.device = torch.device(device)
        self.dtype = dtype
        self.decoder = PooledDecoder(
            parts.body, slots=rows, max_len=parts.opening_len + groups - 2, dtype=dtype, device=self.device
        )
        self.rows = rows
        self.scratch_slot = self.decoder.pool.scratch_slot
        """A slot no batch row uses: for a single frame made beside batched ones (a reply's first frame)."""

    def predict(
        self,
        hidden: torch.Tensor,
        code0: torch.Tensor,
        sample: ResidualSample,
        *,
        slots: torch.Tensor,
        graph_safe: bool,
    ) -> torch.Tensor:
        """Codebooks 1 .. groups - 1 of each row's frame, (B, groups - 1) int64, from the talker's hidden states
        ``hidden`` (B, Ht) and codebook 0 ``code0`` (B,), row b in predictor slot ``slots[b]`` ((B,) int64 on the
        device, distinct). ``graph_safe``: the attention reads lengths on the device (Triton) and the call has no host
        synchronisation, so a CUDA graph can capture it; without it the reference attention reads them on the host."""
        b = hidden.shape[0]
        opening = self.parts.opening(hidden, code0).to(self.dtype)  # (B, S, H)
        s = opening.shape[1]
        if s != self.parts.opening_len:
            raise ValueError(f"the predictor's opening has {s} positions, not its opening_len {self.parts.opening_len}")
        # position-major rows: the last B rows are the opening's last position
        x = opening.transpose(0, 1).reshape(s * b, -1)
        positions = torch.arange(s, device=self.device).repeat_interleave(b)
        h = self.decoder.decode(x, slots.repeat(s), positions, graph_safe=graph_safe)[-b:]
        codes = [sample(self.parts.logits(h, 1).float(), 0)]
        for k in range(1, self.groups - 1):
            at = torch.full((b,), s + k - 1, dtype=torch.long, device=self.device)
            h = self.decoder.decode(self.parts.embed(codes[-1], k).to(self.dtype), slots, at, graph_safe=graph_safe)
            codes.append(sample(self.parts.logits(h, k + 1).float(), k))
        return torch.stack(codes, dim=1)
