"""The session's mirror of the conversation and the client's item requests: ``conversation.item.create`` /
``retrieve`` / ``delete`` / ``truncate``.

The mirror holds every item in conversation order (user messages, replies, function calls and their outputs); each
change the client asks for is sent to the engine as one command (:class:`~realtime.session.commands.AddText`,
``AddContent``, ``AddAudio``, ``DeleteItem``, ``TruncateItem``). An item can be inserted before the end or deleted
only while no response is in progress (one being cancelled is waited for by whoever runs the commands); finished
assistant audio can be truncated also while a later response runs (the engine applies it once that response ends).
"""

from __future__ import annotations

from pipeline.api import ROOT_ITEM_ID
from realtime.errors import InvalidAudioData, RealtimeError
from realtime.ids import IdKind
from realtime.media.images import engine_parts, mirror_parts
from realtime.protocol.client import ItemCreate, ItemDelete, ItemRetrieve, ItemTruncate
from realtime.protocol.codes import ErrorCode
from realtime.protocol.model import ContentPart, Item, ItemType, Role
from realtime.protocol.names import ContentType
from realtime.session.commands import AddAudio, AddContent, AddText, DeleteItem, TruncateItem
from realtime.session.responses import ResponsePhase


class ConversationItems:
    """The conversation (mixed into :class:`realtime.session.Session`). Owns the mirror (``_items``, by id, in
    conversation order); uses the session's ``_emit``, ``_send``, ``_new_id``, ``_events``, ``config``, function
    calling (``_function_item``) and the active response (``_response``)."""

    _items: dict[str, Item]

    def _last_item_id(self) -> str | None:
        return next(reversed(self._items), None)

    def _add_item(self, item: Item, index: int | None = None) -> str | None:
        """Put ``item`` into the mirror at ``index`` (None: last); returns the id of the item before it."""
        if index is None or index == len(self._items):
            previous = self._last_item_id()
            self._items[item.id] = item
            return previous
        entries = list(self._items.items())
        entries.insert(index, (item.id, item))
        self._items = dict(entries)
        return entries[index - 1][0] if index else None

    def _get_item(self, item_id: str, param: str = "item_id") -> Item:
        item = self._items.get(item_id)
        if item is None:
            raise RealtimeError(f"item {item_id!r} does not exist", code=ErrorCode.ITEM_NOT_FOUND, param=param)
        return item

    def _item_create(self, event: ItemCreate) -> None:
        new = event.item
        if new.id is not None and new.id in self._items:
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
            fmt = self.config.input_format
            if not new.audio or len(new.audio) % fmt.bytes_per_sample:
                raise InvalidAudioData(
                    f"item audio must be non-empty {fmt.value} ({fmt.bytes_per_sample} bytes per sample)",
                    param="item.content.0.audio",
                )
        item_id = new.id or self._new_id(IdKind.ITEM)
        if new.type is not ItemType.MESSAGE:
            if index != len(self._items):
                raise RealtimeError(
                    f"{new.type.value} items can only be added at the end of the conversation: leave "
                    "'previous_item_id' out, or give the last item's id",
                    code=ErrorCode.UNSUPPORTED_VALUE,
                    param="previous_item_id",
                )
            item = self._function_item(new, item_id)
            previous = self._add_item(item)
            self._send(self._events.item_added(item, previous))
            self._send(self._events.item_done(item, previous))
            return
        ids = list(self._items)
        after = None if index == len(ids) else ids[index - 1] if index else ROOT_ITEM_ID  # None: appended
        if new.audio is not None:
            self._emit(AddAudio(item_id, new.audio, self.config.input_format, after))
            parts = [ContentPart(ContentType.INPUT_AUDIO, transcript=new.transcript)]
        elif new.content is ContentType.INPUT_IMAGE:
            self._emit(AddContent(item_id, engine_parts(new), after))
            parts = mirror_parts(new)
        else:
            self._emit(AddText(item_id, new.text or "", new.role, after))
            parts = [ContentPart(new.content, text=new.text)]
        item = Item(item_id, new.role, parts)
        previous = self._add_item(item, index)
        self._send(self._events.item_added(item, previous))
        self._send(self._events.item_done(item, previous))

    def _insert_index(self, previous_item_id: str | None) -> int:
        """Where a created item goes in the mirror: after ``previous_item_id`` (``root``: first; left out: last).
        Before the end while a response is in progress it is refused (the reply being written would no longer
        follow what it was written for); a response being cancelled is waited for by the executor."""
        ids = list(self._items)
        if previous_item_id is None:
            return len(ids)
        if previous_item_id == ROOT_ITEM_ID:
            index = 0
        else:
            index = ids.index(self._get_item(previous_item_id, param="previous_item_id").id) + 1
        response = self._response
        if index < len(ids) and response is not None and response.phase is ResponsePhase.IN_PROGRESS:
            raise RealtimeError(
                f"response {response.id} is in progress: an item can only be appended until it ends; cancel it or "
                "wait for response.done to insert before the end",
                code=ErrorCode.CONVERSATION_BUSY,
                param="previous_item_id",
            )
        return index

    def _item_retrieve(self, event: ItemRetrieve) -> None:
        self._send(self._events.item_retrieved(self._get_item(event.item_id)))

    def _check_mutable(self, item: Item) -> None:
        """Deleting needs the conversation idle (or its response being cancelled)."""
        response = self._response
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

    def _item_delete(self, event: ItemDelete) -> None:
        item = self._get_item(event.item_id)
        self._check_mutable(item)
        del self._items[item.id]
        self._emit(DeleteItem(item.id))
        self._send(self._events.item_deleted(item.id))

    def _item_truncate(self, event: ItemTruncate) -> None:
        """Any finished assistant audio, also while a later response runs (a client truncates what its user did not
        hear when the user starts speaking; that turn may have ended, and its reply begun, before the truncate
        arrives): the client sees it truncated at once, the engine once that response ends."""
        item = self._get_item(event.item_id)
        if item.role is not Role.ASSISTANT:
            raise RealtimeError("only assistant audio can be truncated", code=ErrorCode.INVALID_VALUE, param="item_id")
        response = self._response
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
        self._emit(TruncateItem(item.id, event.audio_end_ms))
        self._send(self._events.item_truncated(item.id, event.content_index, event.audio_end_ms))

    @staticmethod
    def _audio_part(item: Item, index: int) -> ContentPart:
        if index >= len(item.content) or item.content[index].type is not ContentType.OUTPUT_AUDIO:
            raise RealtimeError(
                f"item {item.id!r} has no audio content at index {index}",
                code=ErrorCode.INVALID_VALUE,
                param="content_index",
            )
        return item.content[index]
