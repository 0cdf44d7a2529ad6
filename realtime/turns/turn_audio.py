"""The audio of the user's current turn, as the turn model hears it: the last 8 s since the turn began.

One :class:`TurnAudio` per session, fed every chunk of 16 kHz audio the session's VAD is fed. The turn begins at
server VAD's speech start, with some audio from before it (the user item's prefix padding; pipecat's analyzer gives
the model 500 ms), and goes on through pauses (speech that resumes continues the same turn) until the turn ends or
is cleared. Memory is bounded: the session's last 8 s (:data:`~realtime.turns.features.WINDOW_SAMPLES`).
"""

from __future__ import annotations

import numpy as np

from realtime.turns.features import SAMPLE_RATE, WINDOW_SAMPLES


class TurnAudio:
    """A ring buffer of the session's last 8 s of 16 kHz float32 audio, and where the current turn began in it. Not
    thread-safe: one session's loop feeds it. Each call costs time in proportion to its audio, not to the buffer.

    Calling order: :meth:`append` every chunk (turn or not); :meth:`begin` when speech starts a turn;
    :meth:`audio` for the model while the turn lasts; :meth:`end` when it ends (committed or cleared)."""

    def __init__(self, lookback_ms: int = 300) -> None:
        if isinstance(lookback_ms, bool) or not isinstance(lookback_ms, int) or lookback_ms < 0:
            raise ValueError(f"lookback_ms must be a non-negative integer, got {lookback_ms!r}")
        self.lookback_samples = lookback_ms * SAMPLE_RATE // 1000
        """Audio from before the speech start that a turn includes."""
        self._ring = np.zeros(WINDOW_SAMPLES, dtype=np.float32)
        self._write = 0  # index of the next sample written
        self._size = 0  # samples held (at most the ring's length)
        self._turn_samples: int | None = None  # the current turn's samples held (None: between turns)

    @property
    def in_turn(self) -> bool:
        return self._turn_samples is not None

    def append(self, pcm16k: np.ndarray) -> None:
        """Add the next chunk of the session's 16 kHz mono audio (1-D float)."""
        chunk = np.asarray(pcm16k, dtype=np.float32)
        if chunk.ndim != 1:
            raise ValueError(f"expected mono 1-D audio, got an array of shape {chunk.shape}")
        n = len(chunk)
        chunk = chunk[-WINDOW_SAMPLES:]
        first = min(len(chunk), WINDOW_SAMPLES - self._write)
        self._ring[self._write : self._write + first] = chunk[:first]
        self._ring[: len(chunk) - first] = chunk[first:]
        self._write = (self._write + len(chunk)) % WINDOW_SAMPLES
        self._size = min(self._size + n, WINDOW_SAMPLES)
        if self._turn_samples is not None:
            self._turn_samples = min(self._turn_samples + n, WINDOW_SAMPLES)

    def begin(self) -> None:
        """A turn begins now, with the look-back already appended. A turn in progress goes on (speech that starts
        again within a turn continues it)."""
        if self._turn_samples is None:
            self._turn_samples = min(self.lookback_samples, self._size)

    def end(self) -> None:
        """The turn ended (committed, cleared, or detection restarted): forget it."""
        self._turn_samples = None

    def audio(self) -> np.ndarray:
        """A copy of the turn's audio (its last 8 s at most: all the model hears); empty between turns."""
        if not self._turn_samples:
            return np.zeros(0, dtype=np.float32)
        start = (self._write - self._turn_samples) % WINDOW_SAMPLES
        if start < self._write:
            return self._ring[start : self._write].copy()
        return np.concatenate([self._ring[start:], self._ring[: self._write]])
