"""Server turn detection in the session (``turn_detection`` ``server_vad``): the detector's speech events, barge-in
and the idle timeout.

``SpeechStarted`` sends the held audio from ``audio_start_ms`` on and, with ``interrupt_response``, cancels the
response in progress and stops the audio the user talks over; ``SpeechStopped`` commits the message and, with
``create_response``, starts a reply (or has one start once the cancelled one ends). A commit or clear by the client
during speech restarts the detector so that it never reports that turn's end. Pauses (``SpeechPaused`` /
``SpeechResumed``) are :mod:`realtime.session.preemptive`'s.
"""

from __future__ import annotations

from realtime.protocol.codes import StatusReason
from realtime.protocol.model import ResponseParams
from realtime.protocol.turn_detection import ServerVadParams
from realtime.session.commands import Action, ConfigureTurnDetection, Preemption, PreemptiveReply
from realtime.session.responses import ResponsePhase
from realtime.turns.idle import IdleTimer
from realtime.turns.server_vad import SpeechPaused, SpeechResumed, SpeechStarted, SpeechStopped, TurnEvent


class TurnDetection:
    """Turn detection (mixed into :class:`realtime.session.Session`). Owns whether the user is speaking (``_speaking``)
    and since when the assistant has been idle (``_idle``, for ``server_vad.idle_timeout_ms``); uses the session's
    ``_emit``, ``_send``, ``_drain``, ``_out``, ``_events``, ``config``, the input buffer (``_buffer``, ``_clock_ms``,
    ``_commit``, ``_stream_held``, ``_buffer_item_id``), the responses (``_response``, ``_start_response``, ``_cancel``,
    ``_auto_response_pending``), output audio (``_audio_response_id``, ``_stop_output_audio``), transcription
    (``_transcribe``) and the preemptive reply (``_tentative``, ``_speech_paused``, ``_withdraw``)."""

    _speaking: bool
    _idle: IdleTimer

    def turn_event(self, event: TurnEvent) -> list[Action]:
        """Speech started/stopped, from the detector configured by the last ConfigureTurnDetection.
        Events arriving after detection was turned off are stale and ignored."""
        vad = self.config.turn_detection
        if vad is not None:
            if isinstance(event, SpeechStarted):
                self._speech_started(event, vad)
            elif not self._speaking:
                pass
            elif isinstance(event, SpeechPaused):
                self._speech_paused(vad)
            elif isinstance(event, SpeechResumed):
                self._withdraw()
            else:
                self._speech_stopped(event, vad)
        return self._drain()

    def _turn_detection_changed(self, params: ServerVadParams | None) -> None:
        self._speaking = False
        if params is None:
            self._stream_held()  # manual turns: everything in the buffer is the user's message
        self._emit(ConfigureTurnDetection(params, int(self._clock_ms)))

    def _restart_detection_if_speaking(self) -> None:
        """The turn in progress was committed or dropped by the client: the detector must not
        report its end later."""
        if self._speaking:
            self._speaking = False
            self._emit(ConfigureTurnDetection(self.config.turn_detection, int(self._clock_ms)))

    def _idle_timeout(self, vad: ServerVadParams) -> None:
        """``idle_timeout_ms`` after the assistant finished speaking with no speech since (:mod:`realtime.turns.idle`):
        ``timeout_triggered``, then the held (silent) audio is committed and, unless ``create_response`` is off, a
        response is asked for. The committed item holds the last ``prefix_padding_ms`` (plus the detector's
        look-back) of the silence, not all of it: silence is kept out of the model's context."""
        if self._speaking or self._response is not None or self._tentative is not None:
            return
        since = self._idle.since_ms
        if since is None or not self._idle.due(self._clock_ms, vad.idle_timeout_ms) or self._buffer.duration_ms <= 0:
            return
        self._idle.stop()
        self._send(self._events.timeout_triggered(int(since), int(self._clock_ms), self._buffer_item_id()))
        self._commit()
        if vad.create_response:
            self._start_response(ResponseParams())

    def _speech_started(self, event: SpeechStarted, vad: ServerVadParams) -> None:
        self._speaking = True
        self._idle.stop()
        self._stream_held(after_ms=event.audio_start_ms)
        self._send(self._events.speech_started(event.audio_start_ms, self._buffer_item_id()))
        if vad.interrupt_response:
            self._interrupt()

    def _speech_stopped(self, event: SpeechStopped, vad: ServerVadParams) -> None:
        t, self._tentative = self._tentative, None
        if t is not None:  # the reply started at the pause stands: the client now sees it, as if started here
            self._speaking = False
            self._emit(PreemptiveReply(t.response_id, Preemption.SHOWN))  # before its held audio goes out
            self._send(self._events.speech_stopped(event.audio_end_ms, t.buffer.item_id))
            self._out.extend(t.held)
            return
        self._speaking = False
        self._send(self._events.speech_stopped(event.audio_end_ms, self._buffer_item_id()))
        if self._buffer.duration_ms <= 0:
            return
        item_id = self._commit()
        if vad.create_response:
            if self._response is None:
                self._start_response(ResponseParams())
            elif self._response.phase is ResponsePhase.CANCELLING:
                self._auto_response_pending = True
            # else: a response the user did not interrupt (interrupt_response false) keeps going and
            # no new one starts, as in the OpenAI API.
        self._transcribe(item_id)

    def _interrupt(self) -> None:
        """Barge-in: cancel the response in progress and stop the audio the user talks over."""
        if self._response is not None and self._response.phase is ResponsePhase.IN_PROGRESS:
            self._cancel(self._response, StatusReason.TURN_DETECTED)
        if self._audio_response_id is not None:  # an earlier response may still be playing
            self._stop_output_audio(self._audio_response_id)
