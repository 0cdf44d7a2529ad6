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
  has no audio) + 1, and the text after the message continues one position later (:attr:`AVLayout.advance`).

Chunking (``tokens_per_chunk`` = ``position_id_per_seconds * seconds_per_chunk``): the audio tokens and the video
tokens are each cut, in order, where their time value (audio: ``k``; video: the patch's time offset without the 1)
first reaches the next multiple of ``tokens_per_chunk`` — one boundary per token at most, so a video whose patches lie
more than one chunk apart (below 1 frame pair per chunk) is cut per token as the reference cuts it, not per time
chunk. Video chunk ``j`` is paired with audio chunk ``j``. At the default 2 fps (one temporal patch per second) video
chunk ``j`` is temporal patches ``2j`` and ``2j + 1`` and audio chunk ``j`` is audio tokens ``50j .. 50j + 49``.

Every chunk's content depends only on the tokens up to it, so a chunk whose audio and video are both complete is
final: :meth:`AVLayout.ready_chunks` says how many are. Everything here is pure (numpy on the host).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["AVChunk", "AVLayout", "AVTiming", "token_chunks"]


@dataclass(frozen=True)
class AVTiming:
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

    def layout(self, *, rows: int, cols: int, n_patches: int, n_audio: int) -> AVLayout:
        """The :class:`AVLayout` of a message of these media (:class:`pipeline.models.positions.AVTiming`)."""
        return AVLayout(self, rows=rows, cols=cols, n_patches=n_patches, n_audio=n_audio)


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


@dataclass(frozen=True)
class AVChunk:
    """One time chunk of the message: video tokens ``video`` (indices into the video's tokens in the vision tower's
    order: temporal patch, then row, then column) then audio tokens ``audio`` (indices into the message's audio
    tokens)."""

    index: int
    video: range
    audio: range

    @property
    def length(self) -> int:
        return len(self.video) + len(self.audio)


class AVLayout:
    """Layout and offsets of one message with ``n_audio`` audio tokens and ``n_patches`` temporal patches of a
    ``rows`` x ``cols`` merged grid (tokens per patch ``rows * cols``), as far as they are known.

    ``n_patches`` and ``n_audio`` only grow from one layout of a message to the next (the engine makes a new one as
    media arrive); the first :meth:`ready_chunks` chunks of a layout are equal in every later layout of the message.
    """

    def __init__(self, timing: AVTiming, *, rows: int, cols: int, n_patches: int, n_audio: int) -> None:
        if rows <= 0 or cols <= 0 or n_patches < 0 or n_audio < 0:
            raise ValueError(f"bad audio/video layout: grid {rows}x{cols}, {n_patches} patches, {n_audio} audio tokens")
        self.timing = timing
        self.rows, self.cols = rows, cols
        self.n_patches, self.n_audio = n_patches, n_audio
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

    def chunks(self) -> list[AVChunk]:
        return [self.chunk(j) for j in range(self.n_chunks)]

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

    def chunk_kinds(self, j: int) -> tuple[int, int]:
        """(video tokens, audio tokens) of chunk ``j``, in that order in the layout."""
        c = self.chunk(j)
        return len(c.video), len(c.audio)

    @property
    def close_offset(self) -> int:
        """Offset of both closing markers: the last block's largest offset + 1 (1 for a message with no media)."""
        if not self.n_chunks:
            return 1
        last = self.chunk(self.n_chunks - 1)
        offsets = self.chunk_offsets(last.index)
        block = offsets[:, len(last.video) :] if len(last.audio) else offsets
        return int(block.max()) + 1

    @property
    def advance(self) -> int:
        """Rope positions from the message's first position to the text after it (close offset + 1)."""
        return self.close_offset + 1

    def prefix_offsets(self, n: int) -> np.ndarray:
        """(3, length) offsets of the two opening markers and the first ``n`` chunks: an open message's rendering."""
        parts = [np.zeros((3, 2), dtype=np.int64)] + [self.chunk_offsets(j) for j in range(n)]
        return np.concatenate(parts, axis=1)

    def offsets(self) -> np.ndarray:
        """(3, length) offsets of the whole closed message: the two opening markers, every chunk, the two closing
        markers."""
        close = np.full((3, 2), self.close_offset, dtype=np.int64)
        return np.concatenate([self.prefix_offsets(self.n_chunks), close], axis=1)

    def token_ids(
        self, *, vision_start: int, audio_start: int, video: int, audio: int, audio_end: int, vision_end: int
    ):
        """The closed message's token ids (placeholders for media), for tests and for one-shot rendering."""
        ids = [vision_start, audio_start]
        for j in range(self.n_chunks):
            nv, na = self.chunk_kinds(j)
            ids += [video] * nv + [audio] * na
        return ids + [audio_end, vision_end]


def _bounds(chunk_of: np.ndarray) -> list[tuple[int, int]]:
    """[start, stop) of each chunk of a sequence whose chunk indices are 0, 1, 2, ... in runs."""
    if not len(chunk_of):
        return []
    starts = np.flatnonzero(np.diff(chunk_of)) + 1
    edges = [0, *starts.tolist(), len(chunk_of)]
    return list(zip(edges[:-1], edges[1:]))
