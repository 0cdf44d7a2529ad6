"""Event-loop lag: how late a sleeping task wakes up, the plainest sign that one loop has too much to do.

:class:`LoopLagProbe` sleeps ``interval_s`` again and again on the loop it runs on and records, for each wake-up,
``actual - scheduled`` (seconds, never negative): near zero on an idle loop, the length of the longest blocking
callback on a busy one, and growing without bound once the loop's work per second exceeds a second. The server
exports it on ``/metrics`` (``realtime_event_loop_lag_seconds``); the benchmark's client processes report their own,
so a run shows which side fell behind.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

DEFAULT_INTERVAL_S = 0.05
"""Time between two wake-ups of the probe (seconds): cheap (20 wake-ups a second) and fine enough to see a
20 ms media frame's worth of lag."""

MAX_SAMPLES = 100_000
"""Lags kept for :meth:`LoopLagProbe.summary` (older ones are dropped first): about 80 minutes at the default
interval."""


@dataclass(frozen=True)
class LagSummary:
    """Percentiles of the recorded lags, in milliseconds."""

    samples: int
    p50_ms: float
    p99_ms: float
    max_ms: float

    def to_dict(self) -> dict:
        return {"samples": self.samples, "p50_ms": self.p50_ms, "p99_ms": self.p99_ms, "max_ms": self.max_ms}


class LoopLagProbe:
    """Measures the lag of the running event loop until :meth:`stop`.

    ``on_lag(seconds)`` (e.g. a histogram's ``observe``) gets every lag as it is measured; the last
    :data:`MAX_SAMPLES` are also kept for :meth:`summary`. :meth:`start` must be called on the loop to measure;
    :meth:`stop` cancels the probe's task and waits for it."""

    def __init__(
        self,
        interval_s: float = DEFAULT_INTERVAL_S,
        *,
        on_lag: Callable[[float], None] | None = None,
        max_samples: int = MAX_SAMPLES,
    ) -> None:
        if interval_s <= 0:
            raise ValueError(f"interval_s must be positive, got {interval_s}")
        self.interval_s = interval_s
        self._on_lag = on_lag
        self._lags: list[float] = []
        self._max_samples = max_samples
        self._task: asyncio.Task | None = None

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run(), name="event loop lag probe")

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    def record(self, lag_s: float) -> None:
        """One measured lag (seconds; negative values, a clock's rounding, count as 0)."""
        lag_s = max(0.0, lag_s)
        self._lags.append(lag_s)
        if len(self._lags) > self._max_samples:
            del self._lags[: len(self._lags) - self._max_samples]
        if self._on_lag is not None:
            self._on_lag(lag_s)

    def reset(self) -> None:
        """Forget the recorded lags (the next :meth:`summary` covers only what follows)."""
        self._lags.clear()

    def summary(self) -> LagSummary:
        if not self._lags:
            return LagSummary(0, 0.0, 0.0, 0.0)
        lags = np.asarray(self._lags) * 1000.0
        p50, p99 = np.percentile(lags, [50, 99])
        return LagSummary(len(lags), round(float(p50), 2), round(float(p99), 2), round(float(lags.max()), 2))

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            due = loop.time() + self.interval_s
            await asyncio.sleep(self.interval_s)
            self.record(loop.time() - due)
