"""The simulated camera as an aiortc video track (``bench --camera`` over WebRTC; :mod:`realtime.bench.camera`).

Timestamps: frame *k* has RTP time ``k / fps`` seconds (90 kHz clock) and leaves at ``t0 + k / fps`` on the event
loop's clock, ``t0`` the first frame's request (absolute deadlines: a late frame is sent at once, the next ones keep
the schedule). The frames are the pattern of :func:`realtime.bench.camera.pattern_frames`, converted to yuv420p once.
"""

from __future__ import annotations

import asyncio
import fractions
from collections.abc import Awaitable, Callable

import av
from aiortc.mediastreams import MediaStreamError, VideoStreamTrack

from realtime.bench.camera import CameraOptions, pattern_frames

VIDEO_CLOCK_RATE = 90_000
"""RTP clock of video (Hz)."""
VIDEO_TIME_BASE = fractions.Fraction(1, VIDEO_CLOCK_RATE)


class CameraTrack(VideoStreamTrack):
    """The camera as an aiortc video track (module docstring). ``clock`` and ``sleep``: the event loop's, unless a
    test gives its own."""

    def __init__(
        self,
        options: CameraOptions,
        *,
        clock: Callable[[], float] | None = None,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        super().__init__()
        self.options = options
        self._planes = [
            av.VideoFrame.from_ndarray(rgb, format="rgb24").reformat(format="yuv420p").to_ndarray()
            for rgb in pattern_frames(options)
        ]
        self._clock = clock
        self._sleep = sleep
        self._t0: float | None = None
        self.sent = 0
        """Frames handed to the sender so far."""

    async def recv(self) -> av.VideoFrame:
        if self.readyState != "live":
            raise MediaStreamError
        clock = self._clock or asyncio.get_running_loop().time
        k = self.sent
        if self._t0 is None:
            self._t0 = clock()
        else:
            delay = self._t0 + k / self.options.fps - clock()
            if delay > 0:
                await self._sleep(delay)
        frame = av.VideoFrame.from_ndarray(self._planes[k % len(self._planes)], format="yuv420p")
        frame.pts = round(k * VIDEO_CLOCK_RATE / self.options.fps)
        frame.time_base = VIDEO_TIME_BASE
        self.sent += 1
        return frame
