"""The event-loop lag probe (realtime.observe.loop_lag) and a WebRTC call's input delay
(realtime.transports.input_delay)."""

from __future__ import annotations

import asyncio
import time

import pytest

from realtime.observe.loop_lag import LoopLagProbe
from realtime.transports.input_delay import RTP_TIMESTAMP_MODULUS, InputDelayMeter


def test_probe_sees_a_blocked_loop():
    async def run() -> tuple[list[float], object]:
        seen: list[float] = []
        probe = LoopLagProbe(0.01, on_lag=seen.append)
        probe.start()
        await asyncio.sleep(0.05)
        time.sleep(0.2)  # a callback that holds the loop: the probe's next wake-up is about that late
        await asyncio.sleep(0.05)
        await probe.stop()
        return seen, probe.summary()

    seen, summary = asyncio.run(run())
    assert summary.samples == len(seen) >= 3
    # it woke at most one interval before the block began, so it was late by at least the block minus one interval
    assert summary.max_ms >= 190 - 10
    assert all(lag >= 0 for lag in seen)
    assert summary.p50_ms < summary.max_ms  # the other wake-ups were on time, or nearly


def test_probe_summary_keeps_the_latest_samples_and_resets():
    probe = LoopLagProbe(0.05, max_samples=3)
    assert probe.summary().samples == 0
    for lag in (1.0, 0.001, 0.002, -0.001):  # a negative lag (clock rounding) counts as 0
        probe.record(lag)
    summary = probe.summary()
    assert summary.samples == 3 and summary.max_ms == pytest.approx(2.0)  # the 1 s lag was dropped first
    probe.reset()
    assert probe.summary().samples == 0


def test_probe_rejects_a_nonpositive_interval():
    with pytest.raises(ValueError, match="interval_s"):
        LoopLagProbe(0)


def test_probe_stop_without_start_and_twice_is_harmless():
    async def run() -> None:
        probe = LoopLagProbe(0.01)
        await probe.stop()
        probe.start()
        probe.start()  # one task only
        await asyncio.sleep(0.03)
        await probe.stop()
        await probe.stop()

    asyncio.run(run())


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_input_delay_is_arrival_beyond_the_stream_clock():
    clock, seen = Clock(), []
    meter = InputDelayMeter(seen.append, clock)
    meter.frame(5000, 48_000)  # the reference frame: nothing reported
    assert seen == [] and meter.last_s is None
    clock.now += 0.020
    meter.frame(5960, 48_000)  # on time
    clock.now += 0.050
    meter.frame(6920, 48_000)  # 20 ms of stream after 50 ms of wall clock: 30 ms behind
    meter.frame(None, 48_000)  # no pts: skipped
    assert seen == pytest.approx([0.0, 0.030])
    assert meter.last_s == pytest.approx(0.030)


def test_input_delay_unwraps_rtp_timestamps_and_counts_a_step_back_as_negative():
    clock, seen = Clock(), []
    meter = InputDelayMeter(seen.append, clock)
    meter.frame(RTP_TIMESTAMP_MODULUS - 480, 48_000)
    clock.now += 0.020
    meter.frame(480, 48_000)  # wrapped: 960 samples later
    meter.frame(0, 48_000)  # a reordered frame, 480 samples back
    assert seen == pytest.approx([0.0, 0.010])
