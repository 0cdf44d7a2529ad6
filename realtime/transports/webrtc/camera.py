"""How the calls' cameras are taken, wherever a call's media run: one :class:`CallCameras` for the endpoint, handed
to the in-process media (:mod:`.in_process`) and to the media workers' proxy (:mod:`.worker_media`)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from pipeline.api import VisionInfo
from realtime.media.video_settings import DEFAULT_CAMERA, CameraSettings

UNSUPPORTED_CODEC = "unsupported_codec"
"""Why a video track was refused in the answer: it offers no codec aiortc decodes
(:mod:`realtime.transports.video_codecs`)."""


def _uncounted(label: str) -> None:
    """A counter that counts nothing."""


@dataclass(frozen=True)
class CallCameras:
    """The calls' cameras: a video track is sampled with ``settings`` (:mod:`realtime.media.video`) for the vision
    tower ``vision`` (None: the model cannot see; frames are counted ``no_vision``); ``on_frame(outcome)`` counts each
    received frame once (:data:`~realtime.media.video_settings.CAMERA_OUTCOMES`), ``on_refused(reason)`` each video
    track refused in the answer (:data:`UNSUPPORTED_CODEC`). The counters run on the event loop."""

    settings: CameraSettings = DEFAULT_CAMERA
    vision: VisionInfo | None = None
    on_frame: Callable[[str], None] = _uncounted
    on_refused: Callable[[str], None] = _uncounted

    def frames(self, outcome: str, count: int) -> None:
        """Count ``count`` frames of ``outcome`` at once."""
        for _ in range(count):
            self.on_frame(outcome)


NO_VISION = CallCameras()
"""Cameras of a model that cannot see, counted nowhere (the default of the parts that take :class:`CallCameras`)."""
