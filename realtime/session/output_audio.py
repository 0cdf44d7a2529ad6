"""Reply audio in the session, by :class:`~realtime.session.settings.AudioTransport`.

``EVENTS`` (WebSocket): encoded to the response's output format and sent as base64 ``response.output_audio.delta``
events; stopping it drops the deltas still queued (:class:`~realtime.session.commands.DropQueuedAudio`). ``MEDIA``
(WebRTC): :class:`~realtime.session.commands.PlayAudio` actions for the output track, announced by
``output_audio_buffer.started``; stopping it clears the track (:class:`~realtime.session.commands.ClearOutputAudio`,
``output_audio_buffer.cleared``), and the end of playback is reported back (``output_audio_buffer.stopped``).
"""

from __future__ import annotations

import base64

from pipeline.response_events import OUTPUT_SAMPLE_RATE, AudioChunk
from realtime.errors import RealtimeError
from realtime.protocol.client import OutputAudioClear
from realtime.protocol.codes import ErrorCode
from realtime.protocol.model import OutputModality
from realtime.session.commands import Action, ClearOutputAudio, DropQueuedAudio, PlayAudio
from realtime.session.responses import ResponsePhase, _Response
from realtime.session.settings import AudioTransport


class OutputAudio:
    """Reply audio (mixed into :class:`realtime.session.Session`). Owns which response's audio last reached the
    listener (``_audio_response_id``; None once it was stopped or, for WebRTC, finished playing); uses the session's
    ``_emit``, ``_send``, ``_drain``, ``_events``, ``settings``, the responses (``_response``, ``_announce_message``)
    and the turn state (``_speaking``, ``_idle``, ``_clock_ms``)."""

    _audio_response_id: str | None

    def playback_stopped(self, response_id: str) -> list[Action]:
        """WebRTC: the output track played the last audio of ``response_id``."""
        if self._audio_response_id == response_id:
            self._audio_response_id = None
            self._send(self._events.output_audio_buffer_stopped(response_id))
            if self._response is None and not self._speaking:
                self._idle.start(self._clock_ms)
        return self._drain()

    def _output_audio_clear(self, event: OutputAudioClear) -> None:
        if self.settings.audio_transport is not AudioTransport.MEDIA:
            raise RealtimeError(
                "output_audio_buffer.clear is for WebRTC sessions; over a WebSocket the client owns playback",
                code=ErrorCode.UNSUPPORTED_EVENT,
                param="type",
            )
        if self._audio_response_id is None:
            raise RealtimeError("no response audio is playing", code=ErrorCode.OUTPUT_AUDIO_BUFFER_EMPTY)
        self._stop_output_audio(self._audio_response_id)

    def _stop_output_audio(self, response_id: str) -> None:
        """Nothing more of this response's audio may reach the listener."""
        self._audio_response_id = None
        if self.settings.audio_transport is AudioTransport.MEDIA:
            self._emit(ClearOutputAudio(response_id))
            self._send(self._events.output_audio_buffer_cleared(response_id))
        else:
            self._emit(DropQueuedAudio(response_id))

    def _audio_chunk(self, response: _Response, event: AudioChunk) -> None:
        # Audio after the cancel decision is never sent; audio of a text response is not either
        # (the engine was asked for text only, so this is defensive).
        if response.phase is ResponsePhase.CANCELLING or response.modality is OutputModality.TEXT:
            return
        if not response.announced:
            self._announce_message(response)
        if self.settings.audio_transport is AudioTransport.MEDIA:
            if self._audio_response_id != response.id:
                self._audio_response_id = response.id
                self._send(self._events.output_audio_buffer_started(response.id))
            response.part.audio_ms += 1000.0 * len(event.pcm) / OUTPUT_SAMPLE_RATE
            self._emit(PlayAudio(response.id, event.pcm))
            return
        assert response.encoder is not None
        self._send_audio(response, response.encoder.encode(event.pcm))

    def _send_audio(self, response: _Response, data: bytes) -> None:
        if not data:
            return  # the resampler is still filling its window
        self._audio_response_id = response.id
        if response.first_audio_ms is None:
            response.first_audio_ms = self._clock_ms
        response.part.audio_ms += response.output_format.duration_ms(len(data))
        self._send(self._events.audio_delta(response.ref, base64.b64encode(data).decode("ascii")))
