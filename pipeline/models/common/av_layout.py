"""What both families' layouts of a spoken message with video share (:class:`pipeline.models.positions.AVLayout`): the
message is two opening markers (``<vision start> <audio start>``), its chunks in order (each a chunk's video tokens
then its audio tokens), then two closing markers (``<audio end> <vision end>``). How the media are cut into chunks,
their offsets, when a chunk is final and where the closing markers go are the family's; so is whether the two markers
of a pair share a rope position (:attr:`AVLayoutBase.MARKER_STEP`). Everything here is pure (numpy on the host)."""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np

from pipeline.models.positions import AVChunk

__all__ = ["AVLayoutBase"]


class AVLayoutBase:
    """Layout and offsets of one message with ``n_audio`` audio tokens and ``n_patches`` temporal patches of a
    ``rows`` x ``cols`` merged grid (tokens per patch ``rows * cols``), as far as they are known.

    ``n_patches`` and ``n_audio`` only grow from one layout of a message to the next (the engine makes a new one as
    media arrive); the first :meth:`ready_chunks` chunks of a layout are equal in every later layout of the message.
    A family's subclass gives :attr:`n_chunks`, :meth:`chunk`, :meth:`ready_chunks`, :meth:`chunk_offsets` and
    :attr:`close_offset`; the markers and the whole message's offsets and ids follow here.
    """

    MARKER_STEP: ClassVar[int]
    """Rope positions from the first marker of a pair to the second (opening: at 0 and ``MARKER_STEP``; closing: at
    ``close_offset`` and ``close_offset + MARKER_STEP``): 0 when they share a position."""

    def __init__(self, timing: Any, *, rows: int, cols: int, n_patches: int, n_audio: int) -> None:
        if rows <= 0 or cols <= 0 or n_patches < 0 or n_audio < 0:
            raise ValueError(f"bad audio/video layout: grid {rows}x{cols}, {n_patches} patches, {n_audio} audio tokens")
        self.timing = timing
        self.rows, self.cols = rows, cols
        self.n_patches, self.n_audio = n_patches, n_audio

    # -- the family's
    @property
    def n_chunks(self) -> int:
        raise NotImplementedError

    def chunk(self, j: int) -> AVChunk:
        raise NotImplementedError

    def ready_chunks(self, *, video_closed: bool, audio_closed: bool) -> int:
        """How many leading chunks are final: no later frame or audio token can change them."""
        raise NotImplementedError

    def chunk_offsets(self, j: int) -> np.ndarray:
        """(3, chunk length) offsets of chunk ``j``'s tokens from the message's first position."""
        raise NotImplementedError

    @property
    def close_offset(self) -> int:
        """Offset of the first closing marker."""
        raise NotImplementedError

    # -- shared
    def chunks(self) -> list[AVChunk]:
        return [self.chunk(j) for j in range(self.n_chunks)]

    def chunk_kinds(self, j: int) -> tuple[int, int]:
        """(video tokens, audio tokens) of chunk ``j``, in that order in the layout."""
        c = self.chunk(j)
        return len(c.video), len(c.audio)

    def opening_offsets(self) -> np.ndarray:
        """(3, 2) offsets of the two opening markers."""
        return np.broadcast_to(np.arange(2, dtype=np.int64) * self.MARKER_STEP, (3, 2)).copy()

    def prefix_offsets(self, n: int) -> np.ndarray:
        """(3, length) offsets of the opening markers and the first ``n`` chunks: an open message's rendering."""
        return np.concatenate([self.opening_offsets(), *(self.chunk_offsets(j) for j in range(n))], axis=1)

    @property
    def advance(self) -> int:
        """Rope positions from the message's first position to the text after it (one past the last closing
        marker)."""
        return self.close_offset + self.MARKER_STEP + 1

    def offsets(self) -> np.ndarray:
        """(3, length) offsets of the whole closed message: the opening markers, every chunk, the closing markers."""
        close = np.broadcast_to(self.close_offset + np.arange(2, dtype=np.int64) * self.MARKER_STEP, (3, 2))
        return np.concatenate([self.prefix_offsets(self.n_chunks), close], axis=1)

    def token_ids(
        self, *, vision_start: int, audio_start: int, video: int, audio: int, audio_end: int, vision_end: int
    ) -> list[int]:
        """The closed message's token ids (placeholders for media), for one-shot rendering."""
        ids = [vision_start, audio_start]
        for j in range(self.n_chunks):
            nv, na = self.chunk_kinds(j)
            ids += [video] * nv + [audio] * na
        return ids + [audio_end, vision_end]
