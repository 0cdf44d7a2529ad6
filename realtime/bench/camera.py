"""A simulated user's camera (``bench --camera``): a moving test picture, cheap to send.

Over WebRTC the user's peer sends :class:`realtime.bench.camera_track.CameraTrack` beside its microphone: ``fps``
frames a second of ``width`` x ``height`` pixels, a bright bar moving over a colour gradient. The frames are drawn
once (:func:`pattern_frames`, :attr:`CameraOptions.distinct_frames` of them, cycled) and kept in the encoder's own
pixel format (yuv420p), so a frame costs the sender only its VP8 encoding; the server samples the track at its own
rate (2 frames a second by default) and downscales what it keeps. This module needs no media library (the WebSocket
bench runs without aiortc).

Over WebSocket there is no video track: at the start of each turn's speech the user sends one picture of the same
pattern as an ``input_image`` item (:func:`picture_item`: a user message holding a JPEG data URI, ``detail: low``),
as a browser client sends a camera still; the picture is first shrunk to the server's camera pixel budget
(:data:`realtime.media.video_settings.DEFAULT_CAMERA`), so it costs the model the positions of one WebRTC frame pair.

What the server made of the WebRTC frames is read from its ``/metrics`` (:func:`scrape_camera_frames`: received
frames by outcome, delivered to a spoken message or skipped by its sampling rate, ...).
"""

from __future__ import annotations

import asyncio
import base64
import io
import math
import urllib.request
from dataclasses import dataclass

import numpy as np
from PIL import Image
from prometheus_client.parser import text_string_to_metric_families

from realtime.bench.throughput import metrics_url
from realtime.media.video_settings import DEFAULT_CAMERA
from realtime.protocol.names import ClientEventType

PICTURE_QUALITY = 80
"""JPEG quality of the WebSocket pictures."""
PICTURE_DETAIL = "low"
"""``input_image.detail`` of the WebSocket pictures."""
PICTURE_GRID = 28
"""Pixels per side of one vision position of Qwen2.5-Omni (patch 14 x merge 2): the pictures' sides are multiples."""


@dataclass(frozen=True)
class CameraOptions:
    """The simulated camera: frame size in pixels (even, for yuv420p), frames a second, and how many distinct
    frames are drawn and cycled."""

    width: int = 640
    height: int = 480
    fps: float = 15.0
    distinct_frames: int = 8

    def __post_init__(self) -> None:
        if self.width < 16 or self.height < 16 or self.width % 2 or self.height % 2:
            raise ValueError(f"camera size must be even and at least 16x16, got {self.width}x{self.height}")
        if not self.fps > 0:
            raise ValueError(f"camera fps must be positive, got {self.fps}")
        if self.distinct_frames < 1:
            raise ValueError(f"camera distinct_frames must be >= 1, got {self.distinct_frames}")

    def describe(self) -> str:
        return f"{self.width}x{self.height} at {self.fps:g} fps"


def pattern_frames(options: CameraOptions) -> list[np.ndarray]:
    """The pattern's distinct frames, uint8 RGB ``(height, width, 3)``: a horizontal red gradient, a vertical green
    one, and a white bar a tenth of the width wide at ``k / distinct_frames`` of the way across in frame *k*."""
    w, h = options.width, options.height
    base = np.zeros((h, w, 3), np.uint8)
    base[..., 0] = np.linspace(0, 255, w, dtype=np.uint8)[None, :]
    base[..., 1] = np.linspace(0, 255, h, dtype=np.uint8)[:, None]
    base[..., 2] = 96
    bar = max(1, w // 10)
    frames = []
    for k in range(options.distinct_frames):
        frame = base.copy()
        x = k * (w - bar) // max(1, options.distinct_frames - 1) if options.distinct_frames > 1 else 0
        frame[:, x : x + bar] = 255
        frames.append(frame)
    return frames


class CameraPictures:
    """The WebSocket user's pictures: the pattern's frames as JPEG data URIs (encoded once), shrunk to at most
    ``max_pixels`` pixels; :meth:`next_item` cycles through them."""

    def __init__(self, options: CameraOptions, *, max_pixels: int = DEFAULT_CAMERA.max_pixels) -> None:
        self._uris = [jpeg_data_uri(_shrink(rgb, max_pixels)) for rgb in pattern_frames(options)]
        self.sent = 0

    def next_item(self) -> dict:
        """The next ``conversation.item.create`` event."""
        uri = self._uris[self.sent % len(self._uris)]
        self.sent += 1
        return picture_item(uri)


def jpeg_data_uri(rgb: np.ndarray, quality: int = PICTURE_QUALITY) -> str:
    """``data:image/jpeg;base64,…`` of a uint8 RGB picture."""
    buffer = io.BytesIO()
    Image.fromarray(rgb).save(buffer, format="JPEG", quality=quality)
    return "data:image/jpeg;base64," + base64.b64encode(buffer.getvalue()).decode("ascii")


def picture_item(data_uri: str, detail: str = PICTURE_DETAIL) -> dict:
    """A ``conversation.item.create`` event: a user message holding one ``input_image`` part."""
    return {
        "type": ClientEventType.CONVERSATION_ITEM_CREATE.value,
        "item": {
            "type": "message",
            "role": "user",
            "content": [{"type": "input_image", "image_url": data_uri, "detail": detail}],
        },
    }


def _shrink(rgb: np.ndarray, max_pixels: int, grid: int = PICTURE_GRID) -> np.ndarray:
    """``rgb`` scaled down to at most ``max_pixels`` pixels, each side a multiple of ``grid`` (the server's own rule
    for a camera frame, so it keeps the picture as sent)."""
    h, w = rgb.shape[:2]
    if h * w <= max_pixels:
        return rgb
    scale = math.sqrt(h * w / max_pixels)
    size = (max(grid, math.floor(w / scale / grid) * grid), max(grid, math.floor(h / scale / grid) * grid))
    return np.asarray(Image.fromarray(rgb).resize(size, Image.Resampling.BILINEAR))


# --- what the server made of it --------------------------------------------------------------------------------------

CAMERA_FRAMES_METRIC = "omni_realtime_camera_frames_total"
"""The server's count of received WebRTC camera frames, labelled by ``outcome`` (:mod:`realtime.observe.metrics`)."""


def camera_frames_from_metrics(text: str) -> dict[str, int] | None:
    """Camera frames by outcome in a Prometheus text exposition; None when the server does not export them."""
    found = {
        sample.labels["outcome"]: round(sample.value)
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == CAMERA_FRAMES_METRIC and "outcome" in sample.labels
    }
    return found or None


async def scrape_camera_frames(url: str, *, timeout_s: float = 10.0) -> dict[str, int] | None:
    """The camera frame counts of the server at ``url`` from its ``/metrics``; None when the scrape fails or it does
    not export them (the report says "not measured", the bench goes on)."""

    def get() -> str:
        with urllib.request.urlopen(metrics_url(url), timeout=timeout_s) as response:  # noqa: S310 - the bench's server
            return response.read().decode("utf-8")

    try:
        text = await asyncio.to_thread(get)
    except (OSError, ValueError):
        return None
    return camera_frames_from_metrics(text)
