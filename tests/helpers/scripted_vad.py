"""A VAD whose speech probabilities are written into the audio itself, for exact turn-detection tests."""

from __future__ import annotations

import numpy as np

FRAME = 512  # samples per VAD frame at 16 kHz = 32 ms


class ScriptedVad:
    """Reads the probability off the audio itself: each frame of the test signal is constant and
    equal to the probability it should get. A frame cut in the wrong place would not be constant."""

    frame_samples = FRAME

    def __init__(self) -> None:
        self.resets = 0

    def __call__(self, frame: np.ndarray) -> float:
        assert frame.shape == (FRAME,)
        assert np.all(frame == frame[0]), "frame straddles two scripted frames"
        return float(frame[0])

    def reset(self) -> None:
        self.resets += 1


def script(*runs: tuple[float, int]) -> np.ndarray:
    """Audio whose frames score ``prob`` for ``n`` frames, run after run."""
    return np.concatenate([np.full(n * FRAME, prob, np.float32) for prob, n in runs])
