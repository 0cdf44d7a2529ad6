"""The Smart Turn model and the spoken turn fixtures as tests get them: made once per process, or the test skips
saying what is missing (the ``turn`` extra; espeak-ng and sox)."""

from __future__ import annotations

import functools

import pytest

from realtime.bench.turn_fixtures import SENTENCES, TurnClip, Voice, render_all, tools_missing
from realtime.turns.smart_turn import SmartTurnModel, TurnModelUnavailable


@functools.cache
def _model() -> SmartTurnModel | str:
    try:
        return SmartTurnModel.bundled(threads=1)
    except TurnModelUnavailable as exc:
        return f"the turn extra is not installed (pip install -e '.[turn]'): {exc}"


def turn_model() -> SmartTurnModel:
    """The bundled Smart Turn v3.2, on one thread; skips the test when the ``turn`` extra is absent."""
    model = _model()
    if isinstance(model, str):
        pytest.skip(model)
    return model


@functools.cache
def _clips(voice: Voice) -> tuple[TurnClip, ...]:
    return tuple(render_all(SENTENCES, (voice,)))


def turn_clips(voice: Voice) -> tuple[TurnClip, ...]:
    """Every sentence's complete, cut and pause turns spoken by ``voice`` (rendered once per process); skips the
    test when espeak-ng or sox is missing."""
    missing = tools_missing()
    if missing:
        pytest.skip(f"{', '.join(missing)} not installed (Debian: apt-get install espeak-ng sox)")
    return _clips(voice)
