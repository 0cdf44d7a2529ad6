"""Preemptive replies (``SessionSettings.preemptive_replies``; the contract is :mod:`realtime.session`'s): a reply
started when the user pauses, whose client events are held until the turn is known to end.

``SpeechPaused`` commits the message and starts the reply at once (a :class:`_Tentative`); ``SpeechStopped``
(:mod:`realtime.session.turns`) shows it, sending the held events right behind ``speech_stopped``; ``SpeechResumed``
or any client event but an audio append withdraws it unseen (:meth:`PreemptiveReplies._withdraw`).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from realtime.protocol.codes import StatusReason
from realtime.protocol.model import ResponseParams
from realtime.protocol.turn_detection import ServerVadParams
from realtime.session.commands import Action, CancelResponse, DeleteItem, Preemption, PreemptiveReply
from realtime.session.input_audio import _Chunk, _InputBuffer


@dataclass
class _Tentative:
    """A reply started on a pause (``SpeechPaused``) before the turn is known to end. ``buffer`` is the user message
    as it was committed; ``held`` the client actions of the commit and the reply, in order; ``after`` the audio
    appended since (silence the reply did not hear; streamed into the message if the reply is withdrawn)."""

    buffer: _InputBuffer
    held: list[Action] = field(default_factory=list)
    after: list[_Chunk] = field(default_factory=list)
    response_id: str = ""
    reply_item_id: str = ""
    done: bool = False
    """The reply ended (its ``ResponseDone`` came) while still tentative."""


class PreemptiveReplies:
    """Preemptive replies (mixed into :class:`realtime.session.Session`). Owns the tentative reply (``_tentative``),
    where client actions go while it runs (``_hold``, read by ``_emit``), and what its withdrawals left behind
    (``_withdrawn``: replies still running, whose output is dropped; ``_withdrawn_items``: items whose failure to be
    deleted is not news); uses the session's ``_emit``, ``settings``, the input buffer (``_buffer``, ``_commit``,
    ``_stream``), the conversation (``_items``), the responses (``_response``, ``_start_response``), output audio
    (``_audio_response_id``) and transcription (``_transcribe``)."""

    _tentative: _Tentative | None
    _hold: list[Action] | None
    _withdrawn: set[str]
    _withdrawn_items: set[str]

    @contextmanager
    def _holding(self) -> Iterator[None]:
        """Client actions emitted inside go to the tentative reply's ``held`` list instead of out."""
        assert self._tentative is not None
        self._hold = self._tentative.held
        try:
            yield
        finally:
            self._hold = None

    def _speech_paused(self, vad: ServerVadParams) -> None:
        """The user paused: commit and start the reply now, holding their client events (see the module
        docstring), when speech stopping now would do that too."""
        if not self.settings.preemptive_replies or not vad.create_response:
            return
        if self._response is not None or self._buffer.duration_ms <= 0:
            return
        self._tentative = _Tentative(self._buffer)
        with self._holding():
            item_id = self._commit()
            self._start_response(ResponseParams())
            self._transcribe(item_id)
        assert self._response is not None
        self._tentative.response_id, self._tentative.reply_item_id = self._response.id, self._response.item.id
        self._emit(PreemptiveReply(self._response.id, Preemption.STARTED))

    def _withdraw(self) -> None:
        """Take back the tentative reply unseen: cancel it, delete its item and the message from the engine, and
        stream the message again under its item id, with the audio that came after the pause."""
        t, self._tentative = self._tentative, None
        if t is None:
            return
        assert t.buffer.item_id is not None
        self._emit(PreemptiveReply(t.response_id, Preemption.WITHDRAWN))
        if not t.done:
            self._emit(CancelResponse(t.response_id, StatusReason.TURN_DETECTED))
            self._withdrawn.add(t.response_id)
            self._response = None
        if self._audio_response_id == t.response_id:
            self._audio_response_id = None
        for item_id in (t.reply_item_id, t.buffer.item_id):
            self._items.pop(item_id, None)
            self._emit(DeleteItem(item_id))
        self._withdrawn_items |= {t.reply_item_id, t.buffer.item_id}
        self._buffer = _InputBuffer(item_id=t.buffer.item_id)
        for chunk in [*t.buffer.sent, *t.after]:
            self._stream(chunk)
