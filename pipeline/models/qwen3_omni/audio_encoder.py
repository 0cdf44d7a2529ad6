"""Qwen3-Omni's AuT audio encoder over a batch of padded blocks, one attention window each, with the lengths as device
tensors: fixed shapes and no host reads, so a batch of blocks encodes as one CUDA-graph replay.

What transformers' ``Qwen3OmniMoeAudioEncoder.forward`` computes for a message of ``L`` mel frames:

- the convolution stage per *chunk*: the message is cut into chunks of ``C = 2 * n_window`` frames (the last one
  shorter), each zero-padded to the longest chunk of the batch and run through three stride-2 ``Conv2d`` + GELU over
  (mel, time), ``conv_out``, then the sinusoidal position embedding of positions ``0, 1, ...`` of its own: chunks
  are independent; a full chunk makes ``T`` tokens (13 for ``C`` = 100), a shorter one its first
  ``conv_tokens(length)``;
- attention per *window*: the kept tokens of the message are cut every ``T * (n_window_infer // C)`` tokens and
  every layer attends within a window only;
- ``ln_post``, ``proj1``, GELU, ``proj2`` per token.

So the unit that encodes independently is a window of ``block_frames = (n_window_infer // C) * C`` mel frames (800 =
8 s in the released config): a message encoded block by block in blocks of ``block_frames`` (the last one shorter)
equals its one-shot encoding, and windows line up with blocks because every block but the last is whole chunks of
``T`` tokens. A smaller block would not: its tokens would miss the rest of their window in attention.

One caveat of the reference: a chunk shorter than ``C`` is zero-padded to the longest chunk of the *batch*, and the
padding goes through the convolutions' biases, so the last tokens of such a chunk depend on the batch. A message
shorter than one chunk encoded alone (padded to its own length) differs slightly from the same message beside any
longer audio (padded to ``C``). Here every chunk is convolved at width ``C``: the reference's result for every
message of at least ``C`` frames, and for every message in a batch (a prompt) that holds one.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from pipeline.errors import CheckpointError
from pipeline.models.common.audio_blocks import BlockAudioEncoder, encoder_layer

__all__ = [
    "GRAPH_BATCHES",
    "REFERENCE_TOKENS_PER_CHUNK",
    "Qwen3OmniBlockEncoder",
    "EncoderWindows",
    "conv_tokens",
    "encode_blocks",
]

GRAPH_BATCHES = (1, 2, 4)
"""Blocks per captured encode. A block is a whole attention window (8 s), so a step rarely has more than a few; more
than the largest run as several replays. Each size keeps its own activation pool, the convolutions' activations of
every chunk of its blocks, which is why the sizes stop at 4."""

REFERENCE_TOKENS_PER_CHUNK = 13
"""transformers' ``_get_feat_extract_output_lengths`` (the model's and the processor's audio token count) counts 13
tokens per full chunk whatever ``n_window``: right for the released ``n_window`` 50 (100 frames -> 50 -> 25 -> 13),
wrong for a chunk whose convolutions make another count, which the reference's own encoder would then contradict."""


def conv_tokens(frames: Any) -> Any:
    """Tokens the three stride-2 convolutions make of one chunk of ``frames`` mel frames (an int, or an integer tensor
    elementwise); 0 for 0 frames."""
    for _ in range(3):
        frames = (frames - 1) // 2 + 1
    return frames


@dataclass(frozen=True)
class EncoderWindows:
    """The encoder's chunk and window arithmetic (pure, no tensors)."""

    chunk_frames: int
    """Mel frames of one convolution chunk: ``2 * n_window``."""
    block_frames: int
    """Mel frames of one attention window, a whole number of chunks: the block the engine encodes at once."""

    @classmethod
    def of(cls, config: Any) -> EncoderWindows:
        """From an audio encoder config (``n_window``, ``n_window_infer``). Raises :class:`CheckpointError` when the
        window holds no whole chunk or the chunk's token count is not the one the reference counts."""
        chunk = 2 * int(config.n_window)
        ratio = int(config.n_window_infer) // chunk if chunk > 0 else 0
        if ratio < 1:
            raise CheckpointError(
                f"audio_config.n_window_infer ({config.n_window_infer}) must hold at least one chunk of "
                f"2 * n_window ({chunk}) mel frames",
                param="audio_config.n_window_infer",
            )
        if conv_tokens(chunk) != REFERENCE_TOKENS_PER_CHUNK:
            raise CheckpointError(
                f"audio_config.n_window {config.n_window} makes {conv_tokens(chunk)} tokens per chunk; transformers "
                f"counts {REFERENCE_TOKENS_PER_CHUNK}, so its placeholders would not match the encoder",
                param="audio_config.n_window",
            )
        return cls(chunk_frames=chunk, block_frames=ratio * chunk)

    @property
    def tokens_per_chunk(self) -> int:
        return conv_tokens(self.chunk_frames)

    @property
    def chunks_per_block(self) -> int:
        return self.block_frames // self.chunk_frames

    def tokens(self, frames: int) -> int:
        """Tokens the encoder makes of ``frames`` mel frames (a message, a block or a tail): transformers'
        ``_get_feat_extract_output_lengths``."""
        if frames < 0:
            raise ValueError(f"frames must be >= 0, got {frames}")
        full, rest = divmod(frames, self.chunk_frames)
        return full * self.tokens_per_chunk + conv_tokens(rest)


def encode_blocks(tower: nn.Module, features: Tensor, lengths: Tensor) -> Tensor:
    """``features`` (B, n_mels, W) float with W a multiple of the chunk (``2 * n_window``) and at most one attention
    window; ``lengths`` (B,) int64 mel frames, each in 1..W. Frames past a block's length are ignored (treated as the
    reference's zero padding). Returns (B, (W / chunk) * T, output_dim) in the tower's dtype: block i's tokens are its
    first ``EncoderWindows.tokens(lengths[i])`` rows (whole chunks come first, so its kept tokens are contiguous).
    Device work only."""
    chunk = 2 * int(tower.config.n_window)
    batch, mels, width = features.shape
    chunks = width // chunk
    dtype = tower.conv2d1.weight.dtype
    frames = torch.arange(width, device=features.device)
    x = features.to(dtype) * (frames < lengths[:, None]).unsqueeze(1).to(dtype)
    x = x.view(batch, mels, chunks, chunk).permute(0, 2, 1, 3).reshape(batch * chunks, 1, mels, chunk)
    x = F.gelu(tower.conv2d1(x))
    x = F.gelu(tower.conv2d2(x))
    x = F.gelu(tower.conv2d3(x))
    rows, channels, freqs, per_chunk = x.shape
    x = tower.conv_out(x.permute(0, 3, 1, 2).reshape(rows, per_chunk, channels * freqs))
    x = x + tower.positional_embedding.positional_embedding[:per_chunk].unsqueeze(0).to(dtype)
    x = x.reshape(batch, chunks * per_chunk, -1)
    starts = torch.arange(chunks, device=features.device) * chunk
    kept = conv_tokens((lengths[:, None] - starts).clamp(0, chunk))  # (B, chunks) tokens kept per chunk
    keys = torch.arange(per_chunk, device=features.device) < kept[..., None]
    keys = keys.reshape(batch, 1, 1, chunks * per_chunk)
    for layer in tower.layers:
        x = encoder_layer(layer, x, keys)
    return tower.proj2(tower.act(tower.proj1(tower.ln_post(x))))


class Qwen3OmniBlockEncoder(BlockAudioEncoder):
    """The thinker's user-audio encoder for the engine (``ThinkerParts.audio``): blocks of at most one attention
    window (:attr:`block_frames`) encoded with :func:`encode_blocks`, eagerly (padded to whole chunks), or on CUDA from
    graphs captured by :meth:`capture` for :data:`GRAPH_BATCHES` blocks padded to the full window
    (:class:`~pipeline.models.common.audio_blocks.BlockAudioEncoder`). Engine thread only."""

    def __init__(
        self,
        tower: nn.Module,
        *,
        device: torch.device | str,
        cuda_graphs: bool = True,
        batch_sizes: Sequence[int] = GRAPH_BATCHES,
    ) -> None:
        self.windows = EncoderWindows.of(tower.config)
        super().__init__(
            tower,
            device=device,
            cuda_graphs=cuda_graphs,
            batch_sizes=batch_sizes,
            block_frames=self.windows.block_frames,
            encode=encode_blocks,
            tokens=self.windows.tokens,
            width_step=self.windows.chunk_frames,
        )
