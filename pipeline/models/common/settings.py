"""Checks of stage-config values, shared by :mod:`pipeline.config` and the families' own sections
(:meth:`pipeline.models.family.ModelFamily.token2wav_config`), so that a bad value reads the same wherever it is
parsed. Each raises :class:`~pipeline.errors.ConfigError` whose ``param`` is the dotted path of the bad field
(``where``, e.g. ``stages.token2wav.compile``)."""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any

from pipeline.errors import ConfigError

__all__ = ["AUTO", "DTYPES", "check_bool", "check_choice", "reject_unknown", "switch"]

AUTO = "auto"
DTYPES = ("float32", "bfloat16", "float16")
"""The precisions a stage's weights or compute may be given in (torch dtype names)."""


def switch(value: Any, where: str) -> bool | str:
    """auto / on / off, or YAML 1.1's bare on / off (read as booleans): True, False or ``auto``."""
    if isinstance(value, bool) or value == AUTO:
        return value
    if value in ("on", "off"):
        return value == "on"
    raise ConfigError(f"{where} must be one of ('auto', 'on', 'off'), got {value!r}", param=where)


def check_bool(value: Any, where: str) -> None:
    if not isinstance(value, bool):
        raise ConfigError(f"{where} has the wrong type ({type(value).__name__})", param=where)


def check_choice(value: Any, choices: tuple, where: str) -> None:
    if value not in choices:
        raise ConfigError(f"{where} must be one of {choices}, got {value!r}", param=where)


def reject_unknown(raw: Mapping, allowed: Collection[str], path: str) -> None:
    """Every key of ``raw`` (the mapping at ``path``; "" for the top level) is one of ``allowed``."""
    for key in raw:
        if key not in allowed:
            where = f"{path}.{key}" if path else str(key)
            raise ConfigError(f"unknown field {where!r} (allowed: {sorted(allowed)})", param=where)
