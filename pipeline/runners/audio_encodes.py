"""User audio encodes, queued by the engine's commands and run together at the start of the next engine step.

Why: the audio encoder is launch-bound (hundreds of small kernels from Python, 20-30 ms of host time for a 2 s block
whose device work is a few ms). Run inside each ``append_audio`` / ``commit_audio`` command, it cost the engine
thread that much per block and per turn end: with many users speaking, their encodes queued between steps, delayed
every session's next token, and at 64 users a commit waited 0.9-1.3 s. Queued here, the blocks
and tails of every conversation encode in one call of the encoder per step.

Contract: :meth:`AudioEncodes.block` returns an :class:`~pipeline.conversation_state.AudioBlock` at once, its
``embeds`` allocated on the device (its token count is known from the frame count) and filled by the next
:meth:`AudioEncodes.flush`, which the engine runs at the start of every step, before anything renders or prefills a
conversation. Device work is stream-ordered, so nothing waits for it on the host. A block whose encode fails keeps
the exception in ``AudioBlock.error``; the response that would read it fails with it.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Protocol

import torch

from pipeline.conversation_state import AudioBlock

__all__ = ["AudioEncoder", "AudioEncodes"]

log = logging.getLogger(__name__)


@dataclass
class _Encode:
    features: torch.Tensor
    block: AudioBlock


class AudioEncoder(Protocol):
    """What encodes (the thinker's runner)."""

    def encode_many(self, features: list[torch.Tensor]) -> list[torch.Tensor]:
        """Log-mel features (n_mels, T) each -> their encodings (tokens, width), in one call."""
        ...

    def audio_tokens(self, frames: int) -> int:
        """How many tokens ``frames`` mel frames encode to."""
        ...


class AudioEncodes:
    def __init__(self, encoder: AudioEncoder, *, width: int, dtype: torch.dtype, device: torch.device) -> None:
        self._encoder = encoder
        self._width, self._dtype, self._device = width, dtype, torch.device(device)
        self._queue: list[_Encode] = []

    @property
    def pending(self) -> int:
        return len(self._queue)

    def block(self, features: torch.Tensor, *, floor: float | None, version: int = 0) -> AudioBlock:
        """A block for ``features`` (n_mels, T), encoded at the next :meth:`flush`."""
        tokens = self._encoder.audio_tokens(features.shape[1])
        embeds = torch.empty(tokens, self._width, dtype=self._dtype, device=self._device)
        block = AudioBlock(embeds, version=version, floor=floor)
        self._queue.append(_Encode(features, block))
        return block

    def flush(self) -> int:
        """Encode every queued block in one call (if that fails, each alone, so only a faulty one fails). Returns
        how many were encoded."""
        queued, self._queue = self._queue, []
        if not queued:
            return 0
        try:
            self._fill(queued, self._encoder.encode_many([q.features for q in queued]))
        except Exception:  # noqa: BLE001 - find the faulty block by encoding one by one
            log.exception("batched encode of %d audio blocks failed; encoding each alone", len(queued))
            for q in queued:
                try:
                    self._fill([q], self._encoder.encode_many([q.features]))
                except Exception as exc:  # noqa: BLE001 - kept on the block: its response fails with it
                    log.exception("encoding an audio block failed")
                    q.block.error = exc
        return len(queued)

    @staticmethod
    def _fill(queued: list[_Encode], outputs: list[torch.Tensor]) -> None:
        for q, out in zip(queued, outputs, strict=True):
            if out.shape != q.block.embeds.shape:
                raise RuntimeError(f"encoder gave {tuple(out.shape)} for a block of {tuple(q.block.embeds.shape)}")
            q.block.embeds.copy_(out)
