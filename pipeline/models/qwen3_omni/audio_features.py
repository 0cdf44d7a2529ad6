"""Incremental log-mel features of one spoken message for Qwen3-Omni's audio encoder.

The computation is the shared :class:`~pipeline.models.common.log_mel.IncrementalLogMel` with two settings of this
family: the checkpoint's processor pads a message to itself (``padding=True, truncation=False``: the ``"longest"``
convention, no zero padding to 30 s, so the global floor covers the message's own frames only), and its blocks are
the encoder's attention windows (:attr:`~pipeline.models.qwen3_omni.audio_encoder.EncoderWindows.block_frames`, 800
frames = 8 s in the released config), the unit the encoder can encode before the message ends.
"""

from __future__ import annotations

from typing import Any, Final

from pipeline.errors import CheckpointError
from pipeline.models.common.log_mel import IncrementalLogMel
from pipeline.models.qwen3_omni.audio_encoder import EncoderWindows

__all__ = ["PROCESSOR_PADDING", "incremental_log_mel"]

PROCESSOR_PADDING: Final = "longest"
"""``Qwen3OmniMoeProcessor`` extracts audio features with ``padding=True`` (longest) and ``truncation=False``."""


def incremental_log_mel(feature_extractor: Any, audio_config: Any) -> IncrementalLogMel:
    """The features of one message as the checkpoint's ``WhisperFeatureExtractor`` (``feature_extractor``) computes
    them over the whole message, in blocks of one attention window of the encoder ``audio_config`` describes. Raises
    :class:`CheckpointError` when the extractor's mel bins are not the encoder's."""
    if int(feature_extractor.feature_size) != int(audio_config.num_mel_bins):
        raise CheckpointError(
            f"the feature extractor makes {feature_extractor.feature_size} mel bins, the audio encoder takes "
            f"{audio_config.num_mel_bins}",
            param="preprocessor_config.feature_size",
        )
    windows = EncoderWindows.of(audio_config)
    return IncrementalLogMel(feature_extractor, block_frames=windows.block_frames, padding=PROCESSOR_PADDING)
