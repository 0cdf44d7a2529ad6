"""Server VAD turn detection: per-frame speech probabilities → speech started / stopped events. Pure.

Semantics (the OpenAI Realtime ``server_vad`` mode, with silero's hysteresis):

- Audio is 16 kHz mono float32, fed in chunks of any size; it is cut into the VAD's frames
  (512 samples = 32 ms for silero) and each frame gets one probability ``p``.
- Speech starts at the first frame with ``p >= threshold``. ``SpeechStarted.speech_start_ms`` is
  that frame's start; ``audio_start_ms`` is moved back by ``prefix_padding_ms`` (not below 0): the
  user item's audio begins there.
- While speaking, a frame with ``p < end_threshold`` (``max(threshold - 0.15, 0.01)``) starts a
  silence run at its start time; a frame with ``p >= threshold`` cancels the run; frames in between
  neither start nor cancel one. Speech stops at the end of the frame where the run reaches
  ``silence_duration_ms``: ``SpeechStopped.audio_end_ms`` is that frame's end (the end of the audio
  that belongs to the turn, so it includes the silence, as the API defines it) and
  ``speech_end_ms`` is where the run began (the real end of speech, for latency metrics).
- With ``pause_ms`` set (a server setting, below ``silence_duration_ms``; the API has no such field), a silence
  run that reaches ``pause_ms`` first reports ``SpeechPaused`` (the turn may be ending: the session can start a
  reply early, unseen by the client), and a speech frame that then cancels the run reports ``SpeechResumed``
  (that reply must be withdrawn). A run reports at most one pause; the ``SpeechStopped`` that may follow is as
  without them.
- All times are integer milliseconds since the first sample ever fed (the session's audio
  clock); :meth:`TurnDetector.reset` does not restart that clock. Events do not depend on how
  the audio was chunked.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

import numpy as np

from realtime.protocol.turn_detection import ServerVadParams
from realtime.turns.vad import VAD_SAMPLE_RATE, BatchedSpeechProbability, SpeechProbability


@dataclass(frozen=True)
class SpeechStarted:
    """Speech began. ``audio_start_ms`` includes the prefix padding; ``speech_start_ms`` does not."""

    audio_start_ms: int
    speech_start_ms: int


@dataclass(frozen=True)
class SpeechStopped:
    """Speech ended. ``audio_end_ms`` includes the silence window; ``speech_end_ms`` is where it began."""

    audio_end_ms: int
    speech_end_ms: int


@dataclass(frozen=True)
class SpeechPaused:
    """A silence run reached the detector's ``pause_ms``: the turn may end ``silence_duration_ms`` after
    ``speech_end_ms``. ``audio_end_ms`` is the end of the frame where it was decided."""

    audio_end_ms: int
    speech_end_ms: int


@dataclass(frozen=True)
class SpeechResumed:
    """Speech came back after a :class:`SpeechPaused`, at the start of the frame ``speech_start_ms``: the turn
    goes on."""

    speech_start_ms: int


TurnEvent = SpeechStarted | SpeechStopped | SpeechPaused | SpeechResumed


class TurnState(enum.Enum):
    SILENT = "silent"  # waiting for speech
    SPEAKING = "speaking"  # in speech, no silence run
    TRAILING = "trailing"  # in speech, counting a silence run that may end the turn


class TurnDetector:
    """Streaming speech start/stop detection over 16 kHz audio (see the module docstring)."""

    def __init__(self, params: ServerVadParams, vad: SpeechProbability, *, pause_ms: int | None = None) -> None:
        if pause_ms is not None and (isinstance(pause_ms, bool) or not isinstance(pause_ms, int) or pause_ms < 0):
            raise ValueError(f"pause_ms must be None or a non-negative integer, got {pause_ms!r}")
        self.params = params
        self.pause_ms = pause_ms
        """Silence after which a run reports :class:`SpeechPaused` (None: never; only when below the silence
        window)."""
        self._paused = False
        self._vad = vad
        self._frame = vad.frame_samples
        self._pending = np.zeros(0, dtype=np.float32)
        self._next_frame_start = 0  # sample index (session clock) of the first pending sample
        self._state = TurnState.SILENT
        self._silence_start_ms = 0

    @property
    def speaking(self) -> bool:
        """True from a ``SpeechStarted`` until the next ``SpeechStopped``."""
        return self._state is not TurnState.SILENT

    @property
    def state(self) -> TurnState:
        return self._state

    @property
    def elapsed_ms(self) -> int:
        """Milliseconds of audio fed since the first sample (the session's audio clock)."""
        return _ms(self._next_frame_start + len(self._pending))

    def feed(self, pcm16k: np.ndarray) -> list[TurnEvent]:
        """Consume 16 kHz mono float audio; return the events of the frames it completed, in order.

        A trailing partial frame is kept for the next call."""
        frames = self._take_frames(pcm16k)
        return self._advance(frames, [self._vad(frame) for frame, _ in frames])

    async def afeed(self, pcm16k: np.ndarray) -> list[TurnEvent]:
        """:meth:`feed`, with each frame scored by ``await vad.probability(frame)`` when the VAD is a
        :class:`~realtime.turns.vad.BatchedSpeechProbability` (shared with other sessions' frames). Calls must not
        overlap (one session feeds its chunks in order)."""
        frames = self._take_frames(pcm16k)
        if isinstance(self._vad, BatchedSpeechProbability):
            probs = [await self._vad.probability(frame) for frame, _ in frames]
        else:
            probs = [self._vad(frame) for frame, _ in frames]
        return self._advance(frames, probs)

    def _take_frames(self, pcm16k: np.ndarray) -> list[tuple[np.ndarray, int]]:
        """The complete frames of the pending samples plus ``pcm16k``, each with its first sample's index on the
        session clock; the rest is kept."""
        chunk = np.asarray(pcm16k, dtype=np.float32)
        if chunk.ndim != 1:
            raise ValueError(f"expected mono 1-D audio, got an array of shape {chunk.shape}")
        buffered = np.concatenate([self._pending, chunk]) if len(self._pending) else chunk
        n_frames = len(buffered) // self._frame
        frames = [
            (buffered[i * self._frame : (i + 1) * self._frame], self._next_frame_start + i * self._frame)
            for i in range(n_frames)
        ]
        self._pending = buffered[n_frames * self._frame :].copy()
        self._next_frame_start += n_frames * self._frame
        return frames

    def _advance(self, frames: list[tuple[np.ndarray, int]], probs: list[float]) -> list[TurnEvent]:
        steps = zip(frames, probs, strict=True)
        events = [self._step(p, _ms(start), _ms(start + self._frame)) for (_, start), p in steps]
        return [event for event in events if event is not None]

    def reset(self) -> None:
        """Forget the speech state, the VAD's memory and any partial frame; the clock keeps running.

        For ``input_audio_buffer.clear`` or a turn-detection change: the next sample fed starts a
        fresh frame, and no ``SpeechStopped`` follows a ``SpeechStarted`` already returned."""
        self._vad.reset()
        self._next_frame_start += len(self._pending)
        self._pending = np.zeros(0, dtype=np.float32)
        self._state = TurnState.SILENT
        self._paused = False

    def _step(self, prob: float, start_ms: int, end_ms: int) -> TurnEvent | None:
        """Advance the state machine by one frame spanning [start_ms, end_ms)."""
        p = self.params
        if self._state is TurnState.SILENT:
            if prob < p.threshold:
                return None
            self._state = TurnState.SPEAKING
            return SpeechStarted(audio_start_ms=max(0, start_ms - p.prefix_padding_ms), speech_start_ms=start_ms)
        if prob >= p.threshold:
            self._state = TurnState.SPEAKING
            if self._paused:
                self._paused = False
                return SpeechResumed(speech_start_ms=start_ms)
            return None
        if self._state is TurnState.SPEAKING:
            if prob >= p.end_threshold:
                return None
            self._state = TurnState.TRAILING
            self._silence_start_ms = start_ms
        silence_ms = end_ms - self._silence_start_ms
        if silence_ms < p.silence_duration_ms:
            if self._paused or self.pause_ms is None or silence_ms < self.pause_ms:
                return None
            self._paused = True
            return SpeechPaused(audio_end_ms=end_ms, speech_end_ms=self._silence_start_ms)
        self._state = TurnState.SILENT
        self._paused = False
        return SpeechStopped(audio_end_ms=end_ms, speech_end_ms=self._silence_start_ms)


def _ms(samples: int) -> int:
    return samples * 1000 // VAD_SAMPLE_RATE
