"""How a WebRTC call's camera is sampled (:mod:`realtime.media.video` does it); no media libraries here, so the
configuration and the metrics can name these without aiortc installed."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from pipeline.api import VisionInfo

CAMERA_OUTCOMES = ("delivered", "skipped", "idle", "invalid", "no_vision", "overflow")
"""What became of each received camera frame: handed to a message; ``skipped`` by the sampling rate; ``idle``:
dropped while no message was open (replaced by a later frame); ``invalid``: unconvertible or refused; ``no_vision``:
the model cannot see; ``overflow``: a media worker's frames waiting to cross to the server were over their bound, and
this one, the oldest, was dropped (:mod:`realtime.transports.media_workers.camera`)."""


@dataclass(frozen=True)
class CameraSettings:
    """How a call's camera is sampled. ``fps`` None: the model's own rate (``VisionInfo.fps``, 2 for Qwen2.5-Omni).
    ``max_pixels``: each kept frame is downscaled on the server to at most this many pixels on the engine's
    28-pixel grid; the vision tower then makes (h/28)*(w/28) thinker positions per pair of frames, so the default
    100 352 (128 x 28 x 28) is at most 128 positions a pair: a 640x480 camera becomes 364x252, 117 positions a
    second at 2 fps (audio: 25 a second)."""

    fps: float | None = None
    max_pixels: int = 128 * 28 * 28

    def __post_init__(self) -> None:
        if self.fps is not None and not self.fps > 0:
            raise ValueError(f"camera fps must be positive, got {self.fps}")
        if self.max_pixels < 1:
            raise ValueError(f"camera max_pixels must be >= 1, got {self.max_pixels}")

    def frame_size(self, vision: VisionInfo, height: int, width: int) -> tuple[int, int]:
        """(height, width) a ``height`` x ``width`` camera frame is downscaled to."""
        capped = dataclasses.replace(vision, max_pixels=min(self.max_pixels, vision.max_pixels))
        return capped.resized(height, width)


DEFAULT_CAMERA = CameraSettings()
