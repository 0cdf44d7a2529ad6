"""How far a call's microphone audio runs behind its own stream clock, as it reaches the session.

A peer sends its microphone in real time: frame *k* carries RTP time ``pts_k`` and leaves the peer ``(pts_k -
pts_0) / rate`` seconds after the first. :class:`InputDelayMeter` takes the first frame's arrival as the reference
and reports, for each later frame, ``(arrival_k - arrival_0) - (pts_k - pts_0) / rate``: zero while frames keep
pace, the size of the backlog when something between the peer and the session (the peer's own sending, the network,
SRTP and the jitter buffer, decoding, or this server's event loop) falls behind. A peer that sends faster than
real time, or a first frame that was itself late, gives negative values (reported as they are).
"""

from __future__ import annotations

from collections.abc import Callable

RTP_TIMESTAMP_MODULUS = 1 << 32
"""RTP timestamps are 32-bit and start at a random value, so they wrap (at 48 kHz, once in about 25 hours)."""


class InputDelayMeter:
    """One call's input delay (module docstring). ``observe(seconds)`` gets one value per frame after the first;
    ``clock`` is the time the frame reached the session (seconds, monotonic). Frame times are RTP timestamps:
    they are unwrapped (:data:`RTP_TIMESTAMP_MODULUS`), a step back (a reordered frame) counts as negative."""

    def __init__(self, observe: Callable[[float], None], clock: Callable[[], float]) -> None:
        self._observe = observe
        self._clock = clock
        self._origin: float | None = None
        self._last_pts = 0
        self._position = 0
        """Samples from the first frame to the latest, unwrapped."""
        self.last_s: float | None = None
        """The latest value (None before the second frame)."""

    def frame(self, pts: int | None, sample_rate: int) -> None:
        """A frame reached the session: RTP timestamp ``pts`` in samples at ``sample_rate`` (a frame without one
        is skipped)."""
        if pts is None or sample_rate <= 0:
            return
        now = self._clock()
        if self._origin is None:
            self._origin, self._last_pts = now, pts
            return
        step = (pts - self._last_pts) % RTP_TIMESTAMP_MODULUS
        if step >= RTP_TIMESTAMP_MODULUS // 2:
            step -= RTP_TIMESTAMP_MODULUS
        self._last_pts = pts
        self._position += step
        self.last_s = (now - self._origin) - self._position / sample_rate
        self._observe(self.last_s)
