"""The thinker's audio tower (Qwen2.5-Omni's Whisper-style encoder) over a batch of padded 2 s blocks, with the
lengths as device tensors: fixed shapes and no host reads, so a batch of blocks encodes as one CUDA-graph replay.

Why: transformers' forward reads the block lengths on the host (chunk splitting, ``nonzero`` for the valid
positions, per-chunk attention calls) and launches ~400 small kernels from Python: 15-30 ms for a few ms of device
work. Every turn's tail is encoded after the user stops speaking, so that time was on the
first audio's path at one user; under load every step that encoded a block was that much longer.

Same arithmetic as transformers' ``Qwen2_5OmniAudioEncoder`` on blocks of at most ``n_window * 2`` mel frames (the
encoder attends within such blocks, which is why blocks encode independently, pipeline/runners/audio_encodes.py):

- a block of ``L`` frames is zero-padded to the batch width ``W`` (the reference pads its chunks with zeros too);
  ``conv1`` outputs at frames >= ``L`` are zeroed before ``conv2`` as in the reference;
- ``conv2`` (stride 2) gives ``A = (L - 1) // 2 + 1`` valid positions; attention masks the keys at ``>= A`` (the
  reference drops those positions before attention: the valid rows are the same up to float rounding);
- positions ``2k, 2k + 1`` are averaged, then ``ln_post`` and ``proj``: the block's ``(A - 2) // 2 + 1`` tokens are the
  first rows of its output, the rest is padding to drop.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from pipeline.models.common.audio_blocks import BlockAudioEncoder, encoder_layer
from pipeline.models.qwen2_5_omni.checkpoint import audio_tokens_for_mel_frames

__all__ = ["Qwen25OmniBlockEncoder", "GRAPH_BATCHES", "encode_blocks"]

GRAPH_BATCHES = (1, 2, 4, 8, 16)
"""Blocks per captured encode. A step's encodes (every conversation's new blocks and tails) are padded to the next
size; more than the largest run as several replays."""


def encode_blocks(tower: nn.Module, features: Tensor, lengths: Tensor) -> Tensor:
    """``features`` (B, n_mels, W) float, zero beyond each block's length; ``lengths`` (B,) int64 mel frames, each in
    1..W (W at most the tower's ``n_window * 2``). Returns (B, P // 2, output_dim) in the tower's dtype, with
    ``P = (W - 1) // 2 + 1``: block i's tokens are its first ``audio_tokens_for_mel_frames(lengths[i])`` rows. Device
    work only."""
    dtype = tower.conv1.weight.dtype
    frames = torch.arange(features.shape[2], device=features.device)
    x = F.gelu(tower.conv1(features.to(dtype))) * (frames < lengths[:, None]).unsqueeze(1).to(dtype)
    x = F.gelu(tower.conv2(x)).transpose(1, 2)
    positions = x.shape[1]
    x = x + tower.positional_embedding.positional_embedding[:positions].unsqueeze(0).to(dtype)
    valid = (lengths - 1) // 2 + 1
    keys = (torch.arange(positions, device=x.device) < valid[:, None])[:, None, None, :]
    for layer in tower.layers:
        x = encoder_layer(layer, x, keys)
    pairs = positions // 2
    x = (x[:, 0 : 2 * pairs : 2] + x[:, 1 : 2 * pairs : 2]) / 2
    return tower.proj(tower.ln_post(x))


class Qwen25OmniBlockEncoder(BlockAudioEncoder):
    """Encodes user audio blocks (each at most ``n_window * 2`` frames) with :func:`encode_blocks`: eagerly, or on
    CUDA from graphs captured by :meth:`capture` for :data:`GRAPH_BATCHES` blocks padded to the full block width
    (:class:`~pipeline.models.common.audio_blocks.BlockAudioEncoder`). Engine thread only."""

    def __init__(
        self,
        tower: nn.Module,
        *,
        device: torch.device | str,
        cuda_graphs: bool = True,
        batch_sizes: Sequence[int] = GRAPH_BATCHES,
    ) -> None:
        super().__init__(
            tower,
            device=device,
            cuda_graphs=cuda_graphs,
            batch_sizes=batch_sizes,
            block_frames=2 * tower.config.n_window,
            encode=encode_blocks,
            tokens=audio_tokens_for_mel_frames,
        )
