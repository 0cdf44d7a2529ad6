"""Streaming speech probability for server VAD: silero-vad's packaged model, one instance per session.

The turn detector (:mod:`realtime.turns.server_vad`) depends only on the :class:`SpeechProbability` protocol,
so it is tested with scripted probabilities and runs with :class:`SileroVad` in the server, or with a stream of
:mod:`realtime.turns.vad_batch` (:class:`BatchedSpeechProbability`: every session's frames scored in shared calls).
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import numpy as np
import torch

VAD_SAMPLE_RATE = 16_000
"""Sample rate (Hz) of the audio a :class:`SpeechProbability` consumes."""


class SpeechProbability(Protocol):
    """A stateful per-frame speech detector over 16 kHz mono float32 audio.

    Contract: ``__call__`` receives consecutive frames of exactly ``frame_samples`` samples of one
    stream and returns P(speech) in [0, 1] for that frame; ``reset()`` forgets the stream so the
    next frame starts a new one.
    """

    frame_samples: int

    def __call__(self, frame: np.ndarray) -> float: ...

    def reset(self) -> None: ...


class SileroVad:
    """Silero VAD (TorchScript model shipped in the ``silero-vad`` package) as a :class:`SpeechProbability`.

    The model carries its recurrent state and a 64-sample context across calls, so each session
    needs its own instance (loading takes ~0.1 s). Frames are 512 samples (32 ms) at 16 kHz.

    torch runs it with one intra-op thread: the model is tiny (~1 ms a frame) and many sessions
    share the server's cores, where extra threads only spin. ``torch.set_num_threads`` is
    process-wide (importing ``silero_vad`` already sets it to 1); the server owns that choice for
    any CPU engine in the same process.
    """

    frame_samples = 512

    def __init__(self) -> None:
        from silero_vad import load_silero_vad  # deferred: the import sets torch's thread count

        torch.set_num_threads(1)
        self._model = load_silero_vad()

    def __call__(self, frame: np.ndarray) -> float:
        """P(speech) for the next 512-sample frame of 16 kHz float audio."""
        x = np.asarray(frame, dtype=np.float32)
        if x.shape != (self.frame_samples,):
            raise ValueError(f"SileroVad takes frames of shape ({self.frame_samples},), got {x.shape}")
        with torch.inference_mode():
            return float(self._model(torch.from_numpy(x.copy()), VAD_SAMPLE_RATE).item())

    def reset(self) -> None:
        """Forget the stream: clear the model's recurrent state and context."""
        self._model.reset_states()


@runtime_checkable
class BatchedSpeechProbability(SpeechProbability, Protocol):
    """A :class:`SpeechProbability` whose frames may also be scored together with other streams' frames:
    ``await probability(frame)`` returns the same value as ``__call__`` would, once a batched call ran."""

    async def probability(self, frame: np.ndarray) -> float: ...
