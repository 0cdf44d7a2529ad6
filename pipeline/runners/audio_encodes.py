"""User audio encodes, queued by the engine's commands and run together at the start of the next engine step.

Why: the audio encoder is launch-bound (hundreds of small kernels from Python, 20-30 ms of host time for a 2 s block
whose device work is a few ms). Run inside each ``append_audio`` / ``commit_audio`` command, it cost the engine
thread that much per block and per turn end: with many users speaking, their encodes queued between steps, delayed
every session's next token, and at 64 users a commit waited 0.9-1.3 s. Queued here, the blocks
and tails of every conversation encode in one call of the encoder per step.

Contract: :meth:`AudioEncodes.block` returns an :class:`~pipeline.core.conversation_state.AudioBlock` at once, its
``embeds`` allocated on the device (its token count is known from the frame count) and filled by the next
:meth:`AudioEncodes.flush`, which the engine runs at the start of every step, before anything renders or prefills a
conversation. Device work is stream-ordered, so nothing waits for it on the host. A block whose encode fails keeps
the exception in ``AudioBlock.error``; the response that would read it fails with it. The queue is
:class:`~pipeline.runners.background_encodes.EncodeQueue`, shared with the picture encodes.
"""

from __future__ import annotations

import logging
from typing import Protocol

import torch

from pipeline.core.conversation_state import AudioBlock
from pipeline.runners.background_encodes import EncodeNames, EncodeQueue

__all__ = ["BatchAudioEncoder", "AudioEncodes"]

log = logging.getLogger(__name__)

_NAMES = EncodeNames(many="audio blocks", one="an audio block", unit="block", encoder="encoder")


class BatchAudioEncoder(Protocol):
    """What encodes (the thinker's runner)."""

    def encode_many(self, features: list[torch.Tensor]) -> list[torch.Tensor]:
        """Log-mel features (n_mels, T) each -> their encodings (tokens, width), in one call."""
        ...

    def audio_tokens(self, frames: int) -> int:
        """How many tokens ``frames`` mel frames encode to."""
        ...


class AudioEncodes:
    def __init__(self, encoder: BatchAudioEncoder, *, width: int, dtype: torch.dtype, device: torch.device) -> None:
        self._encoder = encoder
        self._queue: EncodeQueue[torch.Tensor, AudioBlock] = EncodeQueue(
            lambda items: encoder.encode_many(items),  # looked up per call: a test may replace it
            _NAMES,
            log=log,
            width=width,
            dtype=dtype,
            device=device,
        )

    @property
    def pending(self) -> int:
        return self._queue.pending

    def block(self, features: torch.Tensor, *, floor: float | None, version: int = 0) -> AudioBlock:
        """A block for ``features`` (n_mels, T), encoded at the next :meth:`flush`."""
        embeds = self._queue.empty(self._encoder.audio_tokens(features.shape[1]))
        return self._queue.add(features, AudioBlock(embeds, version=version, floor=floor))

    def flush(self) -> int:
        """Encode every queued block in one call (if that fails, each alone, so only a faulty one fails). Returns
        how many were encoded."""
        return self._queue.flush()
