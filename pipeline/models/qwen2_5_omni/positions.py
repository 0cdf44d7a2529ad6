"""Qwen2.5-Omni's TMRoPE positions as the engine consumes them: the span arithmetic both families share
(:mod:`pipeline.models.common.rope_spans`). Its audio-in-video layout is
:mod:`pipeline.models.qwen2_5_omni.av_interleave`.
"""

from __future__ import annotations

from pipeline.models.common.rope_spans import GridSpan, rope_positions, rope_shift, vision_offsets

__all__ = ["GridSpan", "rope_positions", "rope_shift", "vision_offsets"]
