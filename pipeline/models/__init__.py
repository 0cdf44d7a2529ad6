"""Model families by name: the stage config's ``model_family`` picks one (:mod:`pipeline.models.family` says what a
family provides). Adding a family is a folder under ``pipeline/models/`` and one line in :data:`FAMILIES`."""

from __future__ import annotations

import importlib
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

from pipeline.errors import CheckpointError, ConfigError

if TYPE_CHECKING:
    from pipeline.models.family import ModelFamily

FAMILIES: dict[str, str] = {
    "qwen2_5_omni": "pipeline.models.qwen2_5_omni.family:FAMILY",
    "qwen3_omni": "pipeline.models.qwen3_omni.family:FAMILY",
}
"""Family name -> ``module:attribute`` of its :class:`~pipeline.models.family.ModelFamily` object (imported on first
use, so that reading a config imports no model code)."""

MODEL_TYPES: dict[str, str] = {
    "qwen2_5_omni": "qwen2_5_omni",
    "qwen3_omni_moe": "qwen3_omni",
}
"""A checkpoint's ``config.json`` ``model_type`` -> the family that serves it."""

DEFAULT_FAMILY = "qwen2_5_omni"
"""The packaged stage config's family (``pipeline/stage_configs/qwen2_5_omni.yaml``): the family of what is used
where no stage config is read, the embedded tiny model and ``make-tiny-model`` among them."""

_registered: dict[str, ModelFamily] = {}
"""Families registered as objects (:func:`registered`), ahead of :data:`FAMILIES`."""


def family_of(name: object) -> ModelFamily:
    """The family named ``name``; :class:`ConfigError` (``param="model_family"``) naming the known ones otherwise."""
    if isinstance(name, str) and name in _registered:
        return _registered[name]
    if not isinstance(name, str) or name not in FAMILIES:
        known = sorted({*FAMILIES, *_registered})
        raise ConfigError(f"model_family must be one of {known}, got {name!r}", param="model_family")
    module, attribute = FAMILIES[name].split(":")
    return getattr(importlib.import_module(module), attribute)


def checkpoint_family(model: str) -> str:
    """The name of the family that serves checkpoint ``model`` (a folder, or a hub id already in the local cache),
    from its ``config.json``'s ``model_type``; reads no weights, never downloads. :class:`CheckpointError` when the
    checkpoint cannot be found or no family serves its model type."""
    from pipeline.models.common.hf_checkpoint import read_model_type, resolve_checkpoint_path

    model_type = read_model_type(resolve_checkpoint_path(model))
    if model_type not in MODEL_TYPES:
        raise CheckpointError(
            f"{model}: model_type {model_type!r} is not one this server serves ({', '.join(sorted(MODEL_TYPES))})",
            param="model",
        )
    return MODEL_TYPES[model_type]


@contextmanager
def registered(family: ModelFamily) -> Iterator[ModelFamily]:
    """Make ``family`` known under ``family.name`` inside the ``with`` block (a test's own family); it may not
    shadow a family of :data:`FAMILIES` or one registered already."""
    if family.name in FAMILIES or family.name in _registered:
        raise ValueError(f"model family {family.name!r} is already known")
    _registered[family.name] = family
    try:
        yield family
    finally:
        del _registered[family.name]
