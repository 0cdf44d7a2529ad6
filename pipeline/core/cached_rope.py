"""The TMRoPE positions a conversation's cached positions were run at, kept for a second decoder over the same
positions: the talker's prompt is the thinker's, position for position, at the thinker's rope positions.

A position has a cache index and a rope position on each of the three axes (time, height, width); they differ once a
conversation holds a picture or video (:mod:`pipeline.models.positions`). :class:`CachedRope` stores
nothing while every recorded position's rope equals its cache index (a conversation without pictures or video), so
that case costs nothing. Host numpy only; engine thread only.
"""

from __future__ import annotations

import numpy as np

__all__ = ["CachedRope"]


class CachedRope:
    def __init__(self) -> None:
        self._rows: np.ndarray | None = None
        """(3, capacity) int64 rope positions by cache index; None: every position's equal its cache index. Columns
        not recorded yet hold their own index (the identity), so a recording that starts later stays exact."""

    def record(self, start: int, count: int, rope: np.ndarray | None = None, shift: int = 0) -> None:
        """Cache indices ``start .. start + count - 1`` were run at ``rope`` (3, count), or, without it, at cache index
        + ``shift`` on every axis (text). Recording over earlier positions replaces them (a cache rolled back and run
        again)."""
        if rope is not None and tuple(rope.shape) != (3, count):
            raise ValueError(f"rope positions must have shape (3, {count}), got {tuple(rope.shape)}")
        if self._rows is None:
            if rope is None and shift == 0:
                return
            self._rows = self._identity(0, max(2 * (start + count), 64))
        end = start + count
        if end > self._rows.shape[1]:
            grown = self._identity(self._rows.shape[1], max(2 * end, 64))
            self._rows = np.concatenate([self._rows, grown], axis=1)
        self._rows[:, start:end] = rope if rope is not None else np.arange(start, end) + shift

    def get(self, start: int, end: int) -> np.ndarray | None:
        """(3, end - start) rope positions of cache indices ``start .. end - 1`` (a copy); None when every recorded
        position's equals its cache index."""
        if self._rows is None:
            return None
        if end > self._rows.shape[1]:
            return np.concatenate([self._rows[:, start:], self._identity(max(start, self._rows.shape[1]), end)], 1)
        return self._rows[:, start:end].copy()

    def clear(self) -> None:
        """Forget every recorded position (the cache was dropped)."""
        self._rows = None

    @staticmethod
    def _identity(start: int, end: int) -> np.ndarray:
        return np.tile(np.arange(start, end, dtype=np.int64), (3, 1))
