"""What the engine needs to place a rendered conversation on a family's rotary positions: the explicit-position span
(:class:`GridSpan`), the family's :class:`PositionScheme`, and the layout of a spoken message with video
(:class:`AVTiming`, :class:`AVLayout` and its :class:`AVChunk`).

A position has a KV cache index (where it is stored) and a rope position on each of three axes (time, height, width).
Text and audio advance by one on every axis; a span of explicit 3-D positions (a picture's or a video's tokens) is
given as offsets from its first position, and the text after it runs at a rope *shift* (rope position - cache index),
constant over a run of text. The engine renders conversations into keys, token ids and spans
(:mod:`pipeline.core.conversation_state`); which rope positions and shifts follow from the spans, which offsets a
picture's
tokens take and how a message's audio and video interleave are the family's. Everything here is host numpy.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np

__all__ = ["AVChunk", "AVLayout", "AVTiming", "GridSpan", "PositionScheme"]


@dataclass(frozen=True)
class GridSpan:
    """Positions ``at .. at + n - 1`` of a rendering with explicit 3-D positions: ``offsets`` (3, n) int64, each row
    (t, h, w) relative to the span's start (every entry >= 0). ``advance``: rope positions from the span's start to
    the text after it, when that is not the largest offset + 1 (a spoken message with video, whose closing markers
    follow its last block: :attr:`AVLayout.advance`); None: the largest offset + 1."""

    at: int
    offsets: np.ndarray
    advance: int | None = None

    @property
    def length(self) -> int:
        return int(self.offsets.shape[1])

    @property
    def extent(self) -> int:
        """Rope positions the span advances the text after it by (:attr:`advance`, else its largest offset + 1)."""
        if self.advance is not None:
            return self.advance
        return int(self.offsets.max()) + 1 if self.length else 0


class PositionScheme(Protocol):
    """A family's rotary positions of a rendering (:meth:`pipeline.models.family.ModelFamily.positions`). Pure and
    stateless: any thread."""

    def rope_positions(self, length: int, spans: Sequence[GridSpan], start: int = 0) -> np.ndarray | None:
        """(3, length - start) int64 rope positions of rendering positions ``start .. length - 1``; None when every
        one of them (and every position before ``start``) has rope position == cache index on every axis (no span
        starts before ``length``). ``spans`` in order, not overlapping (``ValueError`` otherwise); a span cut by
        ``length`` contributes its first positions."""
        ...

    def rope_shift(self, spans: Sequence[GridSpan], length: int) -> int:
        """Rope position - cache index of a text position at ``length`` or later (before any span that starts
        later): what a decode step at cache index ``length`` adds on every axis; 0 without spans. ``ValueError`` when
        ``length`` falls inside a span."""
        ...

    def image_offsets(self, grid_thw: tuple[int, int, int], *, merge: int) -> np.ndarray:
        """(3, n) int64 offsets of one picture's ``n`` thinker positions, in the vision tower's output order, from
        its patch grid ``(t, h, w)`` and the tower's spatial ``merge``: the picture's :class:`GridSpan` offsets."""
        ...


@dataclass(frozen=True)
class AVChunk:
    """One chunk of a spoken message with video: its video tokens, then its audio tokens."""

    index: int
    video: range
    """Indices into the video's tokens (the vision tower's order: temporal patch, then row, then column)."""
    audio: range
    """Indices into the message's audio tokens."""

    @property
    def length(self) -> int:
        return len(self.video) + len(self.audio)


class AVLayout(Protocol):
    """The token layout and offsets of one spoken message with video, as far as its media are known
    (:meth:`AVTiming.layout`). The message renders as its opening markers (vision, then audio; their offsets are the
    family's: :meth:`prefix_offsets`), its chunks in order, then its closing markers (audio, then vision; the first at
    :attr:`close_offset`). A layout with more media keeps the first :meth:`ready_chunks` chunks of one with less."""

    @property
    def n_chunks(self) -> int: ...

    def chunk(self, j: int) -> AVChunk:
        """Chunk ``j`` (``0 <= j < n_chunks``)."""
        ...

    def ready_chunks(self, *, video_closed: bool, audio_closed: bool) -> int:
        """How many leading chunks are final: no later frame or audio token can change them."""
        ...

    def chunk_offsets(self, j: int) -> np.ndarray:
        """(3, chunk length) int64 offsets of chunk ``j``'s tokens from the message's first position."""
        ...

    def prefix_offsets(self, n: int) -> np.ndarray:
        """(3, length) int64 offsets of the opening markers and the first ``n`` chunks: an open message's rendering."""
        ...

    @property
    def close_offset(self) -> int:
        """Offset of the first closing marker (the second's is the family's: :meth:`offsets`)."""
        ...

    @property
    def advance(self) -> int:
        """Rope positions from the message's first position to the text after it."""
        ...

    def offsets(self) -> np.ndarray:
        """(3, length) int64 offsets of the whole closed message: opening markers, every chunk, closing markers."""
        ...


class AVTiming(Protocol):
    """How a family lays out a spoken message with camera video (:meth:`pipeline.models.family.ModelFamily.av_timing`:
    the checkpoint's time constants)."""

    second_per_grid: float
    """Seconds of video one temporal patch spans."""

    def layout(self, *, rows: int, cols: int, n_patches: int, n_audio: int) -> AVLayout:
        """The layout of a message with ``n_audio`` audio tokens and ``n_patches`` temporal patches of a ``rows`` x
        ``cols`` merged grid."""
        ...
