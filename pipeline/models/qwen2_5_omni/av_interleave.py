"""The token layout and TMRoPE positions of a spoken message with video (Qwen2.5-Omni's audio in video), built chunk
by chunk so the message can be prefilled while it is spoken.

Layout of one message (the checkpoint's processor with audio in video)::

    <|vision_bos|> <|audio_bos|>  chunk 0  chunk 1 ... chunk J-1  <|audio_eos|> <|vision_eos|>
    chunk j = the video tokens of time chunk j, then the audio tokens of time chunk j (either may be absent)

Positions are offsets from the message's first position (``<|vision_bos|>``), the same on the three rotary axes
(time, height, width) unless said otherwise:

- both opening markers are at 0; the media start at 1;
- audio token ``k`` is at ``1 + k``;
- video temporal patch ``i`` has time offset ``1 + int(i * second_per_grid * position_id_per_seconds)`` (float32
  arithmetic, then truncated) and height/width offsets ``1 + row`` / ``1 + column`` of its merged grid;
- both closing markers are at the largest offset of the *last block* (the last chunk's audio, or its video when it
  has no audio) + 1, and the text after the message continues one position later (:attr:`Qwen25OmniAVLayout.advance`).

Chunking (``tokens_per_chunk`` = ``position_id_per_seconds * seconds_per_chunk``): the audio tokens and the video
tokens are each cut, in order, where their time value (audio: ``k``; video: the patch's time offset without the 1)
first reaches the next multiple of ``tokens_per_chunk`` — one boundary per token at most, so a video whose patches lie
more than one chunk apart (below 1 frame pair per chunk) is cut per token as the reference cuts it, not per time
chunk. Video chunk ``j`` is paired with audio chunk ``j``. At the default 2 fps (one temporal patch per second) video
chunk ``j`` is temporal patches ``2j`` and ``2j + 1`` and audio chunk ``j`` is audio tokens ``50j .. 50j + 49``.

Every chunk's content depends only on the tokens up to it, so a chunk whose audio and video are both complete is
final: :meth:`Qwen25OmniAVLayout.ready_chunks` says how many are. Everything here is pure (numpy on the host).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from pipeline.models.common.av_layout import AVLayoutBase
from pipeline.models.positions import AVChunk

__all__ = ["Qwen25OmniAVLayout", "Qwen25OmniAVTiming", "token_chunks"]


@dataclass(frozen=True)
class Qwen25OmniAVTiming:
    """The model's time constants (from the checkpoint config) and the video's seconds per temporal patch: the family's
    :class:`pipeline.models.positions.AVTiming`."""

    position_id_per_seconds: int
    seconds_per_chunk: int
    second_per_grid: float
    """Seconds one temporal patch spans: ``temporal_patch_size / fps`` (1.0 at 2 fps)."""

    @property
    def tokens_per_chunk(self) -> int:
        return int(self.position_id_per_seconds * self.seconds_per_chunk)

    def patch_time(self, i: int) -> int:
        """Time offset (before the +1 of the opening markers) of temporal patch ``i``."""
        return int(np.float32(i) * np.float32(self.second_per_grid) * np.float32(self.position_id_per_seconds))

    def layout(self, *, rows: int, cols: int, n_patches: int, n_audio: int) -> Qwen25OmniAVLayout:
        """The :class:`Qwen25OmniAVLayout` of a message of these media (:class:`pipeline.models.positions.AVTiming`)."""
        return Qwen25OmniAVLayout(self, rows=rows, cols=cols, n_patches=n_patches, n_audio=n_audio)


def token_chunks(values: np.ndarray, tokens_per_chunk: int) -> np.ndarray:
    """Chunk index of each token of a non-decreasing sequence of time ``values``: a new chunk starts at a token whose
    value reaches ``(chunks started so far) * tokens_per_chunk``; at most one new chunk per token."""
    out = np.empty(len(values), dtype=np.int64)
    chunk, threshold = 0, tokens_per_chunk
    for n, v in enumerate(values.tolist()):
        if v >= threshold:
            chunk += 1
            threshold += tokens_per_chunk
        out[n] = chunk
    return out


class Qwen25OmniAVLayout(AVLayoutBase):
    """Layout and offsets of one message (:class:`~pipeline.models.common.av_layout.AVLayoutBase`): both opening
    markers at offset 0, both closing markers at :attr:`close_offset`."""

    MARKER_STEP = 0

    def __init__(self, timing: Qwen25OmniAVTiming, *, rows: int, cols: int, n_patches: int, n_audio: int) -> None:
        super().__init__(timing, rows=rows, cols=cols, n_patches=n_patches, n_audio=n_audio)
        per_patch = rows * cols
        self._patch_t = np.array([timing.patch_time(i) for i in range(n_patches)], dtype=np.int64)
        self._video_t = np.repeat(self._patch_t, per_patch)
        upcoming = np.append(self._video_t, timing.patch_time(n_patches))  # the next patch's first token
        chunk_of = token_chunks(upcoming, timing.tokens_per_chunk)
        self._video_chunk, self._next_video_chunk = chunk_of[:-1], int(chunk_of[-1])
        self._audio_chunk = np.arange(n_audio, dtype=np.int64) // timing.tokens_per_chunk
        self._video_bounds = _bounds(self._video_chunk)
        self._audio_bounds = _bounds(self._audio_chunk)

    # -- chunks ---------------------------------------------------------------------------------
    @property
    def n_chunks(self) -> int:
        return max(len(self._video_bounds), len(self._audio_bounds))

    def chunk(self, j: int) -> AVChunk:
        vb, ab = self._video_bounds, self._audio_bounds
        video = range(*vb[j]) if j < len(vb) else range(0)
        audio = range(*ab[j]) if j < len(ab) else range(0)
        return AVChunk(j, video, audio)

    def ready_chunks(self, *, video_closed: bool, audio_closed: bool) -> int:
        """How many leading chunks are final. Chunk ``j``'s audio is final once it holds ``tokens_per_chunk`` tokens or
        the audio is closed; its video once the next temporal patch would start a later chunk or the video is closed. A
        chunk past the end of a closed stream has none of it."""
        tpc = self.timing.tokens_per_chunk
        n = 0
        while n < self.n_chunks:
            audio_final = audio_closed or self.n_audio >= (n + 1) * tpc
            video_final = video_closed or self._next_video_chunk > n
            if not (audio_final and video_final):
                break
            n += 1
        return n

    # -- tokens and offsets ---------------------------------------------------------------------
    def chunk_offsets(self, j: int) -> np.ndarray:
        """(3, chunk length) offsets of chunk ``j``'s tokens from the message's first position."""
        c = self.chunk(j)
        per_patch = self.rows * self.cols
        v = np.arange(c.video.start, c.video.stop, dtype=np.int64)
        within = v % per_patch
        video = np.stack([self._video_t[c.video.start : c.video.stop], within // self.cols, within % self.cols])
        audio = np.arange(c.audio.start, c.audio.stop, dtype=np.int64)
        return np.concatenate([video, np.broadcast_to(audio, (3, len(audio)))], axis=1) + 1

    @property
    def close_offset(self) -> int:
        """Offset of both closing markers: the last block's largest offset + 1 (1 for a message with no media)."""
        if not self.n_chunks:
            return 1
        last = self.chunk(self.n_chunks - 1)
        offsets = self.chunk_offsets(last.index)
        block = offsets[:, len(last.video) :] if len(last.audio) else offsets
        return int(block.max()) + 1


def _bounds(chunk_of: np.ndarray) -> list[tuple[int, int]]:
    """[start, stop) of each chunk of a sequence whose chunk indices are 0, 1, 2, ... in runs."""
    if not len(chunk_of):
        return []
    starts = np.flatnonzero(np.diff(chunk_of)) + 1
    edges = [0, *starts.tolist(), len(chunk_of)]
    return list(zip(edges[:-1], edges[1:]))
