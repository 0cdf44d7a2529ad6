"""The video budget of a conversation's history (pipeline/video/budget.py) and its stage-config settings."""

from __future__ import annotations

import pytest

from pipeline.api import VisionInfo
from pipeline.config import DEFAULT_STAGE_CONFIG, ConfigError, load_stage_config
from pipeline.video.budget import VideoBudget, video_tokens_per_second

INFO = VisionInfo(fps=2.0, min_pixels=3136, max_pixels=12845056, patch_size=14, merge_size=2, temporal_patch_size=2)


def test_token_rate_at_the_model_rate():
    assert video_tokens_per_second(INFO, 448, 448, 2.0) == 256  # 16 x 16 merged patches per frame pair, 1 pair/s
    assert video_tokens_per_second(INFO, 224, 224, 2.0) == 64
    assert video_tokens_per_second(INFO, 448, 448, 1.0) == 128


def test_removal_goes_down_to_the_retention_ratio_oldest_first():
    budget = VideoBudget(history_seconds=20, retention_ratio=0.5)
    assert budget.videos_to_remove([]) == 0
    assert budget.videos_to_remove([8.0, 6.0, 6.0]) == 0  # exactly the budget
    assert budget.videos_to_remove([8.0, 6.0, 6.0, 1.0]) == 2  # 21 s -> 7 s (at most 10)
    assert budget.videos_to_remove([30.0]) == 1
    assert VideoBudget(history_seconds=20, retention_ratio=1.0).videos_to_remove([8.0, 6.0, 6.0, 1.0]) == 1
    assert VideoBudget(history_seconds=None, retention_ratio=0.5).videos_to_remove([1e6]) == 0


def test_stage_config_settings(tmp_path):
    thinker = load_stage_config().thinker
    assert (thinker.video_history_seconds, thinker.video_retention_ratio, thinker.video_frame_grace_seconds) == (
        20,
        0.5,
        2,
    )
    bad = tmp_path / "bad.yaml"
    bad.write_text(f"extends: {DEFAULT_STAGE_CONFIG}\nstages:\n  thinker:\n    video_retention_ratio: 1.5\n")
    with pytest.raises(ConfigError, match="video_retention_ratio"):
        load_stage_config(bad)
