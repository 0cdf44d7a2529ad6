"""Pictures to Qwen2.5-Omni's vision tower (a Qwen2.5-VL ViT, patch 14): the checkpoint's image processor settings
and the preprocessing of frames (:mod:`pipeline.models.common.vision_patches`), at Qwen2.5-Omni's video rate."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from pipeline.models.common.vision_patches import PatchPreprocessor, VisionInput

__all__ = ["VIDEO_FPS", "VisionInput", "Qwen25OmniVisionPreprocessor"]

VIDEO_FPS = 2.0
"""Frames per second of video the model was trained on. Checkpoints store no rate; the reference processor samples
video at 2 fps, so one temporal patch of 2 frames covers one second (``video_second_per_grid``)."""


@dataclass(frozen=True)
class Qwen25OmniVisionPreprocessor(PatchPreprocessor):
    """Qwen2.5-Omni's image processor settings (:meth:`from_preprocessor_config`); call it on frames."""

    video_fps: ClassVar[float] = VIDEO_FPS
