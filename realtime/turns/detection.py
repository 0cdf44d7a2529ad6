"""Speech detection of one session: the turn detector made from the session's ``server_vad`` settings, fed each chunk
of client audio (wire bytes, decoded here to 16 kHz), its events shifted onto the session's audio clock.

:class:`SpeechDetection` is the runner's part (``realtime.runner.SessionRunner`` feeds the events it returns to its
session); :class:`SpeechDetector` is what it runs (``realtime.turns.server_vad.TurnDetector`` is one, over a VAD of
its own or one shared with other sessions through ``realtime.turns.vad_batch``). A detector may also decide events
between chunks (:class:`DeferredEvents`: ``semantic_vad``'s turn model answers in a task of the detector's own);
:class:`SpeechDetection` hands those to its ``on_late`` callback the moment they are decided.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

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


@runtime_checkable
class DeferredEvents(Protocol):
    """A detector that also decides events between chunks (``realtime.turns.semantic_detector``). Its events, from
    ``afeed`` or :meth:`take`, are in order either way."""

    def listen(self, ready: Callable[[], None]) -> None:
        """Call ``ready()`` (on the event loop) when events were decided outside ``afeed``."""
        ...

    def take(self) -> list[TurnEvent]:
        """The events decided and not yet returned, in order."""
        ...

    def close(self) -> None:
        """Stop deciding: cancel the detector's tasks; ``ready`` is never called after."""
        ...

    async def aclose(self) -> None:
        """:meth:`close`, then wait for its tasks to end."""
        ...


SpeechDetectorFactory = Callable[[ServerVadParams], SpeechDetector]
"""Makes the detector of one ``server_vad`` or ``semantic_vad`` configuration (the server's makes a
``TurnDetector`` for the first, a ``SemanticTurnDetector`` for the second)."""


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
    (one chunk at a time, in arrival order). Holds no task itself; a :class:`DeferredEvents` detector's tasks end
    when it is replaced (:meth:`configure`) or closed (:meth:`aclose`, at the session's end).

    ``on_late(events)``: the events a :class:`DeferredEvents` detector decided between chunks, shifted onto the
    session's clock, called on the event loop as they are decided (possibly while :meth:`detect` awaits); without
    it they come with the next chunk's events."""

    def __init__(
        self,
        detector_factory: SpeechDetectorFactory,
        decoder_factory: DecoderFactory,
        *,
        on_late: Callable[[list[TurnEvent]], None] | None = None,
    ) -> None:
        self._detector_factory = detector_factory
        self._decoder_factory = decoder_factory
        self._on_late = on_late
        self._running: _Running | None = None

    @property
    def active(self) -> bool:
        """Whether a detector runs."""
        return self._running is not None

    def configure(self, params: ServerVadParams | None, start_ms: int) -> None:
        """(Re)start detection with ``params`` (``None``: stop), its clock at ``start_ms`` of the session's clock. A
        restarted detector is a fresh stream: it forgets any speech in progress, and what a shared VAD model saw."""
        self._stop()
        if params is not None:
            detector = self._detector_factory(params)
            detector.reset()
            running = _Running(detector, start_ms)
            self._running = running
            if isinstance(detector, DeferredEvents) and self._on_late is not None:
                detector.listen(lambda: self._late(running))

    async def aclose(self) -> None:
        """The session ended: stop detecting and wait for the detector's tasks to end."""
        running, self._running = self._running, None
        if running is not None and isinstance(running.detector, DeferredEvents):
            await running.detector.aclose()

    def _stop(self) -> None:
        running, self._running = self._running, None
        if running is not None and isinstance(running.detector, DeferredEvents):
            running.detector.close()

    def _late(self, running: _Running) -> None:
        if running is not self._running or self._on_late is None or not isinstance(running.detector, DeferredEvents):
            return
        events = running.detector.take()
        if events:
            self._on_late([_shift(event, running.offset_ms) for event in events])

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
