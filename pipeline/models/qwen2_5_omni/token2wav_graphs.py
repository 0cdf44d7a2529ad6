"""CUDA-graph capture for token2wav's GPU path, and the static shapes that make capture pay off.

On a GPU the streaming DiT is launch-bound: one chunk is 36 velocity evaluations (RK4 with 10 time points, CFG
batched) of ~700 small kernels each, and the eager cost barely depends on the window size. Recording the whole ODE
solve once per shape in a CUDA graph and replaying it removes the launches. A graph replays fixed shapes from fixed
buffers, so this module provides:

- :class:`CapturedCall` (from :mod:`pipeline.kernels.cuda_graphs`, shared with the decode steps): one function of
  tensors
  recorded in one ``torch.cuda.CUDAGraph`` over static input buffers (warm-up on a side stream first, as capture
  requires), replayed with fresh input values.
- :func:`pack_windows`: the DiT windows of one or more streams (different lengths, different absolute positions)
  padded and stacked into one static shape ``(slots, frames)``. Padding frames get an attention block of their
  own, far from every real block, so no real frame attends to them and they attend only to each other (a fully
  masked row would turn into NaN and leak through the value products): the real frames compute what an unpadded
  window computes, up to float rounding. Unused slots are all padding.
- :func:`bucket_at_least` and :func:`slot_bucket`: the few shapes worth capturing.

Nothing here knows the model; :mod:`.token2wav_stream` supplies the functions and decides what to capture.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from pipeline.kernels.cuda_graphs import (  # re-exported: part of this API
    CapturedCall,
    GraphCaptureError,
    bucket_at_least,
    bucket_holding,
)

__all__ = [
    "PAD_BLOCK",
    "CapturedCall",
    "GraphCaptureError",
    "PackedWindows",
    "WindowJob",
    "bucket_at_least",
    "bucket_holding",
    "pack_windows",
    "slot_bucket",
    "slot_sizes",
]

PAD_BLOCK = -(1 << 30)
"""Attention block id of padding frames. Real block ids are >= 0, so a real frame and a padding frame are ~2**30
blocks apart, far beyond the one block the DiT's look-ahead/look-back layers reach; padding frames share the block."""


# ---------------------------------------------------------------------------------------------------
# Static shapes


def slot_bucket(streams: int, max_slots: int) -> int:
    """Slots for a batch of ``streams`` (1 <= streams <= max_slots): the smallest of :func:`slot_sizes` that holds
    it (the next power of two, capped at ``max_slots``), so a few captured batch sizes serve every count."""
    if not 1 <= streams <= max_slots:
        raise ValueError(f"streams={streams} outside [1, {max_slots}]")
    return bucket_holding(streams, slot_sizes(max_slots))


def slot_sizes(max_slots: int) -> tuple[int, ...]:
    """The batch sizes a batch is padded up to: the powers of two below ``max_slots``, and ``max_slots``."""
    if max_slots < 1:
        raise ValueError(f"max_slots must be >= 1, got {max_slots}")
    return tuple(sorted({*(1 << i for i in range(max_slots.bit_length()) if 1 << i < max_slots), max_slots}))


@dataclass(frozen=True)
class WindowJob:
    """One stream's DiT window: ``noise`` (1, L, mel_dim) initial ODE state, ``features`` (groups, L, feat) the
    per-row conditioning (groups = 2 with classifier-free guidance: conditioned, unconditioned), and the absolute
    frame position of its first frame (RoPE positions and attention blocks are absolute)."""

    noise: Tensor
    features: Tensor
    first_frame: int

    @property
    def frames(self) -> int:
        return self.noise.shape[1]


@dataclass(frozen=True)
class PackedWindows:
    """Windows padded to ``frames`` and stacked in ``slots``. Rows of ``features``, ``positions`` and
    ``block_diff`` are group-major: row ``g * slots + i`` is group ``g`` of slot ``i`` (so splitting the rows in
    halves separates the conditioned from the unconditioned branch, as the guidance step expects).

    ``noise`` (slots, frames, mel_dim); ``features`` (rows, frames, feat); ``positions`` (rows, frames) long;
    ``block_diff`` (rows, frames, frames) long, key block minus query block; ``lengths`` the real frames of the
    first ``len(lengths)`` slots (the rest are unused).
    """

    noise: Tensor
    features: Tensor
    positions: Tensor
    block_diff: Tensor
    lengths: tuple[int, ...]

    def window(self, solved: Tensor, slot: int) -> Tensor:
        """The real frames of ``slot`` in a solved (slots, frames, mel_dim) batch, (1, L, mel_dim)."""
        return solved[slot : slot + 1, : self.lengths[slot]]


def pack_windows(jobs: Sequence[WindowJob], *, frames: int, slots: int, block_size: int) -> PackedWindows:
    """Pad and stack ``jobs`` into ``slots`` windows of ``frames`` frames (see the module docstring).

    Requires 1 <= len(jobs) <= slots, every job at most ``frames`` long and all jobs with the same groups,
    feature width, dtype and device. Positions of padding frames continue the window's count (any finite RoPE
    value would do: padding is masked out of every real frame's attention).
    """
    if not 1 <= len(jobs) <= slots:
        raise ValueError(f"{len(jobs)} windows for {slots} slots")
    if any(job.frames > frames for job in jobs):
        raise ValueError(f"a window is longer than {frames} frames: {[job.frames for job in jobs]}")
    first = jobs[0]
    groups, feat = first.features.shape[0], first.features.shape[2]
    rows = groups * slots
    noise = first.noise.new_zeros(slots, frames, first.noise.shape[2])
    features = first.features.new_zeros(rows, frames, feat)
    # Integer layout is built on the host (plain arithmetic) and sent in one copy each.
    positions = torch.arange(frames).repeat(rows, 1)
    blocks = torch.full((rows, frames), PAD_BLOCK, dtype=torch.long)
    for slot, job in enumerate(jobs):
        length = job.frames
        noise[slot, :length] = job.noise[0]
        features[slot::slots, :length] = job.features
        positions[slot::slots] += job.first_frame
        blocks[slot::slots, :length] = torch.arange(job.first_frame, job.first_frame + length) // block_size
    device = first.noise.device
    blocks = blocks.to(device, non_blocking=True)
    return PackedWindows(
        noise=noise,
        features=features,
        positions=positions.to(device, non_blocking=True),
        block_diff=blocks.unsqueeze(1) - blocks.unsqueeze(2),
        lengths=tuple(job.frames for job in jobs),
    )
