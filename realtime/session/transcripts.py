"""Input transcription in the session (``audio.input.transcription`` set).

Every committed input audio buffer is followed by a :class:`~realtime.session.commands.Transcribe` action, emitted
after the response the commit starts (if any) so that whoever runs it can see that a reply is pending; a preemptive
reply's commit holds it with the reply's client events. Transcription results for an item that was deleted meanwhile
are dropped.
"""

from __future__ import annotations

from pipeline.response_events import Usage
from realtime.errors import to_error_payload
from realtime.observe.error_log import log_error_event
from realtime.protocol.model import ContentPart
from realtime.protocol.names import ContentType
from realtime.session.commands import Action, Transcribe


class InputTranscription:
    """Input transcription (mixed into :class:`realtime.session.Session`): asks for transcripts and turns their
    results into events. No state of its own; uses the session's ``_emit``, ``_send``, ``_drain``, ``_events``,
    ``_items``, ``config`` and ``session_id``."""

    def transcription_delta(self, item_id: str, content_index: int, delta: str) -> list[Action]:
        """More of the transcript of a :class:`Transcribe` job."""
        if delta and self._transcribed_part(item_id, content_index) is not None:
            self._send(self._events.input_transcription_delta(item_id, content_index, delta))
        return self._drain()

    def transcription_completed(self, item_id: str, content_index: int, transcript: str, usage: Usage) -> list[Action]:
        """A :class:`Transcribe` job's whole transcript: it becomes the content part's ``transcript``."""
        part = self._transcribed_part(item_id, content_index)
        if part is not None:
            part.transcript = transcript
            self._send(self._events.input_transcription_completed(item_id, content_index, transcript, usage))
        return self._drain()

    def transcription_failed(self, item_id: str, content_index: int, exc: Exception) -> list[Action]:
        """A :class:`Transcribe` job failed: ``...input_audio_transcription.failed`` with the error (logged like an
        ``error`` event)."""
        if self._transcribed_part(item_id, content_index) is not None:
            payload = to_error_payload(exc)
            log_error_event(payload, session_id=self.session_id, answers=None)
            error = {key: payload[key] for key in ("type", "code", "message", "param")}
            self._send(self._events.input_transcription_failed(item_id, content_index, error))
        return self._drain()

    def _transcribed_part(self, item_id: str, content_index: int) -> ContentPart | None:
        """The input audio part a transcription is for; None once its item is deleted."""
        item = self._items.get(item_id)
        if item is None or content_index >= len(item.content):
            return None
        part = item.content[content_index]
        return part if part.type is ContentType.INPUT_AUDIO else None

    def _transcribe(self, item_id: str) -> None:
        """Ask for the committed message's transcript, when input transcription is on."""
        settings = self.config.transcription
        if settings is not None:
            self._emit(Transcribe(item_id, 0, settings.language, settings.prompt))
