"""The model families the end-to-end tests run on, once each (the ``family`` fixture of tests/conftest.py): a tiny
checkpoint of each, a shared greedy engine on it, and the facts of the family a test may need to size or check what
it does."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class FamilyCase:
    """One family as the tests see it. ``model_dir`` and ``engine`` name the session fixtures of its tiny checkpoint
    folder and of its shared greedy engine (tests/conftest.py)."""

    id: str
    """The test id: ``qwen2_5`` or ``qwen3``."""
    family: str
    """The family's name (a stage config's ``model_family``)."""
    model_dir: str
    engine: str
    frame_ms: int
    """Audio per talker token in ms: a Qwen2.5-Omni codec token is 20 ms (50 a second), a Qwen3-Omni frame of 16
    codebooks 80 ms (12.5 a second)."""
    voices: tuple[str, ...]
    """The speakers of the released checkpoints (the tiny ones have the same), in the engine's order."""
    default_voice: str
    """The speaker the reference speaks with when none is asked for."""

    @property
    def frame_samples(self) -> int:
        """Output samples (24 kHz) per talker token."""
        return self.frame_ms * 24

    def talker_tokens(self, seconds: float) -> int:
        """The talker tokens (codes or frames) of ``seconds`` of audio, at least one."""
        return max(1, round(1000 * seconds / self.frame_ms))


FAMILIES = {
    case.id: case
    for case in (
        FamilyCase(
            "qwen2_5",
            "qwen2_5_omni",
            model_dir="tiny_model_dir",
            engine="tiny_engine",
            frame_ms=20,
            voices=("Chelsie", "Ethan"),
            default_voice="Chelsie",
        ),
        FamilyCase(
            "qwen3",
            "qwen3_omni",
            model_dir="qwen3_model_dir",
            engine="qwen3_engine",
            frame_ms=80,
            voices=("Aiden", "Chelsie", "Ethan"),
            default_voice="Ethan",
        ),
    )
}
