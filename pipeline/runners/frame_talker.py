"""Frame talker runner: a talker that makes one frame of several codebooks per step (see
:mod:`pipeline.models.frame_talker` for the streaming contract the family's parts follow).

Each step runs the talker's decoder for every row at once (pooled KV cache, every row at its own position), samples
codebook 0 with the stage's sampler (suppressed ids, stop ids, repetition penalty, per-response seeds), then the
family's residual predictor fills the rest of each frame on the device. Nothing here reads the device back: the
frames are returned as a device tensor the step's caller reads once.

Positions: a position's rope position is its cache index on every axis unless the call gives others: a prefill's
explicit (3, P) rope positions (a prompt with pictures), a decode row's rope shift (rope position - cache index).

Devices: the talker may be on another GPU than the thinker; its inputs are copied to its device inside each call,
which runs with that device current.
"""

from __future__ import annotations

import torch

from pipeline.kernels.cuda_graphs import host_to_device
from pipeline.kernels.devices import device_scope
from pipeline.models.frame_talker import FrameTalkerParts
from pipeline.runners.decoder import HostRope, PooledDecoder
from pipeline.runners.sampling import DeviceSampleRows, SampleRows, SamplerSpec

__all__ = ["FrameTalkerRunner"]


class FrameTalkerRunner:
    def __init__(
        self,
        parts: FrameTalkerParts,
        *,
        device: torch.device,
        dtype: torch.dtype,
        kv_slots: int,
        max_len: int,
        sampler: SamplerSpec,
        residual_sampler: SamplerSpec,
    ) -> None:
        """``sampler``: how codebook 0 is sampled (its stop ids end an utterance); ``residual_sampler``: how the
        residual predictor's codebooks are (their noise follows codebook 0's seed and counter, one draw per
        codebook)."""
        self.parts = parts
        self.groups = parts.groups
        self.device = torch.device(device)
        self.dtype = dtype
        self.decoder = PooledDecoder(parts.body, slots=kv_slots, max_len=max_len, dtype=dtype, device=self.device)
        self.pool = self.decoder.pool
        self.sampler = sampler.build(vocab=parts.head.out_features, rows=self.pool.scratch_slot + 1, device=self.device)
        self.residual_sampler = residual_sampler.build(
            vocab=parts.residual_vocab, rows=self.pool.scratch_slot + 1, device=self.device
        )

    can_chain = False
    """Chains of steps fed on the device are not offered: every step needs the residual predictor's frame."""

    def capture(self) -> None:
        """Nothing to capture: the frame talker runs eagerly."""

    @torch.inference_mode()
    def prefill_prompt(
        self, inputs: torch.Tensor, *, slot: int, start: int, rope: HostRope | None = None
    ) -> torch.Tensor:
        """Talker inputs (P, Ht) at cache indices ``start .. start+P-1`` of ``slot``, at rope positions ``rope``
        ((3, P) int64 on the host, a numpy array or tensor; None: the cache indices); returns the last position's
        hidden state (Ht,)."""
        self.decoder.check_host_rope(rope, inputs.shape[0])
        with device_scope(self.device):
            positions = None if rope is None else torch.as_tensor(rope).to(self.device, torch.long)
            hidden = self.decoder.prefill(slot, inputs.to(self.device, self.dtype), start, positions)
            return hidden[-1]

    @torch.inference_mode()
    def start(
        self, inputs: torch.Tensor, *, slot: int, start: int, sample: SampleRows, rope: HostRope | None = None
    ) -> torch.Tensor:
        """A reply's prefill (the prompt positions past ``start``, then its opening: talker inputs (P, Ht), at rope
        positions ``rope`` as for :meth:`prefill_prompt`) and its first frame, (groups,) int64 on the device."""
        hidden = self.prefill_prompt(inputs, slot=slot, start=start, rope=rope)
        return self._frames(hidden.unsqueeze(0), sample)[0]

    @torch.inference_mode()
    def decode(
        self,
        frames: torch.Tensor,
        text: torch.Tensor,
        slots: list[int],
        positions: list[int],
        sample: SampleRows,
        rope_shifts: list[int] | None = None,
    ) -> torch.Tensor:
        """One step per row: the previous frames (B, groups) int64 and the next text vectors (B, H), row b at cache
        index ``positions[b]`` of ``slots[b]`` and rope position ``positions[b] + rope_shifts[b]`` on every axis
        (None: shifts 0). Returns the new frames (B, groups) int64 on the device (codebook 0 a stop id: the utterance
        ended; the rest of that frame means nothing)."""
        rope = None
        if rope_shifts is not None and any(rope_shifts):
            at = [p + d for p, d in zip(positions, rope_shifts, strict=True)]
            if any(not 0 <= p < self.decoder.rope_len for p in at):
                raise ValueError(f"rope positions must lie in [0, {self.decoder.rope_len})")
            rope = [at, at, at]
        with device_scope(self.device):
            x = self.parts.step_inputs(frames.to(self.device), text.to(self.device, self.dtype))
            slot_ids = host_to_device(slots, torch.long, self.device)
            index = host_to_device(positions, torch.long, self.device)
            device_rope = None if rope is None else host_to_device(rope, torch.long, self.device)
            hidden = self.decoder.decode(x.to(self.dtype), slot_ids, index, device_rope, graph_safe=False)
            return self._frames(hidden, sample)

    def _frames(self, hidden: torch.Tensor, sample: SampleRows) -> torch.Tensor:
        """Codebook 0 sampled from ``hidden``'s logits, then the residual codebooks; (B, groups) on the device."""
        rows = sample.on(self.device)
        logits = self.parts.head(hidden).float()
        codes = self.sampler.sample_device(logits, rows)
        neutral = torch.full_like(rows.rows, self.pool.scratch_slot)  # no repetition state for residual codebooks

        def pick(residual_logits: torch.Tensor, k: int) -> torch.Tensor:
            # distinct noise per codebook: counter * groups + k never repeats across frames or codebooks
            counters = rows.counters * self.groups + k
            residual_rows = DeviceSampleRows(neutral, torch.zeros_like(rows.force_continue), rows.seeds, counters)
            return self.residual_sampler.sample_device(residual_logits, residual_rows)

        rest = self.parts.residual(hidden, codes, pick)
        return torch.cat([codes.view(-1, 1), rest.to(codes.device, torch.long)], dim=1)
