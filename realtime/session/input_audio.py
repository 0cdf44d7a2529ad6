"""The session's input audio buffer (``input_audio_buffer.append`` / ``commit`` / ``clear``) and its audio clock.

In manual mode (``turn_detection: null``) every appended chunk goes to the engine at once. With ``server_vad`` the
audio before speech is held back (prefix padding plus ``SessionLimits.vad_lookback_ms`` for the detector's latency)
and only the part from the detected ``audio_start_ms`` on reaches the engine (:meth:`InputAudio.stream_held`), so
silence never fills the model's context. Whether the user is speaking, and whether a preemptive reply keeps the
audio aside, the caller decides (:class:`realtime.session.Session` routes each append).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field

from realtime.errors import InvalidAudioData, RealtimeError
from realtime.ids import IdGenerator, IdKind
from realtime.protocol.audio_format import AudioFormat
from realtime.protocol.codes import ErrorCode
from realtime.protocol.model import ContentPart, Item, Role
from realtime.protocol.names import ContentType
from realtime.protocol.server import ServerEvents
from realtime.session.commands import AppendAudio, ClearAudio, CommitAudio
from realtime.session.emitter import ConfigView, Emitter
from realtime.session.mirror import ItemMirror
from realtime.session.settings import SessionSettings


@dataclass(frozen=True)
class InputChunk:
    """One appended chunk: wire bytes in ``format``, ending at ``end_ms`` of the audio clock."""

    audio: bytes
    format: AudioFormat
    end_ms: float
    duration_ms: float


@dataclass(frozen=True)
class CommittedAudio:
    """A committed user message: its item id and the chunks that went to the engine (kept only with
    ``SessionSettings.preemptive_replies``: a withdrawn preemptive reply streams them again)."""

    item_id: str
    chunks: tuple[InputChunk, ...]


@dataclass
class _Buffer:
    """The user message being spoken. ``opened``: some of it went to the engine as ``item_id``; ``held`` chunks
    (server_vad, before speech) did not, yet."""

    item_id: str | None = None
    opened: bool = False
    sent_ms: float = 0.0
    held: deque[InputChunk] = field(default_factory=deque)
    sent: list[InputChunk] = field(default_factory=list)

    @property
    def duration_ms(self) -> float:
        return self.sent_ms + sum(c.duration_ms for c in self.held)


class InputAudio:
    """Owns the input buffer and the audio clock (all audio ever appended, in ms: the turn detector's clock too).
    A commit adds the message to the conversation (``mirror``)."""

    def __init__(
        self,
        settings: SessionSettings,
        config: ConfigView,
        ids: IdGenerator,
        events: ServerEvents,
        out: Emitter,
        mirror: ItemMirror,
    ) -> None:
        self._settings = settings
        self._config = config
        self._ids = ids
        self._events = events
        self._out = out
        self._mirror = mirror
        self._buffer = _Buffer()
        self._clock_ms = 0.0

    @property
    def clock_ms(self) -> float:
        return self._clock_ms

    @property
    def duration_ms(self) -> float:
        """The audio in the buffer, sent to the engine or held back."""
        return self._buffer.duration_ms

    @property
    def streamed_ms(self) -> float:
        """The part of the buffer that went to the engine."""
        return self._buffer.sent_ms

    @property
    def kept(self) -> tuple[InputChunk, ...]:
        """The chunks of the buffer that went to the engine and are kept for a withdrawn preemptive reply (none
        without ``SessionSettings.preemptive_replies``)."""
        return tuple(self._buffer.sent)

    def accept(self, audio: bytes) -> InputChunk | None:
        """Check an appended chunk (``invalid_audio`` if it is not whole samples, ``input_audio_buffer_full`` past
        ``SessionLimits.max_buffer_ms``) and advance the clock by it; None for an empty chunk."""
        fmt = self._config.config.input_format
        if len(audio) % fmt.bytes_per_sample:
            raise InvalidAudioData(
                f"{fmt.value} audio has {fmt.bytes_per_sample} bytes per sample; got {len(audio)} bytes",
                param="audio",
            )
        if not audio:
            return None
        ms = fmt.duration_ms(len(audio))
        limit = self._settings.limits.max_buffer_ms
        if self._buffer.duration_ms + ms > limit:
            raise RealtimeError(
                f"the input audio buffer holds at most {limit} ms; commit or clear it",
                code=ErrorCode.INPUT_AUDIO_BUFFER_FULL,
                param="audio",
            )
        self._clock_ms += ms
        return InputChunk(audio, fmt, self._clock_ms, ms)

    def add(self, chunk: InputChunk, *, speaking: bool) -> None:
        """Stream ``chunk`` to the engine (manual turns, speech, or a message already open), or hold it back."""
        vad = self._config.config.turn_detection
        if vad is None or self._buffer.opened or speaking:
            self.stream(chunk)
            return
        keep_ms = vad.prefix_padding_ms + self._settings.limits.vad_lookback_ms
        held = self._buffer.held
        held.append(chunk)
        while held and held[0].end_ms <= chunk.end_ms - keep_ms:  # older than the padding and look-back
            held.popleft()

    def item_id(self) -> str:
        """The id of the message being spoken (made now if it has none yet)."""
        if self._buffer.item_id is None:
            self._buffer.item_id = self._ids.new(IdKind.ITEM)
        return self._buffer.item_id

    def stream(self, chunk: InputChunk) -> None:
        start_ms = chunk.end_ms - chunk.duration_ms
        self._out.emit(AppendAudio(self.item_id(), chunk.audio, chunk.format, start_ms=start_ms))
        self._buffer.opened = True
        self._buffer.sent_ms += chunk.duration_ms
        if self._settings.preemptive_replies:
            self._buffer.sent.append(chunk)

    def stream_held(self, after_ms: float = float("-inf")) -> None:
        """Send the held chunks that end after ``after_ms`` to the engine; forget the others."""
        held, self._buffer.held = self._buffer.held, deque()
        for chunk in held:
            if chunk.end_ms > after_ms:
                self.stream(chunk)

    def check_commit(self) -> None:
        """A client's commit needs ``SessionLimits.min_commit_ms`` of audio (``input_audio_buffer_commit_empty``)."""
        have, need = self._buffer.duration_ms, self._settings.limits.min_commit_ms
        if have < need:
            raise RealtimeError(
                f"buffer too small: a commit needs at least {need} ms of audio, the buffer has {have:.0f} ms",
                code=ErrorCode.INPUT_AUDIO_BUFFER_COMMIT_EMPTY,
            )

    def commit(self) -> CommittedAudio:
        """Commit the buffer (held chunks included) as a user message; the buffer starts empty."""
        self.stream_held()
        item = Item(self.item_id(), Role.USER, [ContentPart(ContentType.INPUT_AUDIO)])
        previous = self._mirror.add(item)
        self._out.emit(CommitAudio(item.id))
        self._out.send(self._events.input_audio_buffer_committed(item.id, previous))
        self._out.send(self._events.item_added(item, previous))
        self._out.send(self._events.item_done(item, previous))
        committed = CommittedAudio(item.id, tuple(self._buffer.sent))
        self._buffer = _Buffer()
        return committed

    def discard(self) -> None:
        """Drop the buffer (the engine drops what of it was streamed); ``input_audio_buffer.cleared`` is the
        caller's to send."""
        if self._buffer.opened and self._buffer.item_id is not None:
            self._out.emit(ClearAudio(self._buffer.item_id))
        self._buffer = _Buffer()

    def reopen(self, item_id: str, chunks: Iterable[InputChunk]) -> None:
        """Start the buffer again as message ``item_id`` (a withdrawn commit), streaming ``chunks`` into it."""
        self._buffer = _Buffer(item_id=item_id)
        for chunk in chunks:
            self.stream(chunk)
