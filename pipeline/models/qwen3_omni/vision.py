"""Pictures and camera video to Qwen3-Omni's vision tower (a SigLIP2-style ViT, patch 16): the checkpoint's image
processor settings (transformers' ``Qwen2VLImageProcessor`` with the released ``preprocessor_config.json``: patch 16,
merge 2, temporal patch 2, mean and std 0.5) and the preprocessing of frames
(:mod:`pipeline.models.common.vision_patches`, the algorithm both Qwen-Omni families share).

Video: the reference processor cuts video frames exactly as pictures, but with a per-frame pixel budget of its own
(:attr:`Qwen3OmniVisionPreprocessor.video_info`); pass that, or a smaller one, as ``info`` for camera frames.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import ClassVar

from pipeline.api import VisionInfo
from pipeline.models.common.vision_patches import PatchPreprocessor, VisionInput

__all__ = ["VIDEO_FPS", "VIDEO_MAX_PIXELS", "VIDEO_MIN_PIXELS", "VisionInput", "Qwen3OmniVisionPreprocessor"]

VIDEO_FPS = 2.0
"""Frames per second of video the model was trained on. Checkpoints store no rate; Qwen's video utilities and
transformers' Qwen3-VL video processor sample at 2 fps, so one temporal patch of 2 frames covers one second. (The
reference ``Qwen3OmniMoeProcessor`` computes ``video_second_per_grid`` as ``temporal_patch_size / fps`` with ``fps``
1.0 unless the caller passes the rate it sampled at: positions must use the real rate.)"""

VIDEO_MIN_PIXELS = 128 * 32 * 32
"""Fewest pixels per video frame: the reference processor's video default (``videos_kwargs.size.shortest_edge``);
smaller frames are scaled up. Not in the checkpoint."""

VIDEO_MAX_PIXELS = 768 * 32 * 32
"""Most pixels per video frame: the reference processor's video default (``videos_kwargs.size.longest_edge``), 768
thinker positions per frame pair at patch 16, merge 2. Not in the checkpoint."""


@dataclass(frozen=True)
class Qwen3OmniVisionPreprocessor(PatchPreprocessor):
    """Qwen3-Omni's image processor settings (:meth:`from_preprocessor_config`); call it on frames (one picture, or
    video frames in time order)."""

    video_fps: ClassVar[float] = VIDEO_FPS

    @property
    def video_info(self) -> VisionInfo:
        """:attr:`info` with the reference processor's per-frame budget for video (:data:`VIDEO_MIN_PIXELS` ..
        :data:`VIDEO_MAX_PIXELS`): the ``info`` to pass for video frames at the reference resolution."""
        return dataclasses.replace(self.info, min_pixels=VIDEO_MIN_PIXELS, max_pixels=VIDEO_MAX_PIXELS)
