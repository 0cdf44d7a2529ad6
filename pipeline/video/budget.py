"""How much camera video a conversation's history keeps, and how many thinker positions video costs.

Video is dear: one thinker position per 28 x 28 pixels per frame pair (``VisionInfo.tokens``), so at 2 fps a
448 x 448 camera is 256 positions per second, ten times speech's 25. A call keeps its video within a budget of
``video_history_seconds`` (stage config, thinker) of video in the messages before the turn being answered:

- When the history holds more, the video of the oldest messages is removed, whole messages at a time, oldest first,
  until at most ``video_retention_ratio`` x the budget is left. A message that loses its video keeps its audio and
  becomes a plain spoken message (the reference's layout of a message without video); a message's video is never cut
  in part, because the reference format has a video start with its message's audio.
- The turn being answered keeps all its video, however long.
- The KV cache is kept up to the first message whose video was removed and prefilled again from there (exact for what
  is kept: the next prefill equals a fresh one over the kept items). The margin below the budget lets the next turns
  extend the cache instead of each removing one message's video and re-prefilling again.

Pure: durations in, counts out.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from pipeline.api import VisionInfo

__all__ = ["VideoBudget", "video_tokens_per_second"]


def video_tokens_per_second(info: VisionInfo, height: int, width: int, fps: float) -> float:
    """Thinker positions per second of ``height`` x ``width`` camera video sampled at ``fps``: one frame pair's
    tokens, ``fps / temporal_patch_size`` pairs a second."""
    return info.tokens(height, width) * fps / info.temporal_patch_size


@dataclass(frozen=True)
class VideoBudget:
    history_seconds: int | None
    """Seconds of video the history (the messages before the turn being answered) may hold; None: no limit."""
    retention_ratio: float
    """A removal goes down to this fraction of ``history_seconds`` (0 to 1)."""

    def videos_to_remove(self, durations: Sequence[float]) -> int:
        """How many of the oldest videos to remove, given the durations (seconds) of the history's videos, oldest
        first: 0 while they total at most ``history_seconds``; else as many as bring the total to at most
        ``retention_ratio * history_seconds``."""
        if self.history_seconds is None or sum(durations) <= self.history_seconds:
            return 0
        target, left, n = self.retention_ratio * self.history_seconds, sum(durations), 0
        while n < len(durations) and left > target:
            left -= durations[n]
            n += 1
        return n
