"""Where a Qwen-Omni thinker's sub-modules live, across transformers 5.x releases (both families lay them out alike).

transformers 5.17 keeps ``thinker.model`` = the text model and ``thinker.audio_tower`` beside it;
later 5.x releases wrap them as ``thinker.model.language_model`` / ``thinker.model.audio_tower``.
The checkpoint's weight names are the same in both (``thinker.model.layers.*``,
``thinker.audio_tower.*``); only the Python attributes moved.
"""

from __future__ import annotations

from torch import nn


def thinker_text_model(thinker) -> nn.Module:
    inner = thinker.model
    return getattr(inner, "language_model", inner)


def thinker_audio_tower(thinker) -> nn.Module:
    tower = getattr(thinker, "audio_tower", None)
    return tower if tower is not None else thinker.model.audio_tower


def thinker_vision_tower(thinker) -> nn.Module:
    tower = getattr(thinker, "visual", None)
    return tower if tower is not None else thinker.model.visual
