"""Loading a Qwen-Omni checkpoint's config, preprocessor settings and weights the way both families do: the config
class checked against the folder's ``model_type``, the Whisper feature extractor checked against the audio encoder,
``preprocessor_config.json`` read for the image processor, and the whole model loaded once then split into parts,
each placed on its stage's device in its dtype. Every failure raises :class:`~pipeline.errors.CheckpointError` naming
the file (bad ``devices`` / ``dtypes`` arguments: :class:`~pipeline.errors.ConfigError`)."""

from __future__ import annotations

import json
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from pipeline.errors import CheckpointError, ConfigError
from pipeline.models.common.hf_checkpoint import (
    CONFIG_FILE,
    PREPROCESSOR_FILE,
    check_loading_info,
    read_model_type,
    required_file,
)

__all__ = [
    "Placement",
    "load_feature_extractor",
    "load_hf_config",
    "load_parts",
    "read_preprocessor_config",
    "stage_placement",
]

AUDIO_SAMPLE_RATE = 16_000
"""The feature extractor's input rate: user audio is 16 kHz mono."""


def load_hf_config(path: Path, config_class: Any, model_type: str) -> Any:
    """``config_class.from_pretrained(path)`` once ``path``'s config.json says ``model_type`` (not validated further:
    the family checks its own cross-part rules)."""
    found = read_model_type(path)
    if found != model_type:
        raise CheckpointError(f"{CONFIG_FILE}: model_type is {found!r}, expected {model_type!r}")
    try:
        return config_class.from_pretrained(path)
    except Exception as exc:  # transformers validates configs with assorted exception types
        raise CheckpointError(f"{CONFIG_FILE}: rejected by transformers: {exc}") from exc


def load_feature_extractor(path: Path, config: Any) -> Any:
    """The folder's ``WhisperFeatureExtractor``: its mel bins must be the audio encoder's
    (``config.thinker_config.audio_config.num_mel_bins``) and its rate 16 kHz."""
    from transformers import WhisperFeatureExtractor

    required_file(path, PREPROCESSOR_FILE)
    try:
        fe = WhisperFeatureExtractor.from_pretrained(path)
    except Exception as exc:  # as above
        raise CheckpointError(f"{PREPROCESSOR_FILE}: cannot be loaded: {exc}") from exc
    mel_bins = config.thinker_config.audio_config.num_mel_bins
    if fe.feature_size != mel_bins:
        raise CheckpointError(
            f"{PREPROCESSOR_FILE}: feature_size {fe.feature_size} != audio_config.num_mel_bins {mel_bins}",
            param="feature_size",
        )
    if fe.sampling_rate != AUDIO_SAMPLE_RATE:
        raise CheckpointError(f"{PREPROCESSOR_FILE}: sampling_rate {fe.sampling_rate}, expected {AUDIO_SAMPLE_RATE}")
    return fe


def read_preprocessor_config(path: Path) -> dict[str, Any]:
    """The folder's ``preprocessor_config.json`` as a dict (the feature extractor's settings and, for a checkpoint
    that takes pictures, the image processor's beside them)."""
    file = required_file(path, PREPROCESSOR_FILE)
    try:
        raw = json.loads(file.read_text())
    except ValueError as exc:
        raise CheckpointError(f"{PREPROCESSOR_FILE}: not valid JSON ({exc})") from exc
    if not isinstance(raw, dict):
        raise CheckpointError(f"{PREPROCESSOR_FILE}: expected a JSON object")
    return raw


@dataclass(frozen=True)
class Placement:
    """Where one part of the model runs."""

    device: str
    dtype: torch.dtype


def stage_placement(
    devices: Mapping[str, str] | None,
    dtypes: Mapping[str, torch.dtype] | None,
    stage_of_part: Mapping[str, str],
    *,
    float32_parts: Collection[str] = (),
) -> dict[str, Placement]:
    """Device and dtype of each part (``stage_of_part``: part attribute -> engine stage, in loading order), from
    arguments keyed by stage. A stage missing from ``devices`` runs on ``"cpu"``; from ``dtypes``, in bfloat16 on
    CUDA and float32 elsewhere, or always float32 for ``float32_parts``. ConfigError naming the argument for a key that
    is no stage."""
    devices, dtypes = dict(devices or {}), dict(dtypes or {})
    stages = tuple(stage_of_part.values())
    for arg, given in (("devices", devices), ("dtypes", dtypes)):
        unknown = set(given) - set(stages)
        if unknown:
            raise ConfigError(f"{arg}: unknown stage(s) {sorted(unknown)}; expected {stages}", param=arg)
    placement = {}
    for part, stage in stage_of_part.items():
        device = str(devices.get(stage, "cpu"))
        cuda = torch.device(device).type == "cuda"
        default = torch.bfloat16 if cuda and part not in float32_parts else torch.float32
        placement[part] = Placement(device=device, dtype=dtypes.get(stage, default))
    return placement


def load_parts(
    from_pretrained: Callable[..., Any],
    path: Path,
    placement: Mapping[str, Placement],
    *,
    optional: Collection[str] = (),
) -> list[torch.nn.Module | None]:
    """Load the whole model once with ``from_pretrained`` (transformers maps the released key layout), then place each
    part of ``placement`` and put it in eval mode; returns them in ``placement``'s order. A part missing from the loaded
    model is None when it is in ``optional``, else a CheckpointError.

    Loading keeps the checkpoint's stored dtype (``dtype="auto"``) so that casting each part afterwards never widens
    already-rounded values. A single target device (not the CPU) is passed as ``device_map`` (no dispatch hooks);
    parts bound elsewhere are moved after loading."""
    devices = {p.device for p in placement.values()}
    load_device = next(iter(devices)) if len(devices) == 1 and "cpu" not in devices else None
    try:
        model, info = from_pretrained(path, dtype="auto", device_map=load_device, output_loading_info=True)
    except Exception as exc:  # safetensors / transformers raise assorted types on bad weights
        raise CheckpointError(f"weights: cannot be loaded from {path}: {exc}", param="weights") from exc
    check_loading_info(info)
    parts: list[torch.nn.Module | None] = []
    for name, where in placement.items():
        module = getattr(model, name, None)
        if module is None:
            if name not in optional:
                raise CheckpointError(f"weights: the loaded model has no {name}", param="weights")
            parts.append(None)
            continue
        module.to(device=where.device, dtype=where.dtype)
        module.eval()
        parts.append(module)
    return parts
