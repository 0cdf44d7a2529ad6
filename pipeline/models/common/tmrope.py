"""TMRoPE, the Qwen-Omni families' rotary positions of a rendered conversation: three axes (time, height, width) per
thinker position (:class:`pipeline.models.positions.PositionScheme`, as :data:`TMROPE`).

Text and audio positions advance by one on all three axes. A span with explicit 3-D positions (an image's or a
video's tokens) is given as offsets from its first position; the span starts at the next position and the text after
it continues at the span's largest position + 1 (or at its own ``advance``), so positions past a picture run behind
the KV cache index. Their difference, the rope *shift* (rope position - cache index), is constant over a run of text
and changes after every explicit span.

A conversation without explicit spans has rope position == cache index on every axis: :func:`rope_positions` returns
None then and costs nothing. Every function here is pure (numpy on the host).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from pipeline.models.positions import GridSpan

__all__ = ["TMROPE", "TMRoPE", "rope_positions", "rope_shift", "vision_offsets"]


def vision_offsets(grid_t: int, grid_h: int, grid_w: int, *, merge: int, t_step: int) -> np.ndarray:
    """(3, grid_t * (grid_h // merge) * (grid_w // merge)) offsets of a vision tower's tokens in its output order
    (time, then rows, then columns): ``t_step`` rope positions per temporal patch (0 for an image's one patch; for
    video, seconds per temporal patch x position ids per second), one per merged row and column."""
    rows, cols = grid_h // merge, grid_w // merge
    t = np.repeat(np.arange(grid_t, dtype=np.int64) * t_step, rows * cols)
    h = np.tile(np.repeat(np.arange(rows, dtype=np.int64), cols), grid_t)
    w = np.tile(np.arange(cols, dtype=np.int64), grid_t * rows)
    return np.stack([t, h, w])


def _check(spans: Sequence[GridSpan]) -> None:
    end = 0
    for span in spans:
        if span.at < end:
            raise ValueError(f"explicit position spans overlap or are out of order at position {span.at}")
        end = span.at + span.length


def rope_positions(length: int, spans: Sequence[GridSpan], start: int = 0) -> np.ndarray | None:
    """(3, length - start) rope positions of rendering positions ``start .. length - 1``; None when no span lies
    (even partly) before ``length``: then every axis equals the cache index. ``spans`` in order, not overlapping; a
    span cut by ``length`` contributes its first positions."""
    _check(spans)
    if not any(span.at < length for span in spans):
        return None
    out = np.empty((3, length), dtype=np.int64)
    shift, done = 0, 0  # rope - index for text positions from `done` on
    for span in spans:
        if span.at >= length:
            break
        out[:, done : span.at] = np.arange(done, span.at) + shift
        first = span.at + shift
        n = min(span.length, length - span.at)
        out[:, span.at : span.at + n] = first + span.offsets[:, :n]
        shift = first + span.extent - (span.at + span.length)
        done = span.at + n
    out[:, done:length] = np.arange(done, length) + shift
    return out[:, start:]


def rope_shift(spans: Sequence[GridSpan], length: int) -> int:
    """Rope position - cache index of a text position at ``length`` or later (before any span that starts later):
    the offset a decode step at cache index ``length`` adds on every axis. 0 without spans. ``length`` must not
    fall inside a span."""
    _check(spans)
    shift = 0
    for span in spans:
        if span.at >= length:
            break
        if span.at + span.length > length:
            raise ValueError(f"position {length} lies inside an explicit position span at {span.at}")
        shift += span.extent - span.length
    return shift


class TMRoPE:
    """The functions above as a :class:`~pipeline.models.positions.PositionScheme`; a picture is one temporal patch
    at time 0 (``t_step`` 0)."""

    rope_positions = staticmethod(rope_positions)
    rope_shift = staticmethod(rope_shift)

    @staticmethod
    def image_offsets(grid_thw: tuple[int, int, int], *, merge: int) -> np.ndarray:
        t, h, w = grid_thw
        return vision_offsets(t, h, w, merge=merge, t_step=0)


TMROPE = TMRoPE()
