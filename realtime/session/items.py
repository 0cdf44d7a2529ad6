"""The client's item requests: ``conversation.item.create`` / ``retrieve`` / ``delete`` / ``truncate``.

Each change the client asks for is made in the conversation's mirror (:mod:`realtime.session.mirror`) and sent to the
engine as one command (:class:`~realtime.session.commands.AddText`, ``AddContent``, ``AddAudio``, ``DeleteItem``,
``TruncateItem``; function items through :mod:`realtime.session.tool_calls`). An item can be inserted before the end
or deleted only while no response is in progress (one being cancelled is waited for by whoever runs the commands);
finished assistant audio can be truncated also while a later response runs (the engine applies it once that response
ends).
"""

from __future__ import annotations

from pipeline.api import ROOT_ITEM_ID
from realtime.errors import InvalidAudioData, RealtimeError
from realtime.ids import IdGenerator, IdKind
from realtime.media.images import engine_parts, mirror_parts
from realtime.protocol.client import ItemCreate, ItemDelete, ItemRetrieve, ItemTruncate
from realtime.protocol.codes import ErrorCode
from realtime.protocol.model import ContentPart, Item, ItemType, Role
from realtime.protocol.names import ContentType
from realtime.protocol.server import ServerEvents
from realtime.session.commands import AddAudio, AddContent, AddText, DeleteItem, TruncateItem
from realtime.session.emitter import ConfigView, Emitter
from realtime.session.mirror import ItemMirror
from realtime.session.response_state import ResponsePhase
from realtime.session.responses import Responses
from realtime.session.tool_calls import FunctionCalls


class ConversationItems:
    """The client's requests on the conversation. No state of its own: the items are the ``mirror``'s; what may
    change while a response runs asks ``responses``."""

    def __init__(
        self,
        config: ConfigView,
        ids: IdGenerator,
        events: ServerEvents,
        out: Emitter,
        *,
        mirror: ItemMirror,
        responses: Responses,
        calls: FunctionCalls,
    ) -> None:
        self._config = config
        self._ids = ids
        self._events = events
        self._out = out
        self._mirror = mirror
        self._responses = responses
        self._calls = calls

    def create(self, event: ItemCreate) -> None:
        """``conversation.item.create``."""
        new = event.item
        if new.id is not None and new.id in self._mirror:
            raise RealtimeError(f"item {new.id!r} already exists", code=ErrorCode.DUPLICATE_ITEM_ID, param="item.id")
        if new.id == ROOT_ITEM_ID:
            raise RealtimeError(
                f"{ROOT_ITEM_ID!r} is reserved (previous_item_id {ROOT_ITEM_ID!r} means the start of the "
                "conversation); choose another item id",
                code=ErrorCode.INVALID_VALUE,
                param="item.id",
            )
        index = self._insert_index(event.previous_item_id)
        if new.audio is not None:
            fmt = self._config.config.input_format
            if not new.audio or len(new.audio) % fmt.bytes_per_sample:
                raise InvalidAudioData(
                    f"item audio must be non-empty {fmt.value} ({fmt.bytes_per_sample} bytes per sample)",
                    param="item.content.0.audio",
                )
        item_id = new.id or self._ids.new(IdKind.ITEM)
        if new.type is not ItemType.MESSAGE:
            if index != len(self._mirror):
                raise RealtimeError(
                    f"{new.type.value} items can only be added at the end of the conversation: leave "
                    "'previous_item_id' out, or give the last item's id",
                    code=ErrorCode.UNSUPPORTED_VALUE,
                    param="previous_item_id",
                )
            item = self._calls.client_item(new, item_id)
            previous = self._mirror.add(item)
            self._out.send(self._events.item_added(item, previous))
            self._out.send(self._events.item_done(item, previous))
            return
        ids = self._mirror.ids()
        after = None if index == len(ids) else ids[index - 1] if index else ROOT_ITEM_ID  # None: appended
        if new.audio is not None:
            self._out.emit(AddAudio(item_id, new.audio, self._config.config.input_format, after))
            parts = [ContentPart(ContentType.INPUT_AUDIO, transcript=new.transcript)]
        elif new.content is ContentType.INPUT_IMAGE:
            self._out.emit(AddContent(item_id, engine_parts(new), after))
            parts = mirror_parts(new)
        else:
            assert new.content is not None, "a message item has content (the protocol checked it)"
            self._out.emit(AddText(item_id, new.text or "", new.role, after))
            parts = [ContentPart(new.content, text=new.text)]
        item = Item(item_id, new.role, parts)
        previous = self._mirror.add(item, index)
        self._out.send(self._events.item_added(item, previous))
        self._out.send(self._events.item_done(item, previous))

    def _insert_index(self, previous_item_id: str | None) -> int:
        """Where a created item goes in the mirror: after ``previous_item_id`` (``root``: first; left out: last).
        Before the end while a response is in progress it is refused (the reply being written would no longer
        follow what it was written for); a response being cancelled is waited for by the executor."""
        ids = self._mirror.ids()
        if previous_item_id is None:
            return len(ids)
        if previous_item_id == ROOT_ITEM_ID:
            index = 0
        else:
            index = ids.index(self._mirror.get(previous_item_id, param="previous_item_id").id) + 1
        response = self._responses.active
        if index < len(ids) and response is not None and response.phase is ResponsePhase.IN_PROGRESS:
            raise RealtimeError(
                f"response {response.id} is in progress: an item can only be appended until it ends; cancel it or "
                "wait for response.done to insert before the end",
                code=ErrorCode.CONVERSATION_BUSY,
                param="previous_item_id",
            )
        return index

    def retrieve(self, event: ItemRetrieve) -> None:
        self._out.send(self._events.item_retrieved(self._mirror.get(event.item_id)))

    def _check_mutable(self, item: Item) -> None:
        """Deleting needs the conversation idle (or its response being cancelled)."""
        response = self._responses.active
        if response is None:
            return
        if response.item.id == item.id:
            raise RealtimeError(
                f"item {item.id!r} is still being generated; wait for response.done",
                code=ErrorCode.ITEM_IN_PROGRESS,
                param="item_id",
            )
        if response.phase is ResponsePhase.IN_PROGRESS:
            raise RealtimeError(
                f"response {response.id} is in progress; cancel it or wait for response.done",
                code=ErrorCode.CONVERSATION_BUSY,
                param="item_id",
            )

    def delete(self, event: ItemDelete) -> None:
        item = self._mirror.get(event.item_id)
        self._check_mutable(item)
        self._mirror.discard(item.id)
        self._out.emit(DeleteItem(item.id))
        self._out.send(self._events.item_deleted(item.id))

    def truncate(self, event: ItemTruncate) -> None:
        """Any finished assistant audio, also while a later response runs (a client truncates what its user did not
        hear when the user starts speaking; that turn may have ended, and its reply begun, before the truncate
        arrives): the client sees it truncated at once, the engine once that response ends."""
        item = self._mirror.get(event.item_id)
        if item.role is not Role.ASSISTANT:
            raise RealtimeError("only assistant audio can be truncated", code=ErrorCode.INVALID_VALUE, param="item_id")
        response = self._responses.active
        if response is not None and response.item.id == item.id and response.phase is ResponsePhase.IN_PROGRESS:
            raise RealtimeError(
                f"item {item.id!r} is still being generated; cancel its response before truncating it",
                code=ErrorCode.ITEM_IN_PROGRESS,
                param="item_id",
            )
        part = self._audio_part(item, event.content_index)
        if event.audio_end_ms > part.audio_ms + 0.5:  # sent durations are fractional ms
            raise RealtimeError(
                f"audio_end_ms {event.audio_end_ms} is past the {part.audio_ms:.0f} ms of audio sent for this item",
                code=ErrorCode.INVALID_VALUE,
                param="audio_end_ms",
            )
        part.audio_ms = float(event.audio_end_ms)
        part.transcript = None  # the text the user did not hear is dropped from the context
        self._out.emit(TruncateItem(item.id, event.audio_end_ms))
        self._out.send(self._events.item_truncated(item.id, event.content_index, event.audio_end_ms))

    @staticmethod
    def _audio_part(item: Item, index: int) -> ContentPart:
        if index >= len(item.content) or item.content[index].type is not ContentType.OUTPUT_AUDIO:
            raise RealtimeError(
                f"item {item.id!r} has no audio content at index {index}",
                code=ErrorCode.INVALID_VALUE,
                param="content_index",
            )
        return item.content[index]
