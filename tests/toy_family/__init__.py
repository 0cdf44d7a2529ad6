"""A second model family, for tests only: :data:`FAMILY` (see :mod:`toy_family.family`)."""

from toy_family.family import FAMILY, TONE_SAMPLES, ToyFamily, tone

__all__ = ["FAMILY", "TONE_SAMPLES", "ToyFamily", "tone"]
