"""A WebRTC call's camera: sampled frames handed to the spoken message the user is recording.

aiortc decodes the browser's VP8/H.264 track in its own thread; :class:`CameraFeed` reads the decoded frames, keeps
at most :attr:`CameraSettings.fps` of them a second (by the frames' own timestamps; the others are let go without
being converted), converts a kept one to uint8 RGB already downscaled to the pixel budget (libswscale, in a worker
thread) and hands it to the open spoken message with ``AudioInputHandle.add_video_frame(frame, t)``.

Timing: ``t`` is seconds from the message's first audio sample to the frame. Both are placed on the server's
monotonic clock: a frame at its arrival, smoothed by its RTP timestamp (:class:`FrameClock`); the message's first
sample from when the microphone audio around it reached the session (:class:`OpenMessage.started_at`). ``t`` never
decreases within a message and is at least 0.

Frames while no message is open (the assistant speaking, the user silent): the latest sampled frame is kept and
becomes the next message's first frame (``t`` 0, or its time if it arrived after the message began), so a question
asked right after the camera turned to something sees it; each frame it replaces is dropped and counted
(``idle``). Frames that cannot be converted (zero-sized, corrupt) or that the engine refuses are dropped and
counted (``invalid``); the call carries on. Every frame is counted once under :data:`CAMERA_OUTCOMES`.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Protocol

import av
import numpy as np
from aiortc.mediastreams import MediaStreamError, MediaStreamTrack

from pipeline.api import VisionInfo
from pipeline.errors import PipelineError
from realtime.media.video_settings import CAMERA_OUTCOMES, CameraSettings
from realtime.runner import OpenMessage

logger = logging.getLogger(__name__)

RESYNC_S = 1.0
"""A frame whose RTP time strays this far from its arrival time re-anchors :class:`FrameClock` (the camera was
turned off and on, or the sender restarted its timestamps)."""


class Messages(Protocol):
    """Where frames go (the session runner): the open spoken message, or None."""

    def open_message(self) -> OpenMessage | None: ...


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
    """Feeds one camera track to ``messages`` (see the module docstring). ``count(outcome)`` is called once per
    received frame (:data:`CAMERA_OUTCOMES`). ``vision`` None: frames are read and counted (``no_vision``), never
    converted."""

    def __init__(
        self,
        messages: Messages,
        vision: VisionInfo | None,
        settings: CameraSettings,
        *,
        count: Callable[[str], None] = lambda outcome: None,
        clock: Callable[[], float] = time.monotonic,
        label: str = "camera",
    ) -> None:
        self._messages = messages
        self._vision = vision
        self._settings = settings
        self._count = count
        self._clock = clock
        self._label = label
        self._frame_clock = FrameClock()
        fps = settings.fps or (vision.fps if vision is not None else 1.0)
        self._sampler = FrameSampler(fps)
        self._held: tuple[av.VideoFrame, float] | None = None  # the latest sampled frame while no message is open
        self._item_id: str | None = None  # the message the last frame went to
        self._last_t = 0.0
        self.counts = dict.fromkeys(CAMERA_OUTCOMES, 0)

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
        """One received frame, at ``arrival`` on the monotonic clock."""
        if self._vision is None:
            return self._outcome("no_vision")
        rtp_s = float(frame.pts * frame.time_base) if frame.pts is not None and frame.time_base else None
        at = self._frame_clock.time(rtp_s, arrival)
        if not self._sampler.take(at):
            return self._outcome("skipped")
        message = self._messages.open_message()
        if message is None:
            if self._held is not None:
                self._outcome("idle")
            self._held = (frame, at)
            self._item_id = None
            return
        if message.item_id != self._item_id:  # a new message: the frame held meanwhile goes first
            self._item_id, self._last_t = message.item_id, 0.0
            held, self._held = self._held, None
            if held is not None:
                await self._deliver(message, *held)
        await self._deliver(message, frame, at)

    async def _deliver(self, message: OpenMessage, frame: av.VideoFrame, at: float) -> None:
        try:
            pixels = await asyncio.to_thread(self._convert, frame)
        except (ValueError, av.FFmpegError) as exc:
            logger.info("%s: dropping an unusable frame: %s", self._label, exc)
            return self._outcome("invalid")
        if self._messages.open_message() != message:  # committed while converting: it starts the next message
            if self._held is not None:
                self._outcome("idle")
            self._held = (frame, at)
            self._item_id = None
            return
        t = max(self._last_t, at - message.started_at, 0.0)
        try:
            message.handle.add_video_frame(pixels, t)
        except PipelineError as exc:
            logger.info("%s: the engine refused a frame: %s", self._label, exc)
            return self._outcome("invalid")
        self._last_t = t
        self._outcome("delivered")

    def _convert(self, frame: av.VideoFrame) -> np.ndarray:
        """The frame as uint8 RGB at the budget's size (libswscale); ValueError for a frame with no pixels."""
        if frame.width < 1 or frame.height < 1:
            raise ValueError(f"the frame is {frame.width}x{frame.height}")
        assert self._vision is not None
        height, width = self._settings.frame_size(self._vision, frame.height, frame.width)
        pixels = frame.to_ndarray(width=width, height=height, format="rgb24")
        if pixels.shape != (height, width, 3):
            raise ValueError(f"the frame converted to {pixels.shape}, not ({height}, {width}, 3)")
        return pixels

    def _outcome(self, outcome: str) -> None:
        self.counts[outcome] += 1
        self._count(outcome)
