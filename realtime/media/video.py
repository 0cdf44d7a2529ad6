"""A WebRTC call's camera track: which decoded frames are kept, and their pixels.

aiortc decodes the browser's VP8/H.264 track in its own thread; :class:`CameraFeed` reads the decoded frames, keeps
at most :attr:`CameraSettings.fps` of them a second (by the frames' own timestamps; the others are let go without
being converted), converts a kept one to uint8 RGB already downscaled to the pixel budget (libswscale, in a worker
thread) and hands it on: ``kept(pixels, at)``. The feed is the same wherever the call's media run: in the server's
process ``kept`` is the session's :class:`~realtime.media.message_frames.MessageFrames`; on a media worker it sends the
frame to the server (:mod:`realtime.transports.media_workers.camera`), where the same ``MessageFrames`` takes it.
This module imports neither the session nor the engine, so a media worker loads it without torch.

Timing: ``at`` is the frame's time in seconds on the ``time.monotonic`` clock: its arrival, smoothed by its RTP
timestamp (:class:`FrameClock`). On Linux that clock is the host's ``CLOCK_MONOTONIC``, the same in every process, so
a frame timed on a media worker compares with the server's times of the spoken messages.

Outcomes decided here (:data:`~realtime.media.video_settings.CAMERA_OUTCOMES`, each frame counted once through
``count``): ``skipped`` by the sampling rate, ``no_vision`` when the model cannot see (nothing is converted), and
``invalid`` for a frame that cannot be converted (zero-sized, corrupt, or a shape the vision tower refuses). A kept
frame's fate (``delivered``, ``idle``, ``invalid`` when the engine refuses it) is counted where it is handed on.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

import av
import numpy as np
from aiortc.mediastreams import MediaStreamError, MediaStreamTrack

from pipeline.api import VisionInfo
from pipeline.errors import PipelineError
from realtime.media.video_settings import CameraSettings

logger = logging.getLogger(__name__)

RESYNC_S = 1.0
"""A frame whose RTP time strays this far from its arrival time re-anchors :class:`FrameClock` (the camera was
turned off and on, or the sender restarted its timestamps)."""

KeptFrame = Callable[[np.ndarray, float], None]
"""Where a kept frame goes: ``kept(pixels, at)``, uint8 RGB ``(height, width, 3)`` and its time (module docstring)."""


class FrameClock:
    """A frame's time on the monotonic clock: its RTP time, anchored to the arrival of the first frame (and
    re-anchored when the two drift :data:`RESYNC_S` apart), so network jitter does not move frames."""

    def __init__(self) -> None:
        self._anchor: tuple[float, float] | None = None  # (arrival, rtp seconds)

    def time(self, rtp_s: float | None, arrival: float) -> float:
        if rtp_s is None:
            return arrival
        if self._anchor is not None:
            at = self._anchor[0] + rtp_s - self._anchor[1]
            if abs(at - arrival) < RESYNC_S:
                return at
        self._anchor = (arrival, rtp_s)
        return arrival


class FrameSampler:
    """Keeps ``fps`` frames a second of frame time on average: slots ``1 / fps`` apart on a grid that starts at the
    first kept frame; the first frame at or after a slot (less a quarter period of slack, for jittered timestamps) is
    kept and the grid moves one period on, so a camera of any faster rate keeps ``fps`` frames a second. After a gap
    longer than a period (a stalled camera) the grid restarts at the next frame."""

    def __init__(self, fps: float) -> None:
        self._period = 1.0 / fps
        self._due: float | None = None

    def take(self, at: float) -> bool:
        due = self._due
        if due is None or at - due > self._period:  # the first frame, or one after a stall: the grid restarts here
            self._due = at + self._period
            return True
        if at < due - self._period * 0.25:
            return False
        self._due = due + self._period
        return True


class CameraFeed:
    """Samples one camera track and hands the kept frames to ``kept`` (see the module docstring). ``count(outcome)``
    is called once for each frame dropped here. ``vision`` None: frames are read and counted (``no_vision``), never
    converted. One feed per track; :meth:`offer` calls must not overlap (:meth:`run` awaits each)."""

    def __init__(
        self,
        vision: VisionInfo | None,
        settings: CameraSettings,
        *,
        kept: KeptFrame,
        count: Callable[[str], None] = lambda outcome: None,
        clock: Callable[[], float] = time.monotonic,
        label: str = "camera",
    ) -> None:
        self._vision = vision
        self._settings = settings
        self._kept = kept
        self._count = count
        self._clock = clock
        self._label = label
        self._frame_clock = FrameClock()
        fps = settings.fps or (vision.fps if vision is not None else 1.0)
        self._sampler = FrameSampler(fps)

    async def run(self, track: MediaStreamTrack) -> None:
        """Read ``track`` until it ends."""
        while True:
            try:
                frame = await track.recv()
            except MediaStreamError:
                return
            if not isinstance(frame, av.VideoFrame):  # aiortc types recv() for audio and video tracks alike
                raise TypeError(f"{self._label}: the camera track gave a {type(frame).__name__}, not a video frame")
            await self.offer(frame, self._clock())

    async def offer(self, frame: av.VideoFrame, arrival: float) -> None:
        """One received frame, at ``arrival`` on the monotonic clock: counted, or converted and handed on."""
        if self._vision is None:
            return self._count("no_vision")
        rtp_s = float(frame.pts * frame.time_base) if frame.pts is not None and frame.time_base else None
        at = self._frame_clock.time(rtp_s, arrival)
        if not self._sampler.take(at):
            return self._count("skipped")
        try:
            pixels = await asyncio.to_thread(self.convert, frame)
        except (ValueError, av.FFmpegError, PipelineError) as exc:
            logger.info("%s: dropping an unusable frame: %s", self._label, exc)
            return self._count("invalid")
        self._kept(pixels, at)

    def convert(self, frame: av.VideoFrame) -> np.ndarray:
        """The frame as uint8 RGB at the budget's size (libswscale); ValueError for a frame with no pixels,
        :class:`~pipeline.errors.InvalidImageError` for a shape the vision tower refuses (any thread)."""
        if frame.width < 1 or frame.height < 1:
            raise ValueError(f"the frame is {frame.width}x{frame.height}")
        assert self._vision is not None
        height, width = self._settings.frame_size(self._vision, frame.height, frame.width)
        pixels = frame.to_ndarray(width=width, height=height, format="rgb24")
        if pixels.shape != (height, width, 3):
            raise ValueError(f"the frame converted to {pixels.shape}, not ({height}, {width}, 3)")
        return pixels
