"""The camera video of a spoken message in the engine: its frame pairs, their encodes, and its removal by the video
budget.

A spoken message gets video through :meth:`pipeline.api.AudioInputHandle.add_video_frame`. Its frames go onto the
model's frame grid (:class:`~pipeline.video.timeline.VideoTimeline`); every frame pair (temporal patch) that becomes
final is preprocessed at once and queued for the next step's vision encode (:class:`OpenVideo`). The message is then
rendered in the family's layout of audio in video (:class:`pipeline.models.positions.AVLayout`): chunk by chunk, the
chunks whose video and audio are both final prefilled in the background while the user speaks, so that at commit only
the last chunk remains.

Rules of the engine (beside the timeline's): the message's picture size is its first frame's (resized by the pixel
budget, :meth:`pipeline.api.VisionInfo.resized`); a frame that resizes to another size is dropped and counted. A
message whose video has no frame pair when it is committed is a plain spoken message.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from pipeline.api import VisionInfo
from pipeline.models.positions import AVLayout, AVTiming
from pipeline.video.budget import VideoBudget
from pipeline.video.timeline import VideoTimeline

__all__ = ["OpenVideo", "VideoPart", "remove_old_videos"]


@dataclass
class VideoPart:
    """The video of one message: ``pairs`` temporal patches of a ``rows`` x ``cols`` merged grid, each an encoded
    block (``embeds`` (rows * cols, H), filled by the step's vision encode; ``error`` if it failed)."""

    timing: AVTiming
    rows: int
    cols: int
    pairs: list = field(default_factory=list)

    @property
    def tokens(self) -> int:
        """Thinker positions of the video."""
        return len(self.pairs) * self.rows * self.cols

    @property
    def seconds(self) -> float:
        """Seconds of video (what the video budget counts)."""
        return len(self.pairs) * self.timing.second_per_grid

    def layout(self, n_audio: int) -> AVLayout:
        """The message's layout with ``n_audio`` audio tokens."""
        return self.timing.layout(rows=self.rows, cols=self.cols, n_patches=len(self.pairs), n_audio=n_audio)


class OpenVideo:
    """The video of a message still being spoken: its timeline and the frame pairs handed out for encoding.

    ``encode(frames) -> block`` preprocesses one pair's frames and queues them for the next vision encode (it raises
    ``InvalidImageError`` for a bad frame, which the caller checks first)."""

    def __init__(self, info: VisionInfo, timing: AVTiming, *, grace_s: float, size: tuple[int, int]) -> None:
        self.info = info
        self.size = size
        """(height, width) in pixels every frame of the message is resized to (its first frame's)."""
        rows, cols = (side // (info.patch_size * info.merge_size) for side in size)
        self.part = VideoPart(timing, rows, cols)
        self.timeline = VideoTimeline(fps=info.fps, temporal_patch_size=info.temporal_patch_size, grace_s=grace_s)
        self.dropped = 0
        """Frames dropped for their size (the timeline counts its own drops)."""

    def add(self, frame: np.ndarray, t: float) -> bool:
        """Place a frame seen at ``t`` seconds; False (counted) when it is dropped."""
        if self.info.resized(frame.shape[0], frame.shape[1]) != self.size:
            self.dropped += 1
            return False
        return self.timeline.add(frame, t)

    @property
    def frames_dropped(self) -> int:
        return self.dropped + self.timeline.dropped

    @property
    def closed(self) -> bool:
        """No more frame pairs will come (:attr:`VideoTimeline.ended`)."""
        return self.timeline.ended

    def advance(self, audio_s: float, encode: Callable[[list[np.ndarray]], object], *, closed: bool) -> int:
        """Hand the pairs that became final with ``audio_s`` seconds of audio (``closed``: the message is committed)
        to ``encode``, in order; returns how many were added."""
        final = self.timeline.final_patches(audio_s, closed=closed)
        pairs = self.part.pairs
        added = final - len(pairs)
        for i in range(len(pairs), final):
            pairs.append(encode(self.timeline.patch_frames(i)))
        return added


def remove_old_videos(items: Sequence, turn_start: int, budget: VideoBudget) -> int:
    """Apply the video budget (:mod:`pipeline.video.budget`) to ``items`` (conversation items; ``video`` a
    :class:`VideoPart` or None): the videos of the messages before ``turn_start``, oldest first, are removed (set to
    None; their audio stays) as :meth:`VideoBudget.videos_to_remove` says. Returns the thinker positions removed."""
    history = [item for item in items[:turn_start] if getattr(item, "video", None) is not None]
    n = budget.videos_to_remove([item.video.seconds for item in history])
    removed = 0
    for item in history[:n]:
        removed += item.video.tokens
        item.video = None
    return removed
