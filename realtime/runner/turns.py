"""Server turn detection of one session: the detector made from the session's settings and fed each chunk of client
audio, its events shifted onto the session's clock: the :class:`TurnDetection` part of
:class:`~realtime.runner.SessionRunner`."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from realtime.protocol.audio_format import AudioFormat
from realtime.runner.contracts import (
    AudioDecoder,
    TurnDetector,
)
from realtime.session import (
    Action,
    ConfigureTurnDetection,
    DetectSpeech,
    TurnEvent,
)
from realtime.turns.server_vad import SpeechResumed, SpeechStarted


@dataclass
class _Detection:
    """The running turn detector; its clock starts at ``offset_ms`` of the session's clock."""

    detector: TurnDetector
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


class TurnDetection:
    """Turn detection of :class:`~realtime.runner.SessionRunner`: the running detector (``_detection``, ``None`` while
    detection is off) over the runner's detector and decoder factories."""

    def _configure_detection(self, action: ConfigureTurnDetection) -> None:
        self._detection = None
        if action.params is not None:
            detector = self._turn_detector_factory(action.params)
            detector.reset()  # a fresh stream: forget what a shared VAD model saw before
            self._detection = _Detection(detector, action.start_ms)

    async def _detect(self, action: DetectSpeech) -> list[Action]:
        """The turn events of one chunk of client audio, as session actions. With the server's batched VAD
        (``realtime.turns.vad_batch``) the frames are scored on its VAD thread, in calls shared with other sessions."""
        detection = self._detection
        if detection is None:
            return []  # detection was turned off after this audio was accepted
        if detection.decoder is None or detection.decoder_format is not action.format:
            detection.decoder = self._decoder_factory(action.format)
            detection.decoder_format = action.format
        events = await detection.detector.afeed(detection.decoder.decode(action.audio))
        return self._turn_actions(detection, events)

    def _turn_actions(self, detection: _Detection, events: list[TurnEvent]) -> list[Action]:
        actions: list[Action] = []
        for event in events:
            actions.extend(self.session.turn_event(_shift(event, detection.offset_ms)))
        return actions

    async def _dispatch_received(self, actions: list[Action]) -> None:
        """:meth:`_dispatch` for a client message's actions, speech detection included (:meth:`_detect`). The reader
        awaits each chunk's turn events before the next message, so a session's actions keep their order while other
        sessions' readers run."""
        for action in actions:
            if isinstance(action, DetectSpeech):
                self._dispatch(await self._detect(action))
            else:
                self._dispatch([action])
