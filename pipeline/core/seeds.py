"""The noise seeds of an engine's responses: each response's sampling seed and each token2wav stream's generator.

Without an engine seed, every response draws its seed from the OS and streams use the synthesizer's own noise. With
one, both come from the seed and one counter that every draw advances (responses and streams alike, in the order the
engine asks), so a seeded engine repeats its replies. Engine thread only.
"""

from __future__ import annotations

import secrets

import torch

__all__ = ["Seeds"]


class Seeds:
    def __init__(self, seed: int | None) -> None:
        self.seed = seed
        self._counter = 0

    def response_seed(self) -> int:
        """The noise seed of a new response's sampling: drawn from the OS, or with an engine seed, the seed and the
        response's number (so a seeded engine repeats its replies)."""
        if self.seed is None:
            return secrets.randbits(32)
        self._counter += 1
        return (self.seed * 1_000_003 + self._counter) & 0xFFFFFFFF

    def generator(self, device: torch.device) -> torch.Generator | None:
        """A new stream's noise generator on ``device`` (None without an engine seed: the synthesizer's own)."""
        if self.seed is None:
            return None
        self._counter += 1
        gen = torch.Generator(device=device)
        gen.manual_seed(self.seed + self._counter)
        return gen
