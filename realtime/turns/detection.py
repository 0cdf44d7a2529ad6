"""Speech detection of one session: the turn detector made from the session's ``server_vad`` settings, fed each chunk
of client audio (wire bytes, decoded here to 16 kHz), its events shifted onto the session's audio clock.

:class:`SpeechDetection` is the runner's part (``realtime.runner.SessionRunner`` feeds the events it returns to its
session); :class:`SpeechDetector` is what it runs (``realtime.turns.server_vad.TurnDetector`` is one, over a VAD of
its own or one shared with other sessions through ``realtime.turns.vad_batch``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from realtime.media.audio import AudioDecoder, DecoderFactory
from realtime.protocol.audio_format import AudioFormat
from realtime.protocol.turn_detection import ServerVadParams
from realtime.turns.server_vad import SpeechResumed, SpeechStarted, TurnEvent


class SpeechDetector(Protocol):
    """Speech start/stop over 16 kHz audio (``realtime.turns.server_vad.TurnDetector`` is one). Times are ms since the
    first sample it was fed; :class:`SpeechDetection` shifts them onto the session's audio clock."""

    def feed(self, pcm16k: np.ndarray) -> list[TurnEvent]: ...

    async def afeed(self, pcm16k: np.ndarray) -> list[TurnEvent]:
        """``feed``, possibly waiting for a VAD shared with other sessions (``realtime.turns.vad_batch``)."""
        ...

    def reset(self) -> None: ...


SpeechDetectorFactory = Callable[[ServerVadParams], SpeechDetector]
"""Makes the detector of one ``server_vad`` configuration (the server passes ``lambda p: TurnDetector(p, vad)``)."""


@dataclass
class _Running:
    """The running detector; its clock starts at ``offset_ms`` of the session's clock. The decoder is made for the
    first chunk and again whenever the client switches formats."""

    detector: SpeechDetector
    offset_ms: int
    decoder: AudioDecoder | None = None
    decoder_format: AudioFormat | None = None


def _shift(event: TurnEvent, offset_ms: int) -> TurnEvent:
    if isinstance(event, SpeechStarted):
        return dataclasses.replace(
            event, audio_start_ms=event.audio_start_ms + offset_ms, speech_start_ms=event.speech_start_ms + offset_ms
        )
    if isinstance(event, SpeechResumed):
        return dataclasses.replace(event, speech_start_ms=event.speech_start_ms + offset_ms)
    return dataclasses.replace(
        event, audio_end_ms=event.audio_end_ms + offset_ms, speech_end_ms=event.speech_end_ms + offset_ms
    )


class SpeechDetection:
    """The turn detection of one session: off until :meth:`configure` starts it. Used from the session's reader only
    (one chunk at a time, in arrival order); holds no task."""

    def __init__(self, detector_factory: SpeechDetectorFactory, decoder_factory: DecoderFactory) -> None:
        self._detector_factory = detector_factory
        self._decoder_factory = decoder_factory
        self._running: _Running | None = None

    @property
    def active(self) -> bool:
        """Whether a detector runs."""
        return self._running is not None

    def configure(self, params: ServerVadParams | None, start_ms: int) -> None:
        """(Re)start detection with ``params`` (``None``: stop), its clock at ``start_ms`` of the session's clock. A
        restarted detector is a fresh stream: it forgets any speech in progress, and what a shared VAD model saw."""
        self._running = None
        if params is not None:
            detector = self._detector_factory(params)
            detector.reset()
            self._running = _Running(detector, start_ms)

    async def detect(self, audio: bytes, fmt: AudioFormat) -> list[TurnEvent]:
        """The turn events of one chunk of client audio (wire bytes in ``fmt``), in ms on the session's audio clock;
        none when detection is off (it was turned off after this audio was accepted). With the server's batched VAD
        the frames are scored on its VAD thread, in calls shared with other sessions. A detector's failure is raised
        (a bug: the caller's session ends)."""
        running = self._running
        if running is None:
            return []
        if running.decoder is None or running.decoder_format is not fmt:
            running.decoder = self._decoder_factory(fmt)
            running.decoder_format = fmt
        events = await running.detector.afeed(running.decoder.decode(audio))
        return [_shift(event, running.offset_ms) for event in events]
