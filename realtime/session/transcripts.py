"""Input transcription (``audio.input.transcription`` set).

Every committed input audio buffer is followed by a :class:`~realtime.session.commands.Transcribe` action, emitted
after the response the commit starts (if any) so that whoever runs it can see that a reply is pending; a preemptive
reply's commit holds it with the reply's client events. Transcription results for an item that was deleted meanwhile
are dropped.
"""

from __future__ import annotations

from pipeline.response_events import Usage
from realtime.errors import to_error_payload
from realtime.observe.error_log import log_error_event
from realtime.protocol.server import ServerEvents
from realtime.session.commands import Transcribe
from realtime.session.emitter import ConfigView, Emitter
from realtime.session.mirror import ItemMirror


class InputTranscription:
    """Asks for transcripts of committed messages and turns their results into events (and into the mirrored
    content part's ``transcript``). No state of its own."""

    def __init__(
        self, config: ConfigView, events: ServerEvents, out: Emitter, mirror: ItemMirror, session_id: str
    ) -> None:
        self._config = config
        self._events = events
        self._out = out
        self._mirror = mirror
        self._session_id = session_id

    def request(self, item_id: str) -> None:
        """Ask for the committed message's transcript, when input transcription is on."""
        settings = self._config.config.transcription
        if settings is not None:
            self._out.emit(Transcribe(item_id, 0, settings.language, settings.prompt))

    def delta(self, item_id: str, content_index: int, delta: str) -> None:
        """More of the transcript of a :class:`Transcribe` job."""
        if delta and self._mirror.input_audio_part(item_id, content_index) is not None:
            self._out.send(self._events.input_transcription_delta(item_id, content_index, delta))

    def completed(self, item_id: str, content_index: int, transcript: str, usage: Usage) -> None:
        """A job's whole transcript: it becomes the content part's ``transcript``."""
        part = self._mirror.input_audio_part(item_id, content_index)
        if part is not None:
            part.transcript = transcript
            self._out.send(self._events.input_transcription_completed(item_id, content_index, transcript, usage))

    def failed(self, item_id: str, content_index: int, exc: Exception) -> None:
        """A job failed: ``...input_audio_transcription.failed`` with the error (logged like an ``error`` event)."""
        if self._mirror.input_audio_part(item_id, content_index) is not None:
            payload = to_error_payload(exc)
            log_error_event(payload, session_id=self._session_id, answers=None)
            error = {key: payload[key] for key in ("type", "code", "message", "param")}
            self._out.send(self._events.input_transcription_failed(item_id, content_index, error))
