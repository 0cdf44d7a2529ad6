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
from torch.nn.attention import sdpa_kernel

from pipeline.kernels.cuda_graphs import CapturedCall, bucket_at_least, host_to_device
from pipeline.kernels.sdpa import PREFILL_BACKENDS
from pipeline.models.qwen2_5_omni.checkpoint import audio_tokens_for_mel_frames

__all__ = ["BlockEncoder", "GRAPH_BATCHES", "encode_blocks"]

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
        x = _layer(layer, x, keys)
    pairs = positions // 2
    x = (x[:, 0 : 2 * pairs : 2] + x[:, 1 : 2 * pairs : 2]) / 2
    return tower.proj(tower.ln_post(x))


def _layer(layer: nn.Module, x: Tensor, keys: Tensor) -> Tensor:
    """One ``Qwen2_5OmniAudioEncoderLayer`` on (B, T, D) with a (B, 1, 1, T) mask of the keys to attend."""
    attn = layer.self_attn
    batch, length, width = x.shape
    h = layer.self_attn_layer_norm(x)

    def heads(proj: nn.Linear) -> Tensor:
        return proj(h).view(batch, length, attn.num_heads, attn.head_dim).transpose(1, 2)

    out = F.scaled_dot_product_attention(
        heads(attn.q_proj), heads(attn.k_proj), heads(attn.v_proj), attn_mask=keys, scale=attn.scaling
    )
    x = x + attn.out_proj(out.transpose(1, 2).reshape(batch, length, width))
    x = x + layer.fc2(layer.activation_fn(layer.fc1(layer.final_layer_norm(x))))
    if x.dtype == torch.float16:  # as the reference: keep float16 activations finite
        limit = torch.finfo(x.dtype).max - 1000
        x = x.clamp(-limit, limit)
    return x


class BlockEncoder:
    """Encodes user audio blocks (each at most ``n_window * 2`` frames) with :func:`encode_blocks`: eagerly, or on
    CUDA from graphs captured by :meth:`capture` for :data:`GRAPH_BATCHES` blocks padded to the full block width.

    Called from the engine thread only. Outputs are fresh tensors (graph outputs are copied before the next replay).
    """

    def __init__(
        self,
        tower: nn.Module,
        *,
        device: torch.device,
        cuda_graphs: bool = True,
        batch_sizes: Sequence[int] = GRAPH_BATCHES,
    ) -> None:
        self.tower = tower
        self.device = torch.device(device)
        self.block_frames = 2 * tower.config.n_window
        self.n_mels = tower.config.num_mel_bins
        self.batch_sizes = tuple(sorted(batch_sizes))
        self._use_graphs = cuda_graphs and self.device.type == "cuda"
        self._graphs: dict[int, CapturedCall] = {}

    @property
    def captured(self) -> bool:
        return bool(self._graphs)

    @staticmethod
    def audio_tokens(frames: int) -> int:
        """Tokens the encoder makes of ``frames`` mel frames (one block or tail)."""
        return audio_tokens_for_mel_frames(frames)

    @torch.inference_mode()
    def capture(self) -> None:
        """Record one graph per batch size (CUDA only; a no-op otherwise). The graphs share one capture stream: the
        engine thread replays them one after another."""
        if not self._use_graphs or self._graphs:
            return
        stream = torch.cuda.Stream(self.device)
        for size in self.batch_sizes:
            example = (
                torch.zeros(size, self.n_mels, self.block_frames, device=self.device),
                torch.full((size,), self.block_frames, dtype=torch.long, device=self.device),
            )
            self._graphs[size] = CapturedCall(self._run, example, capture_stream=stream)

    def _run(self, features: Tensor, lengths: Tensor) -> Tensor:
        with sdpa_kernel(PREFILL_BACKENDS):  # masked attention; cuDNN would build a plan for every new length
            return encode_blocks(self.tower, features, lengths)

    @torch.inference_mode()
    def encode_many(self, features: list[Tensor]) -> list[Tensor]:
        """Log-mel features (n_mels, T) of blocks (1 <= T <= ``block_frames``) -> their tokens
        (``audio_tokens_for_mel_frames(T)``, output_dim) each, in the tower's dtype, in order."""
        lengths = [f.shape[1] for f in features]
        if any(not 1 <= n <= self.block_frames for n in lengths):
            raise ValueError(f"audio blocks must have 1..{self.block_frames} frames, got {lengths}")
        if not self._graphs:
            return self._split(self._run(*self._batch(features, max(lengths))), lengths)
        out: list[Tensor] = []
        largest = self.batch_sizes[-1]
        for start in range(0, len(features), largest):
            part = features[start : start + largest]
            size = bucket_at_least(len(part), self.batch_sizes)
            padded, lens = self._batch(part, self.block_frames, rows=size)
            encoded = self._graphs[size](padded, lens)
            out += [t.clone() for t in self._split(encoded, lengths[start : start + largest])]
        return out

    def _batch(self, features: list[Tensor], width: int, rows: int | None = None) -> tuple[Tensor, Tensor]:
        """(rows, n_mels, width) zero-padded features and (rows,) lengths on the device, in one host copy each.
        Rows past the blocks (graph padding) are full-width zeros, so their attention has keys."""
        rows = rows or len(features)
        padded = torch.zeros(rows, self.n_mels, width)
        lengths = [width] * rows
        for i, f in enumerate(features):
            padded[i, :, : f.shape[1]] = f
            lengths[i] = f.shape[1]
        return host_to_device(padded, torch.float32, self.device), host_to_device(lengths, torch.long, self.device)

    @staticmethod
    def _split(encoded: Tensor, lengths: list[int]) -> list[Tensor]:
        return [encoded[i, : audio_tokens_for_mel_frames(n)] for i, n in enumerate(lengths)]
