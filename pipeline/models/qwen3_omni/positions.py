"""Qwen3-Omni's TMRoPE positions as the engine consumes them.

The span arithmetic is the one both families share (:mod:`pipeline.models.common.tmrope`, re-exported here): text and
audio advance one position on the three axes; a picture's tokens are a :class:`GridSpan` of :func:`vision_offsets` (an
image: ``t_step`` irrelevant, one temporal patch; a video: ``t_step`` =
:attr:`~pipeline.models.qwen3_omni.av_interleave.Qwen3OmniAVTiming.patch_step`), its closing marker and the text after
it at the span's largest position + 1. A spoken message with video is one span from its ``<|vision_bos|>`` on, laid out
by :mod:`pipeline.models.qwen3_omni.av_interleave` (its opening markers take two positions here, one in Qwen2.5-Omni).
An audio message's token count is :meth:`~pipeline.models.qwen3_omni.audio_encoder.EncoderWindows.tokens` of its mel
frames. Together these equal the thinker's ``get_rope_index`` (tests/unit/models/test_qwen3_positions.py).
"""

from __future__ import annotations

from pipeline.models.common.tmrope import rope_positions, rope_shift, vision_offsets
from pipeline.models.positions import GridSpan

__all__ = ["GridSpan", "rope_positions", "rope_shift", "vision_offsets"]
