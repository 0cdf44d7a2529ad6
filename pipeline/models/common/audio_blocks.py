"""The engine's user-audio encoder, both families' way: blocks of log-mel features that encode independently (each at
most ``block_frames`` frames) batched into one padded call of the family's ``encode_blocks``, with the lengths as
device tensors, so that on CUDA a batch of blocks replays one captured graph. Also the Whisper-style encoder layer
both families' audio towers are made of, run on a padded batch with a key mask.

What differs between the families is given to :class:`BlockAudioEncoder`: the batched encode, the block size, the
tokens a block of ``n`` frames makes, and the width an eager batch is padded to."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.attention import sdpa_kernel

from pipeline.kernels.cuda_graphs import CapturedCall, bucket_holding, host_to_device
from pipeline.kernels.sdpa import PREFILL_BACKENDS

__all__ = ["BlockAudioEncoder", "encoder_layer"]

EncodeBlocks = Callable[[nn.Module, Tensor, Tensor], Tensor]
"""``(tower, features (B, n_mels, W), lengths (B,) int64) -> (B, tokens, output_dim)``: device work only."""


def encoder_layer(layer: nn.Module, x: Tensor, keys: Tensor) -> Tensor:
    """One audio encoder layer (``Qwen2_5OmniAudioEncoderLayer``, ``Qwen3OmniMoeAudioEncoderLayer``: pre-norm
    attention then a pre-norm MLP) on (B, S, D), attending to the keys that ``keys`` (B, 1, 1, S) marks."""
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


class BlockAudioEncoder:
    """Encodes user audio blocks (each 1..``block_frames`` mel frames) with ``encode``: eagerly, padded to the longest
    block rounded up to a multiple of ``width_step``, or on CUDA (``cuda_graphs``) from graphs captured by
    :meth:`capture` for ``batch_sizes`` blocks padded to ``block_frames``. ``tokens(n)``: the tokens a block of ``n``
    frames makes, the first rows of its output.

    Called from the engine thread only. Outputs are fresh tensors (graph outputs are copied before the next replay).
    """

    def __init__(
        self,
        tower: nn.Module,
        *,
        device: torch.device | str,
        cuda_graphs: bool,
        batch_sizes: Sequence[int],
        block_frames: int,
        encode: EncodeBlocks,
        tokens: Callable[[int], int],
        width_step: int = 1,
    ) -> None:
        self.tower = tower
        self.device = torch.device(device)
        self.block_frames = block_frames
        self.n_mels = int(tower.config.num_mel_bins)
        self.batch_sizes = tuple(sorted(batch_sizes))
        self._encode = encode
        self._tokens = tokens
        self._width_step = width_step
        self._use_graphs = cuda_graphs and self.device.type == "cuda"
        self._graphs: dict[int, CapturedCall[Tensor]] = {}

    @property
    def captured(self) -> bool:
        return bool(self._graphs)

    def audio_tokens(self, frames: int) -> int:
        """Tokens the encoder makes of ``frames`` mel frames (one block or tail)."""
        return self._tokens(frames)

    @torch.inference_mode()
    def capture(self) -> None:
        """Record one graph per batch size (CUDA with ``cuda_graphs`` only; a no-op otherwise). The graphs share one
        capture stream: the engine thread replays them one after another."""
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
            return self._encode(self.tower, features, lengths)

    @torch.inference_mode()
    def encode_many(self, features: list[Tensor]) -> list[Tensor]:
        """Log-mel features (n_mels, T) of blocks (1 <= T <= :attr:`block_frames`), each a message's next block or
        its tail -> their tokens (``audio_tokens(T)``, output_dim) each, in the tower's dtype, in order. ValueError
        for a block of another shape."""
        if not features:
            return []
        bad = [tuple(f.shape) for f in features if f.dim() != 2 or f.shape[0] != self.n_mels]
        lengths = [int(f.shape[-1]) for f in features]
        if bad or any(not 1 <= n <= self.block_frames for n in lengths):
            raise ValueError(
                f"audio blocks must be ({self.n_mels}, 1..{self.block_frames}) log-mel features, "
                f"1..{self.block_frames} frames each, got {[tuple(f.shape) for f in features]}"
            )
        if not self._graphs:
            width = -(-max(lengths) // self._width_step) * self._width_step
            return self._split(self._run(*self._batch(features, width)), lengths)
        out: list[Tensor] = []
        largest = self.batch_sizes[-1]
        for start in range(0, len(features), largest):
            part = features[start : start + largest]
            size = bucket_holding(len(part), self.batch_sizes)
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

    def _split(self, encoded: Tensor, lengths: list[int]) -> list[Tensor]:
        return [encoded[i, : self._tokens(n)] for i, n in enumerate(lengths)]
