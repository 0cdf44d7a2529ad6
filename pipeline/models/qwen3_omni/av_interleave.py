"""The token layout and TMRoPE positions of a spoken message with video (Qwen3-Omni's audio in video), built chunk by
chunk so the message can be prefilled while it is spoken.

Layout of one message (``Qwen3OmniMoeProcessor.replace_video_with_audio_token`` inside the chat template's vision
markers)::

    <|vision_bos|> <|audio_bos|>  media tokens  <|audio_eos|> <|vision_eos|>

The media tokens are the video's and the audio's merged by time: video temporal patch ``i`` has the time
``t_i = i * second_per_grid * position_id_per_seconds`` and audio token ``k`` the time ``k``; a patch's tokens go
before every audio token whose time is at least its own (a tie puts the video first). Positions are offsets from the
message's first position (``<|vision_bos|>``), the same on the three rotary axes (time, height, width) unless said:

- the opening markers are at 0 and 1; the media start at 2;
- audio token ``k`` is at ``2 + k``;
- a token of patch ``i`` at merged row ``r`` and column ``c`` is at ``2 + (t_i, r, c)``;
- the closing markers are at ``close`` and ``close + 1``, where ``close`` is the largest offset of the *last block*
  + 1: the audio's last token when the message ends on audio (``close = n_audio + 2``), else every patch after the
  last audio token (``get_rope_index`` takes the max of its last list entry); the text after the message continues
  at ``close + 2`` (:attr:`Qwen3OmniAVLayout.advance`).

Unlike Qwen2.5-Omni, no 2-second chunking enters the layout (``seconds_per_chunk`` is in the config but unused by the
reference). The layout is cut here into time chunks of one patch period ``s = t_1``: chunk ``j`` is patch ``j``'s
tokens then the audio tokens of times ``[j * s, (j + 1) * s)``, either part possibly absent. Their concatenation is
the merged order above, and every chunk depends only on the tokens up to it, so a chunk whose patch and audio are
complete is final (:meth:`Qwen3OmniAVLayout.ready_chunks`).

The reference computes these positions in floating point: a patch time that is not a whole number would give
fractional rope positions, which the engine's integer positions cannot hold, so :class:`Qwen3OmniAVTiming` refuses
such a video rate. Everything here is pure (numpy on the host).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from pipeline.models.common.av_layout import AVLayoutBase
from pipeline.models.positions import AVChunk

__all__ = ["OPENING_MARKERS", "Qwen3OmniAVLayout", "Qwen3OmniAVTiming"]

OPENING_MARKERS = 2
"""``<|vision_bos|>`` and ``<|audio_bos|>`` open the message, at offsets 0 and 1
(:attr:`Qwen3OmniAVLayout.MARKER_STEP` 1); two closing markers end it."""


@dataclass(frozen=True)
class Qwen3OmniAVTiming:
    """The model's rotary positions per second (checkpoint config) and the video's seconds per temporal patch
    (``temporal_patch_size / fps``). Raises ValueError when a patch period is not a whole number of positions."""

    position_id_per_seconds: float
    second_per_grid: float

    def __post_init__(self) -> None:
        step = self.second_per_grid * self.position_id_per_seconds
        if not (step >= 1 and float(step).is_integer()):
            raise ValueError(
                f"a video temporal patch spans {self.second_per_grid} s x {self.position_id_per_seconds} positions/s "
                f"= {step} rope positions: audio in video needs a whole number >= 1 (choose another fps)"
            )

    @property
    def patch_step(self) -> int:
        """Rope positions between two temporal patches."""
        return int(self.second_per_grid * self.position_id_per_seconds)

    def layout(self, *, rows: int, cols: int, n_patches: int, n_audio: int) -> Qwen3OmniAVLayout:
        """The :class:`Qwen3OmniAVLayout` of a message of these media (:class:`pipeline.models.positions.AVTiming`)."""
        return Qwen3OmniAVLayout(self, rows=rows, cols=cols, n_patches=n_patches, n_audio=n_audio)

    def patch_times(self, n: int) -> np.ndarray:
        """(n,) int64 times of patches ``0 .. n - 1`` as the reference computes them (the model in float32, the
        processor in float64). Raises ValueError if either differs from ``i * patch_step`` (float rounding)."""
        exact = np.arange(n, dtype=np.int64) * self.patch_step
        processor = np.arange(n) * self.second_per_grid * self.position_id_per_seconds
        model = (torch.arange(n) * torch.tensor(self.second_per_grid).float() * self.position_id_per_seconds).numpy()
        if not (np.array_equal(processor, exact) and np.array_equal(model, exact)):
            raise ValueError(f"video patch times of {self} are not whole rope positions in float arithmetic")
        return exact


class Qwen3OmniAVLayout(AVLayoutBase):
    """Layout and offsets of one message (:class:`~pipeline.models.common.av_layout.AVLayoutBase`): the opening
    markers at offsets 0 and 1, the closing ones at :attr:`close_offset` and the next offset."""

    MARKER_STEP = 1

    def __init__(self, timing: Qwen3OmniAVTiming, *, rows: int, cols: int, n_patches: int, n_audio: int) -> None:
        super().__init__(timing, rows=rows, cols=cols, n_patches=n_patches, n_audio=n_audio)
        self._patch_t = timing.patch_times(n_patches)
        self._step = timing.patch_step

    # -- chunks ---------------------------------------------------------------------------------
    @property
    def n_chunks(self) -> int:
        return max(self.n_patches, -(-self.n_audio // self._step))

    def chunk(self, j: int) -> AVChunk:
        if not 0 <= j < self.n_chunks:
            raise IndexError(f"chunk {j} of {self.n_chunks}")
        per_patch = self.rows * self.cols
        video = range(j * per_patch, (j + 1) * per_patch) if j < self.n_patches else range(0)
        audio = range(min(j * self._step, self.n_audio), min((j + 1) * self._step, self.n_audio))
        return AVChunk(j, video, audio)

    def ready_chunks(self, *, video_closed: bool, audio_closed: bool) -> int:
        """How many leading chunks are final: chunk ``j``'s video once patch ``j`` arrived or the video is closed,
        its audio once the audio reached time ``(j + 1) * s`` or is closed."""
        n = 0
        while n < self.n_chunks:
            video_final = video_closed or n < self.n_patches
            audio_final = audio_closed or self.n_audio >= (n + 1) * self._step
            if not (video_final and audio_final):
                break
            n += 1
        return n

    # -- tokens and offsets ---------------------------------------------------------------------
    def chunk_offsets(self, j: int) -> np.ndarray:
        """(3, chunk length) offsets of chunk ``j``'s tokens from the message's first position."""
        c = self.chunk(j)
        if len(c.video):
            rows = np.repeat(np.arange(self.rows, dtype=np.int64), self.cols)
            cols = np.tile(np.arange(self.cols, dtype=np.int64), self.rows)
            video = np.stack([np.full(len(rows), self._patch_t[j]), rows, cols])
        else:
            video = np.zeros((3, 0), dtype=np.int64)
        audio = np.broadcast_to(np.arange(c.audio.start, c.audio.stop, dtype=np.int64), (3, len(c.audio)))
        return np.concatenate([video, audio], axis=1) + OPENING_MARKERS

    @property
    def close_offset(self) -> int:
        """Offset of the first closing marker: the last block's largest offset + 1 (the last audio token's when the
        message ends on audio, else that of the patches after the last audio token; 2 for a message with no media)."""
        if not self.n_patches and not self.n_audio:
            return OPENING_MARKERS
        last_patch_t = int(self._patch_t[-1]) if self.n_patches else -1
        if self.n_audio and self.n_audio - 1 >= last_patch_t:  # a tie puts the patch first: audio ends the message
            return OPENING_MARKERS + self.n_audio
        return OPENING_MARKERS + max(last_patch_t, self.rows - 1, self.cols - 1) + 1
