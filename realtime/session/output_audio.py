"""Reply audio, by :class:`~realtime.session.settings.AudioTransport`.

``EVENTS`` (WebSocket): encoded to the response's output format and sent as base64 ``response.output_audio.delta``
events; stopping it drops the deltas still queued (:class:`~realtime.session.commands.DropQueuedAudio`). ``MEDIA``
(WebRTC): :class:`~realtime.session.commands.PlayAudio` actions for the output track, announced by
``output_audio_buffer.started``; stopping it clears the track (:class:`~realtime.session.commands.ClearOutputAudio`,
``output_audio_buffer.cleared``), and the end of playback is reported back (``output_audio_buffer.stopped``).
"""

from __future__ import annotations

import base64

import numpy as np

from pipeline.response_events import OUTPUT_SAMPLE_RATE
from realtime.errors import RealtimeError
from realtime.protocol.codes import ErrorCode
from realtime.protocol.server import ServerEvents
from realtime.session.commands import ClearOutputAudio, DropQueuedAudio, PlayAudio
from realtime.session.emitter import AudioClock, Emitter
from realtime.session.response_state import ActiveResponse
from realtime.session.settings import AudioTransport, SessionSettings


class OutputAudio:
    """Owns which response's audio last reached the listener (:attr:`playing`; None once it was stopped or, for
    WebRTC, finished playing). The caller has checked that the response may still send audio."""

    def __init__(self, settings: SessionSettings, events: ServerEvents, out: Emitter, clock: AudioClock) -> None:
        self._transport = settings.audio_transport
        self._events = events
        self._out = out
        self._clock = clock
        self._playing: str | None = None

    @property
    def playing(self) -> str | None:
        """The response whose audio last reached the listener and was not stopped."""
        return self._playing

    def play(self, response: ActiveResponse, pcm: np.ndarray) -> None:
        """The next float32 24 kHz audio of ``response`` (its message is announced)."""
        if self._transport is AudioTransport.MEDIA:
            if self._playing != response.id:
                self._playing = response.id
                self._out.send(self._events.output_audio_buffer_started(response.id))
            response.part.audio_ms += 1000.0 * len(pcm) / OUTPUT_SAMPLE_RATE
            self._out.emit(PlayAudio(response.id, pcm))
            return
        assert response.encoder is not None
        self._send(response, response.encoder.encode(pcm))

    def flush(self, response: ActiveResponse) -> None:
        """``response`` completed: send what its encoder still holds (WebSocket)."""
        if response.encoder is not None:
            self._send(response, response.encoder.flush())

    def stop(self, response_id: str | None = None) -> None:
        """Nothing more of the playing response's audio may reach the listener (only if it is ``response_id``,
        when given)."""
        playing = self._playing
        if playing is None or response_id not in (None, playing):
            return
        self._playing = None
        if self._transport is AudioTransport.MEDIA:
            self._out.emit(ClearOutputAudio(playing))
            self._out.send(self._events.output_audio_buffer_cleared(playing))
        else:
            self._out.emit(DropQueuedAudio(playing))

    def forget(self, response_id: str) -> None:
        """``response_id`` was withdrawn unseen: it is not playing (nothing to stop)."""
        if self._playing == response_id:
            self._playing = None

    def clear_request(self) -> None:
        """``output_audio_buffer.clear`` (WebRTC only; ``output_audio_buffer_empty`` when nothing plays)."""
        if self._transport is not AudioTransport.MEDIA:
            raise RealtimeError(
                "output_audio_buffer.clear is for WebRTC sessions; over a WebSocket the client owns playback",
                code=ErrorCode.UNSUPPORTED_EVENT,
                param="type",
            )
        if self._playing is None:
            raise RealtimeError("no response audio is playing", code=ErrorCode.OUTPUT_AUDIO_BUFFER_EMPTY)
        self.stop()

    def playback_stopped(self, response_id: str) -> bool:
        """WebRTC: the output track played the last audio of ``response_id``; whether that was the playing one
        (``output_audio_buffer.stopped`` is sent then)."""
        if self._playing != response_id:
            return False
        self._playing = None
        self._out.send(self._events.output_audio_buffer_stopped(response_id))
        return True

    def _send(self, response: ActiveResponse, data: bytes) -> None:
        if not data:
            return  # the resampler is still filling its window
        self._playing = response.id
        if response.first_audio_ms is None:
            response.first_audio_ms = self._clock.clock_ms
        response.part.audio_ms += response.output_format.duration_ms(len(data))
        self._out.send(self._events.audio_delta(response.ref, base64.b64encode(data).decode("ascii")))
