"""Where a Qwen-Omni thinker's sub-modules live, across transformers 5.x releases (both families lay them out alike).

transformers 5.17 keeps ``thinker.model`` = the text model and ``thinker.audio_tower`` beside it;
later 5.x releases wrap them as ``thinker.model.language_model`` / ``thinker.model.audio_tower``.
The checkpoint's weight names are the same in both (``thinker.model.layers.*``,
``thinker.audio_tower.*``); only the Python attributes moved.
"""

from __future__ import annotations

from typing import TypeVar, overload

from torch import nn

M = TypeVar("M", bound=nn.Module)


def _child(module: nn.Module, name: str) -> nn.Module | None:
    return dict(module.named_children()).get(name)


def _part(thinker: nn.Module, name: str, kind: type[M]) -> M:
    """``thinker.<name>``, else ``thinker.model.<name>``; TypeError unless it is a ``kind``."""
    part = _child(thinker, name)
    inner = _child(thinker, "model")
    if part is None and inner is not None:
        part = _child(inner, name)
    if not isinstance(part, kind):
        raise TypeError(f"the thinker's {name} is a {type(part).__name__}, not a {kind.__name__}")
    return part


@overload
def thinker_text_model(thinker: nn.Module) -> nn.Module: ...
@overload
def thinker_text_model(thinker: nn.Module, kind: type[M]) -> M: ...
def thinker_text_model(thinker: nn.Module, kind: type[nn.Module] = nn.Module) -> nn.Module:
    """The thinker's decoder stack; TypeError unless it is a ``kind`` (the family's transformers class)."""
    inner = _child(thinker, "model")
    language = None if inner is None else _child(inner, "language_model")
    text = language if language is not None else inner
    if not isinstance(text, kind):
        raise TypeError(f"the thinker's text model is a {type(text).__name__}, not a {kind.__name__}")
    return text


@overload
def thinker_audio_tower(thinker: nn.Module) -> nn.Module: ...
@overload
def thinker_audio_tower(thinker: nn.Module, kind: type[M]) -> M: ...
def thinker_audio_tower(thinker: nn.Module, kind: type[nn.Module] = nn.Module) -> nn.Module:
    """The thinker's audio tower; TypeError unless it is a ``kind`` (the family's transformers class)."""
    return _part(thinker, "audio_tower", kind)


@overload
def thinker_vision_tower(thinker: nn.Module) -> nn.Module: ...
@overload
def thinker_vision_tower(thinker: nn.Module, kind: type[M]) -> M: ...
def thinker_vision_tower(thinker: nn.Module, kind: type[nn.Module] = nn.Module) -> nn.Module:
    """The thinker's vision tower; TypeError unless it is a ``kind`` (the family's transformers class)."""
    return _part(thinker, "visual", kind)
