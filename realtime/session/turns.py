"""Server turn detection in the session (``turn_detection`` ``server_vad``): the detector's speech events, barge-in
and the idle timeout.

``SpeechStarted`` sends the held audio from ``audio_start_ms`` on and, with ``interrupt_response``, cancels the
response in progress and stops the audio the user talks over; ``SpeechStopped`` commits the message and, with
``create_response``, starts a reply (or has one start once the cancelled one ends). A commit or clear by the client
during speech restarts the detector so that it never reports that turn's end. Pauses (``SpeechPaused`` /
``SpeechResumed``) go to :mod:`realtime.session.preemptive`.

:class:`SpeechAndIdle` is whether the user is speaking and since when the assistant has been idle; the responses tell it
when a reply starts and ends (:class:`realtime.session.responses.AssistantActivity`). :class:`TurnTracker` applies the
detector's events and the idle timeout.
"""

from __future__ import annotations

from realtime.protocol.audio_format import AudioFormat
from realtime.protocol.model import ResponseParams
from realtime.protocol.server import ServerEvents
from realtime.protocol.turn_detection import ServerVadParams
from realtime.session.commands import ConfigureTurnDetection, DetectSpeech
from realtime.session.emitter import ConfigView, Emitter
from realtime.session.input_audio import InputAudio
from realtime.session.output_audio import OutputAudio
from realtime.session.preemptive import PreemptiveReplies
from realtime.session.responses import Responses
from realtime.session.transcripts import InputTranscription
from realtime.turns.idle import IdleTimer
from realtime.turns.server_vad import SpeechPaused, SpeechResumed, SpeechStarted, SpeechStopped, TurnEvent


class SpeechAndIdle:
    """Whether the user is speaking, and since when the assistant has been idle (``server_vad.idle_timeout_ms``,
    :mod:`realtime.turns.idle`): idle starts when a reply ends while the user is silent, and stops when speech or a
    reply starts."""

    def __init__(self) -> None:
        self._speaking = False
        self._idle = IdleTimer()

    @property
    def speaking(self) -> bool:
        return self._speaking

    def speech_started(self) -> None:
        self._speaking = True
        self._idle.stop()

    def speech_ended(self) -> None:
        self._speaking = False

    def reply_started(self) -> None:
        self._idle.stop()

    def reply_ended(self, at_ms: float) -> None:
        """The assistant finished at ``at_ms`` of the audio clock (its audio played): idle from then, unless the
        user is speaking (their turn's end decides)."""
        if not self._speaking:
            self._idle.start(at_ms)

    def idle_due(self, now_ms: float, timeout_ms: int | None) -> float | None:
        """Where the idle stretch began, if it has lasted ``timeout_ms`` at ``now_ms``; the stretch then ends."""
        since = self._idle.since_ms
        if since is None or not self._idle.due(now_ms, timeout_ms):
            return None
        self._idle.stop()
        return since


class TurnTracker:
    """Applies turn detection to the input buffer and the responses. Its state is ``state``'s; the detector it
    drives is configured by its :class:`ConfigureTurnDetection` actions (clock: the input buffer's)."""

    def __init__(
        self,
        config: ConfigView,
        events: ServerEvents,
        out: Emitter,
        *,
        state: SpeechAndIdle,
        input_audio: InputAudio,
        responses: Responses,
        audio: OutputAudio,
        transcription: InputTranscription,
        preemptive: PreemptiveReplies,
    ) -> None:
        self._config = config
        self._events = events
        self._out = out
        self._state = state
        self._input = input_audio
        self._responses = responses
        self._audio = audio
        self._transcription = transcription
        self._preemptive = preemptive

    def turn_event(self, event: TurnEvent) -> None:
        """Speech started/stopped/paused/resumed, from the detector configured last. Events arriving after detection
        was turned off are stale and ignored, and so are all but a start while the user is not speaking."""
        vad = self._config.config.turn_detection
        if vad is None:
            return
        if isinstance(event, SpeechStarted):
            self._speech_started(event, vad)
        elif not self._state.speaking:
            pass
        elif isinstance(event, SpeechPaused):
            self._preemptive.pause(vad)
        elif isinstance(event, SpeechResumed):
            self._preemptive.withdraw()
        else:
            self._speech_stopped(event, vad)

    def audio_appended(self, audio: bytes, fmt: AudioFormat) -> None:
        """An appended chunk (already in the buffer, or kept aside): the idle timeout, then the detector hears it."""
        vad = self._config.config.turn_detection
        if vad is not None:
            self._idle_timeout(vad)
            self._out.emit(DetectSpeech(audio, fmt))

    def detection_changed(self, params: ServerVadParams | None) -> None:
        """``session.update`` changed ``turn_detection``: restart (or stop) the detector; for manual turns
        everything in the buffer is the user's message."""
        self._state.speech_ended()
        if params is None:
            self._input.stream_held()
        self._out.emit(ConfigureTurnDetection(params, int(self._input.clock_ms)))

    def restart_if_speaking(self) -> None:
        """The turn in progress was committed or dropped by the client: the detector must not report its end later."""
        if self._state.speaking:
            self._state.speech_ended()
            self._out.emit(ConfigureTurnDetection(self._config.config.turn_detection, int(self._input.clock_ms)))

    def _idle_timeout(self, vad: ServerVadParams) -> None:
        """``idle_timeout_ms`` after the assistant finished speaking with no speech since: ``timeout_triggered``, then
        the held (silent) audio is committed and, unless ``create_response`` is off, a response is asked for. The
        committed item holds the last ``prefix_padding_ms`` (plus the detector's look-back) of the silence, not all
        of it: silence is kept out of the model's context."""
        if self._state.speaking or self._responses.active is not None or self._preemptive.tentative:
            return
        clock_ms = self._input.clock_ms
        if self._input.duration_ms <= 0:
            return
        since = self._state.idle_due(clock_ms, vad.idle_timeout_ms)
        if since is None:
            return
        self._out.send(self._events.timeout_triggered(int(since), int(clock_ms), self._input.item_id()))
        self._input.commit()
        if vad.create_response:
            self._responses.start(ResponseParams())

    def _speech_started(self, event: SpeechStarted, vad: ServerVadParams) -> None:
        self._state.speech_started()
        self._input.stream_held(after_ms=event.audio_start_ms)
        self._out.send(self._events.speech_started(event.audio_start_ms, self._input.item_id()))
        if vad.interrupt_response:  # barge-in: cancel the reply and stop the audio the user talks over
            self._responses.interrupt()
            self._audio.stop()  # an earlier response may still be playing

    def _speech_stopped(self, event: SpeechStopped, vad: ServerVadParams) -> None:
        shown = self._preemptive.show()
        self._state.speech_ended()
        if shown is not None:  # the reply started at the pause stands: the client now sees it, as if started here
            self._out.send(self._events.speech_stopped(event.audio_end_ms, shown.item_id))
            self._out.release(shown.held)
            return
        self._out.send(self._events.speech_stopped(event.audio_end_ms, self._input.item_id()))
        if self._input.duration_ms <= 0:
            return
        item_id = self._input.commit().item_id
        if vad.create_response:
            self._responses.reply_to_turn()
        self._transcription.request(item_id)
