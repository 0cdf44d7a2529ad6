"""Preemptive replies (``SessionSettings.preemptive_replies``; the contract is :mod:`realtime.session`'s): a reply
started when the user pauses, whose client events are held until the turn is known to end.

``SpeechPaused`` commits the message and starts the reply at once (:meth:`PreemptiveReplies.pause`);
``SpeechStopped`` shows it (:meth:`PreemptiveReplies.show`: the turn tracker sends the held events right behind
``speech_stopped``); ``SpeechResumed`` or any client event but an audio append withdraws it unseen
(:meth:`PreemptiveReplies.withdraw`). While it is tentative the client actions of its output go to its held list
(:meth:`PreemptiveReplies.holding`) and appended audio is kept aside (:meth:`PreemptiveReplies.keep_aside`).
"""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field

from realtime.protocol.codes import StatusReason
from realtime.protocol.model import ResponseParams
from realtime.protocol.turn_detection import ServerVadParams
from realtime.session.commands import Action, CancelResponse, DeleteItem, Preemption, PreemptiveReply
from realtime.session.emitter import Emitter
from realtime.session.input_audio import CommittedAudio, InputAudio, InputChunk
from realtime.session.mirror import ItemMirror
from realtime.session.output_audio import OutputAudio
from realtime.session.responses import Responses
from realtime.session.settings import SessionSettings
from realtime.session.transcripts import InputTranscription


@dataclass
class _Tentative:
    """A reply started on a pause before the turn is known to end. ``message`` is the user message as it was
    committed; ``held`` the client actions of the commit and the reply, in order; ``after`` the audio appended since
    (silence the reply did not hear; streamed into the message if the reply is withdrawn)."""

    message: CommittedAudio
    response_id: str
    reply_item_id: str
    held: list[Action]
    after: list[InputChunk] = field(default_factory=list)
    done: bool = False
    """The reply ended (its ``ResponseDone`` came) while still tentative."""


@dataclass(frozen=True)
class Shown:
    """A tentative reply the client may now see: its message's item id and its held client actions, in order."""

    item_id: str
    held: list[Action]


class PreemptiveReplies:
    """Owns the tentative reply and what its withdrawals left behind (replies still running, whose output is
    dropped; items whose failure to be deleted is not news)."""

    def __init__(
        self,
        settings: SessionSettings,
        out: Emitter,
        *,
        input_audio: InputAudio,
        mirror: ItemMirror,
        responses: Responses,
        audio: OutputAudio,
        transcription: InputTranscription,
    ) -> None:
        self._enabled = settings.preemptive_replies
        self._out = out
        self._input = input_audio
        self._mirror = mirror
        self._responses = responses
        self._audio = audio
        self._transcription = transcription
        self._tentative: _Tentative | None = None
        self._withdrawn: set[str] = set()
        self._withdrawn_items: set[str] = set()

    @property
    def tentative(self) -> bool:
        """A reply the client has not seen yet is running (or has ended unseen)."""
        return self._tentative is not None

    def pause(self, vad: ServerVadParams) -> None:
        """The user paused: commit and start the reply now, holding its client events, when speech stopping now
        would do that too (and preemptive replies are on)."""
        if not self._enabled or not vad.create_response:
            return
        if self._responses.active is not None or self._input.duration_ms <= 0:
            return
        held: list[Action] = []
        with self._out.holding(held):
            message = self._input.commit()
            response = self._responses.start(ResponseParams())
            self._transcription.request(message.item_id)
        self._tentative = _Tentative(message, response.id, response.item.id, held)
        self._out.emit(PreemptiveReply(response.id, Preemption.STARTED))

    def keep_aside(self, chunk: InputChunk) -> bool:
        """While a reply is tentative, appended audio is kept aside (the reply did not hear it; the message gets it
        if the reply is withdrawn): whether ``chunk`` was."""
        if self._tentative is None:
            return False
        self._tentative.after.append(chunk)
        return True

    def holding(self, *ids: str) -> AbstractContextManager[object]:
        """Where the client actions of output or failures about ``ids`` (response and item ids) go: the tentative
        reply's held list if they are its reply's or its message's, else out as usual."""
        t = self._tentative
        if t is not None and {t.response_id, t.message.item_id} & set(ids):
            return self._out.holding(t.held)
        return nullcontext()

    def reply_ended(self, response_id: str) -> None:
        """``response_id`` ended (its ``response.done`` held, if it is the tentative reply)."""
        if self._tentative is not None and self._tentative.response_id == response_id:
            self._tentative.done = True

    def drops_output(self, response_id: str, last: bool) -> bool:
        """Engine output of a withdrawn reply is dropped (``last``: its ``ResponseDone``, the end of it)."""
        if response_id not in self._withdrawn:
            return False
        if last:
            self._withdrawn.discard(response_id)
        return True

    def withdrew_reply(self, response_id: str) -> bool:
        """``response_id`` was withdrawn (and may still run): the client never saw it."""
        return response_id in self._withdrawn

    def withdrew_item(self, item_id: str) -> bool:
        """A withdrawal deleted ``item_id`` (a reply's or its message's): the client never saw it deleted."""
        return item_id in self._withdrawn_items

    def show(self) -> Shown | None:
        """Speech stopped: the tentative reply stands (None if there is none); its held events may go out."""
        t, self._tentative = self._tentative, None
        if t is None:
            return None
        self._out.emit(PreemptiveReply(t.response_id, Preemption.SHOWN))  # before its held audio goes out
        return Shown(t.message.item_id, t.held)

    def withdraw(self) -> None:
        """Take back the tentative reply unseen (if any): cancel it, delete its item and the message from the engine,
        and stream the message again under its item id, with the audio that came after the pause."""
        t, self._tentative = self._tentative, None
        if t is None:
            return
        self._out.emit(PreemptiveReply(t.response_id, Preemption.WITHDRAWN))
        if not t.done:
            self._out.emit(CancelResponse(t.response_id, StatusReason.TURN_DETECTED))
            self._withdrawn.add(t.response_id)
            self._responses.abandon()
        self._audio.forget(t.response_id)
        message_id = t.message.item_id
        for item_id in (t.reply_item_id, message_id):
            self._mirror.discard(item_id)
            self._out.emit(DeleteItem(item_id))
        self._withdrawn_items |= {t.reply_item_id, message_id}
        self._input.reopen(message_id, [*t.message.chunks, *t.after])
