"""The session's input audio buffer: ``input_audio_buffer.append`` / ``commit`` / ``clear``.

In manual mode (``turn_detection: null``) every appended chunk goes to the engine at once. With ``server_vad`` the
audio before speech is held back (prefix padding plus ``SessionLimits.vad_lookback_ms`` for the detector's latency)
and only the part from the detected ``audio_start_ms`` on reaches the engine (:meth:`InputAudio._stream_held`), so
silence never fills the model's context. While a preemptive reply is tentative, appended audio is kept aside
(:mod:`realtime.session.preemptive`).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from realtime.errors import InvalidAudioData, RealtimeError
from realtime.ids import IdKind
from realtime.protocol.audio_format import AudioFormat
from realtime.protocol.client import InputAudioAppend, InputAudioClear, InputAudioCommit
from realtime.protocol.codes import ErrorCode
from realtime.protocol.model import ContentPart, Item, Role
from realtime.protocol.names import ContentType
from realtime.session.commands import AppendAudio, ClearAudio, CommitAudio, DetectSpeech


@dataclass(frozen=True)
class _Chunk:
    audio: bytes
    format: AudioFormat
    end_ms: float
    duration_ms: float


@dataclass
class _InputBuffer:
    """The user message being spoken. ``opened``: some of it went to the engine as ``item_id``;
    ``held`` chunks (server_vad, before speech) did not, yet."""

    item_id: str | None = None
    opened: bool = False
    sent_ms: float = 0.0
    held: deque[_Chunk] = field(default_factory=deque)
    sent: list[_Chunk] = field(default_factory=list)
    """The chunks that went to the engine, kept until the commit when ``SessionSettings.preemptive_replies`` is on: a
    withdrawn preemptive reply sends them again."""

    @property
    def duration_ms(self) -> float:
        return self.sent_ms + sum(c.duration_ms for c in self.held)

    def hold(self, chunk: _Chunk, keep_ms: float) -> None:
        """Hold ``chunk``, forgetting chunks that ended more than ``keep_ms`` before it did."""
        self.held.append(chunk)
        while self.held and self.held[0].end_ms <= chunk.end_ms - keep_ms:
            self.held.popleft()


class InputAudio:
    """The input audio buffer (mixed into :class:`realtime.session.Session`). Owns the buffer and the session's audio
    clock (all audio ever appended, in ms: the turn detector's clock too); uses the session's ``_emit``, ``_send``,
    ``_new_id``, ``_add_item``, ``_events``, ``config``, ``settings``, and the turn state (``_speaking``,
    ``_tentative``, ``_idle_timeout``, ``_restart_detection_if_speaking``, ``_transcribe``)."""

    _buffer: _InputBuffer
    _clock_ms: float

    def _append(self, event: InputAudioAppend) -> None:
        fmt = self.config.input_format
        if len(event.audio) % fmt.bytes_per_sample:
            raise InvalidAudioData(
                f"{fmt.value} audio has {fmt.bytes_per_sample} bytes per sample; got {len(event.audio)} bytes",
                param="audio",
            )
        if not event.audio:
            return
        ms = fmt.duration_ms(len(event.audio))
        limit = self.settings.limits.max_buffer_ms
        if self._buffer.duration_ms + ms > limit:
            raise RealtimeError(
                f"the input audio buffer holds at most {limit} ms; commit or clear it",
                code=ErrorCode.INPUT_AUDIO_BUFFER_FULL,
                param="audio",
            )
        self._clock_ms += ms
        chunk = _Chunk(event.audio, fmt, self._clock_ms, ms)
        vad = self.config.turn_detection
        if self._tentative is not None:
            self._tentative.after.append(chunk)  # not heard by the tentative reply; the message's if it is withdrawn
        elif vad is None or self._buffer.opened or self._speaking:
            self._stream(chunk)
        else:
            self._buffer.hold(chunk, vad.prefix_padding_ms + self.settings.limits.vad_lookback_ms)
        if vad is not None:
            self._idle_timeout(vad)
            self._emit(DetectSpeech(event.audio, fmt))

    def _buffer_item_id(self) -> str:
        if self._buffer.item_id is None:
            self._buffer.item_id = self._new_id(IdKind.ITEM)
        return self._buffer.item_id

    def _stream(self, chunk: _Chunk) -> None:
        start_ms = chunk.end_ms - chunk.duration_ms
        self._emit(AppendAudio(self._buffer_item_id(), chunk.audio, chunk.format, start_ms=start_ms))
        self._buffer.opened = True
        self._buffer.sent_ms += chunk.duration_ms
        if self.settings.preemptive_replies:
            self._buffer.sent.append(chunk)

    def _stream_held(self, after_ms: float = float("-inf")) -> None:
        """Send the held chunks that end after ``after_ms`` to the engine; forget the others."""
        held, self._buffer.held = self._buffer.held, deque()
        for chunk in held:
            if chunk.end_ms > after_ms:
                self._stream(chunk)

    def _commit_request(self, event: InputAudioCommit) -> None:
        have, need = self._buffer.duration_ms, self.settings.limits.min_commit_ms
        if have < need:
            raise RealtimeError(
                f"buffer too small: a commit needs at least {need} ms of audio, the buffer has {have:.0f} ms",
                code=ErrorCode.INPUT_AUDIO_BUFFER_COMMIT_EMPTY,
            )
        self._restart_detection_if_speaking()
        self._transcribe(self._commit())

    def _commit(self) -> str:
        """Commit the input buffer as a user message; returns its item id."""
        self._stream_held()
        item = Item(self._buffer_item_id(), Role.USER, [ContentPart(ContentType.INPUT_AUDIO)])
        previous = self._add_item(item)
        self._emit(CommitAudio(item.id))
        self._send(self._events.input_audio_buffer_committed(item.id, previous))
        self._send(self._events.item_added(item, previous))
        self._send(self._events.item_done(item, previous))
        self._buffer = _InputBuffer()
        return item.id

    def _clear(self, event: InputAudioClear) -> None:
        if self._buffer.opened and self._buffer.item_id is not None:
            self._emit(ClearAudio(self._buffer.item_id))
        self._buffer = _InputBuffer()
        self._restart_detection_if_speaking()
        self._send(self._events.input_audio_buffer_cleared())
