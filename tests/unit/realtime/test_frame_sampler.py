"""The camera's frame sampler keeps the configured rate from cameras of any faster rate."""

from __future__ import annotations

import pytest

from realtime.media.video import FrameSampler


@pytest.mark.parametrize("camera_fps", [5, 10, 15, 24, 30, 60])
def test_a_faster_camera_is_sampled_at_the_configured_rate(camera_fps):
    sampler = FrameSampler(2.0)
    kept = sum(sampler.take(i / camera_fps) for i in range(10 * camera_fps))  # ten seconds of frames
    assert kept in (20, 21)  # 2 a second; the 21st is the one at the end of the last period


def test_jittered_timestamps_keep_the_rate():
    sampler = FrameSampler(2.0)
    times = [i / 30 + (0.01 if i % 3 else -0.01) for i in range(300)]
    assert sum(sampler.take(t) for t in times) in (20, 21)


def test_after_a_stall_the_next_frame_is_kept_and_the_rate_resumes():
    sampler = FrameSampler(2.0)
    assert sampler.take(0.0)
    assert not sampler.take(0.2)
    assert sampler.take(5.0)  # the camera stalled for seconds
    assert not sampler.take(5.3)
    assert sampler.take(5.5)
