"""The frame rules of a spoken message's video (pipeline/video/timeline.py)."""

from __future__ import annotations

import numpy as np

from pipeline.video.timeline import VideoTimeline


def _frame(v: int) -> np.ndarray:
    return np.full((2, 2, 3), v, dtype=np.uint8)


def _values(timeline, i):
    return [int(f[0, 0, 0]) for f in timeline.patch_frames(i)]


def test_frames_on_time_make_pairs_as_they_arrive():
    tl = VideoTimeline(fps=2.0, temporal_patch_size=2, grace_s=2.0)
    assert tl.final_patches(1.0, closed=False) == 0 and not tl.has_video
    for k in range(5):
        assert tl.add(_frame(k), k / 2)
    assert tl.final_patches(2.6, closed=False) == 2  # slot 4 arrived: patches 0 and 1 final, patch 2 open
    assert [_values(tl, i) for i in range(2)] == [[0, 1], [2, 3]]
    assert tl.final_patches(2.6, closed=True) == 3 and _values(tl, 2) == [4, 4]  # last pair padded by repetition


def test_missing_and_duplicate_frames():
    tl = VideoTimeline(fps=2.0, temporal_patch_size=2, grace_s=2.0)
    assert tl.add(_frame(7), 1.6)  # first frame in slot 3: slots 0..2 show it
    assert not tl.add(_frame(8), 1.9) and tl.dropped == 1  # second frame of slot 3
    assert tl.add(_frame(9), 3.0)  # slot 6; slots 4, 5 repeat slot 3
    assert tl.final_patches(3.0, closed=False) == 3
    assert [_values(tl, i) for i in range(3)] == [[7, 7], [7, 7], [7, 7]]
    assert not tl.add(_frame(1), 2.4) and tl.dropped == 2  # late: its patch is final


def test_a_stopped_camera_ends_the_video_after_the_grace():
    tl = VideoTimeline(fps=2.0, temporal_patch_size=2, grace_s=2.0)
    tl.add(_frame(1), 0.0)
    assert tl.final_patches(3.9, closed=False) == 0  # patch 1 is over since 2 s, not yet by the grace
    assert tl.final_patches(4.0, closed=False) == 1  # ended: one patch, the frame repeated
    assert _values(tl, 0) == [1, 1]
    assert not tl.add(_frame(2), 4.1) and tl.final_patches(9.0, closed=True) == 1


def test_commit_drops_frames_after_the_audio():
    tl = VideoTimeline(fps=2.0, temporal_patch_size=2, grace_s=2.0)
    for k in range(4):
        tl.add(_frame(k), k / 2)
    assert tl.final_patches(1.2, closed=True) == 2  # slot 3 (1.5 s) is after the audio's end: dropped
    assert tl.dropped == 1 and [_values(tl, i) for i in range(2)] == [[0, 1], [2, 2]]
    none = VideoTimeline(fps=2.0, temporal_patch_size=2, grace_s=2.0)
    none.add(_frame(0), 3.0)
    assert none.final_patches(2.0, closed=True) == 0 and none.dropped == 1
