"""Runners of the tiny Qwen2.5-Omni checkpoint for tests that drive a runner without an engine."""

from __future__ import annotations

from pipeline.models import family_of
from pipeline.runners.thinker import ThinkerRunner


def thinker_runner(ckpt, **kwargs) -> ThinkerRunner:
    """``ThinkerRunner`` of a Qwen2.5-Omni checkpoint (keyword arguments as for its constructor)."""
    return ThinkerRunner.of(family_of("qwen2_5_omni"), ckpt, **kwargs)
