"""Pictures to the input of a Qwen-VL style vision tower: the image processor settings of a checkpoint and the
preprocessing of frames (transformers' ``Qwen2VLImageProcessor`` algorithm, which Qwen2.5-Omni and Qwen3-Omni share
with other constants: patch size, normalisation, pixel budget).

A picture (or a run of video frames) is uint8 RGB ``(H, W, 3)``. :meth:`PatchPreprocessor.__call__` resizes every
frame to :meth:`pipeline.api.VisionInfo.resized` of the first frame's size (bicubic, PIL's filter, as the reference
image processor's PIL path), rescales by the checkpoint's ``rescale_factor`` (1/255), normalises with its
``image_mean`` / ``image_std``, pads the frame count to a multiple of ``temporal_patch_size`` by repeating the last
frame (a single image is its frame repeated) and cuts the frames into patches in the reference order: one row per
patch of ``temporal_patch_size`` frames x ``patch_size``² pixels, grouped by ``merge_size``² neighbouring patches
(the ones the tower merges into one thinker position), each row ``(channel, frame, y, x)``-major.

A family subclasses :class:`PatchPreprocessor` to set the video frame rate its model was trained at
(:attr:`PatchPreprocessor.video_fps`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, NamedTuple, Self

import numpy as np
from PIL import Image

from pipeline.api import VisionInfo
from pipeline.errors import CheckpointError, InvalidImageError

CHANNELS = 3
"""RGB."""

PREPROCESSOR_FIELDS = ("min_pixels", "max_pixels", "patch_size", "merge_size", "temporal_patch_size")
"""Integer fields of the image processor settings in ``preprocessor_config.json`` (beside ``image_mean`` /
``image_std`` and the optional ``rescale_factor``)."""


class VisionInput(NamedTuple):
    """One picture or video clip, ready for the vision tower."""

    pixel_values: np.ndarray
    """float32 ``(t * h * w, channels * temporal_patch_size * patch_size**2)``: one row per patch."""
    grid_thw: tuple[int, int, int]
    """Patches along time (frame pairs), height and width."""


@dataclass(frozen=True)
class PatchPreprocessor:
    """The checkpoint's image processor settings (:meth:`from_preprocessor_config`); call it on frames. Thread-safe
    (immutable; every call works on its own arrays)."""

    video_fps: ClassVar[float]
    """Frames per second of video the family's model was trained on (:attr:`VisionInfo.fps`); checkpoints store no
    rate, so each family's subclass sets it."""

    info: VisionInfo
    image_mean: tuple[float, float, float]
    image_std: tuple[float, float, float]
    rescale_factor: float = 1 / 255

    @classmethod
    def from_preprocessor_config(cls, raw: Mapping[str, Any], vision_config: Any) -> Self | None:
        """The settings in a ``preprocessor_config.json`` payload, checked against the tower's ``vision_config``;
        None when it holds no image processor settings (a checkpoint that takes no pictures). ``min_pixels`` /
        ``max_pixels`` may also be written as ``size.shortest_edge`` / ``size.longest_edge`` (transformers' newer
        spelling). Raises :class:`CheckpointError` naming a missing, malformed or inconsistent field."""
        given = raw.get("size")
        size = given if isinstance(given, Mapping) else {}
        values = {
            "min_pixels": raw.get("min_pixels", size.get("shortest_edge")),
            "max_pixels": raw.get("max_pixels", size.get("longest_edge")),
            **{name: raw.get(name) for name in PREPROCESSOR_FIELDS[2:]},
        }
        present = [name for name, value in values.items() if value is not None]
        if not present and "image_mean" not in raw:
            return None
        for name, value in values.items():
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise CheckpointError(
                    f"preprocessor_config.json: image processor field {name} is missing or not a positive integer",
                    param=name,
                )
        for name, tower_name in (
            ("patch_size", "patch_size"),
            ("merge_size", "spatial_merge_size"),
            ("temporal_patch_size", "temporal_patch_size"),
        ):
            if values[name] != getattr(vision_config, tower_name):
                raise CheckpointError(
                    f"preprocessor_config.json: {name} {values[name]} != vision_config.{tower_name} "
                    f"{getattr(vision_config, tower_name)}",
                    param=name,
                )
        if values["min_pixels"] > values["max_pixels"]:
            raise CheckpointError("preprocessor_config.json: min_pixels exceeds max_pixels", param="min_pixels")
        mean, std = _triple(raw, "image_mean"), _triple(raw, "image_std")
        if min(std) <= 0:
            raise CheckpointError("preprocessor_config.json: image_std must be positive", param="image_std")
        rescale = raw.get("rescale_factor", 1 / 255)
        if not isinstance(rescale, (int, float)) or not rescale > 0:
            raise CheckpointError("preprocessor_config.json: rescale_factor must be positive", param="rescale_factor")
        info = VisionInfo(fps=cls.video_fps, **values)
        return cls(info=info, image_mean=mean, image_std=std, rescale_factor=float(rescale))

    def resized(self, height: int, width: int) -> tuple[int, int]:
        """:meth:`VisionInfo.resized` of these settings."""
        return self.info.resized(height, width)

    def __call__(self, frames: Sequence[np.ndarray], *, info: VisionInfo | None = None) -> VisionInput:
        """``frames`` (one picture, or video frames in time order) as tower input; ``info`` overrides the pixel
        budget (e.g. a smaller one for camera video; its patch sizes must be these). Raises
        :class:`InvalidImageError` for no frames, a frame that is not uint8 RGB ``(H, W, 3)``, an empty one, or
        one of extreme aspect ratio (:meth:`VisionInfo.resized`)."""
        info = info or self.info
        if (info.patch_size, info.merge_size, info.temporal_patch_size) != (
            self.info.patch_size,
            self.info.merge_size,
            self.info.temporal_patch_size,
        ):
            raise ValueError("info: the patch sizes must be the checkpoint's")
        height, width = check_frames(frames, info)
        resized = [_resize(frame, height, width) for frame in frames]
        resized.extend([resized[-1]] * (-len(resized) % info.temporal_patch_size))
        levels, grid = _patchify(np.stack(resized), info)
        return VisionInput(_lookup(levels, self._table()), grid)

    def _table(self) -> np.ndarray:
        """float32 ``(256, 3)``: the normalised value of each uint8 level per channel, computed as the reference does
        (``level * rescale_factor`` in float64, rounded to float32, then ``(x - mean) / std`` in float32), so a
        lookup gives bit-identical values."""
        levels = (np.arange(256, dtype=np.float64) * self.rescale_factor).astype(np.float32)
        mean = np.asarray(self.image_mean, dtype=np.float32)
        std = np.asarray(self.image_std, dtype=np.float32)
        return (levels[:, None] - mean) / std


def _triple(raw: Mapping[str, Any], name: str) -> tuple[float, float, float]:
    value = raw.get(name)
    if not isinstance(value, (list, tuple)) or len(value) != CHANNELS or not all(_is_number(v) for v in value):
        raise CheckpointError(f"preprocessor_config.json: {name} must be {CHANNELS} numbers", param=name)
    return (float(value[0]), float(value[1]), float(value[2]))


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def check_frames(frames: Sequence[np.ndarray], info: VisionInfo) -> tuple[int, int]:
    """(height, width) in pixels :meth:`PatchPreprocessor.__call__` resizes ``frames`` to under ``info``, or the
    :class:`InvalidImageError` it raises for them (no frames, a frame that is not uint8 RGB ``(H, W, 3)``, an empty one,
    one of extreme aspect ratio), without doing the work: cheap on any thread."""
    if len(frames) == 0:
        raise InvalidImageError("no frames", param="image")
    for frame in frames:
        _check_frame(frame)
    return info.resized(frames[0].shape[0], frames[0].shape[1])


def _check_frame(frame: Any) -> None:
    if not isinstance(frame, np.ndarray) or frame.dtype != np.uint8 or frame.ndim != 3 or frame.shape[2] != CHANNELS:
        shape = getattr(frame, "shape", None)
        dtype = getattr(frame, "dtype", type(frame).__name__)
        raise InvalidImageError(f"a frame must be uint8 RGB (H, W, 3), got {dtype} {shape}", param="image")
    if frame.shape[0] == 0 or frame.shape[1] == 0:
        raise InvalidImageError(f"frame of {frame.shape[0]}x{frame.shape[1]} pixels is empty", param="image")


def _resize(frame: np.ndarray, height: int, width: int) -> np.ndarray:
    """uint8 ``(height, width, 3)``: PIL's bicubic filter (antialiased when shrinking), rounded to uint8."""
    image = Image.fromarray(np.ascontiguousarray(frame), mode="RGB")
    return np.asarray(image.resize((width, height), resample=Image.Resampling.BICUBIC))


def _patchify(frames: np.ndarray, info: VisionInfo) -> tuple[np.ndarray, tuple[int, int, int]]:
    """``frames`` uint8 ``(T, H, W, C)``, T a multiple of the temporal patch -> one row per patch, rows ordered
    (time, merged row, merged column, row in merge, column in merge), each row ``(C, frame, y, x)``."""
    count, height, width, channels = frames.shape
    tp, p, m = info.temporal_patch_size, info.patch_size, info.merge_size
    gt, gh, gw = count // tp, height // p, width // p
    patches = frames.reshape(gt, tp, gh // m, m, p, gw // m, m, p, channels)
    patches = patches.transpose(0, 2, 5, 3, 6, 8, 1, 4, 7)
    return np.ascontiguousarray(patches).reshape(gt * gh * gw, channels * tp * p * p), (gt, gh, gw)


def _lookup(levels: np.ndarray, table: np.ndarray) -> np.ndarray:
    """float32 rows of uint8 patch ``levels`` (columns channel-major): each level looked up in its channel's column of
    ``table``."""
    per_channel = levels.shape[1] // CHANNELS
    offsets = np.repeat(np.arange(CHANNELS, dtype=np.intp) * 256, per_channel)
    return np.take(table.T.ravel(), levels + offsets)
