"""A call's sampled camera frames into the user's spoken messages: the session's side of the camera.

:class:`MessageFrames` takes each frame :class:`realtime.media.video.CameraFeed` kept (uint8 RGB at the sampled size,
and its time ``at`` on the ``time.monotonic`` clock), wherever that feed ran (the server's process, or a media
worker), and hands it to the open spoken message with ``AudioInputHandle.add_video_frame(frame, t)``.

Timing: ``t`` is seconds from the message's first audio sample (:attr:`OpenMessage.started_at`, when the microphone
audio around it reached the session) to the frame; ``t`` never decreases within a message and is at least 0.

Frames while no message is open (the assistant speaking, the user silent): the latest frame is kept and becomes the
next message's first frame (``t`` 0, or its time if it arrived after the message began), so a question asked right
after the camera turned to something sees it; each frame it replaces is dropped and counted (``idle``). A frame the
engine refuses is dropped and counted (``invalid``); the call carries on. Each frame taken is counted once
(``delivered``, ``idle`` or ``invalid``, :data:`~realtime.media.video_settings.CAMERA_OUTCOMES`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Protocol

import numpy as np

from pipeline.errors import PipelineError
from realtime.runner import OpenMessage

logger = logging.getLogger(__name__)


class Messages(Protocol):
    """Where frames go (the session runner): the open spoken message, or None."""

    def open_message(self) -> OpenMessage | None: ...


class MessageFrames:
    """Hands one call's kept camera frames to ``messages`` (module docstring); ``count(outcome)`` once per frame.
    Runs on the event loop; :meth:`offer` does not wait."""

    def __init__(self, messages: Messages, *, count: Callable[[str], None], label: str = "camera") -> None:
        self._messages = messages
        self._count = count
        self._label = label
        self._held: tuple[np.ndarray, float] | None = None  # the latest frame while no message is open
        self._item_id: str | None = None  # the message the last frame went to
        self._last_t = 0.0

    def offer(self, pixels: np.ndarray, at: float) -> None:
        """A kept frame, uint8 RGB ``(height, width, 3)``, at ``at`` seconds on the monotonic clock."""
        message = self._messages.open_message()
        if message is None:
            if self._held is not None:
                self._count("idle")
            self._held = (pixels, at)
            self._item_id = None
            return
        if message.item_id != self._item_id:  # a new message: the frame held meanwhile goes first
            self._item_id, self._last_t = message.item_id, 0.0
            held, self._held = self._held, None
            if held is not None:
                self._deliver(message, *held)
        self._deliver(message, pixels, at)

    def _deliver(self, message: OpenMessage, pixels: np.ndarray, at: float) -> None:
        t = max(self._last_t, at - message.started_at, 0.0)
        try:
            message.handle.add_video_frame(pixels, t)
        except PipelineError as exc:
            logger.info("%s: the engine refused a frame: %s", self._label, exc)
            return self._count("invalid")
        self._last_t = t
        self._count("delivered")
