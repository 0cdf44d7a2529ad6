"""The session's mirror of the conversation: every item in conversation order (user messages, replies, function
calls and their outputs), as the client sees them. Plain state with no events of its own; the parts that change
the conversation (:mod:`realtime.session.items`, ``responses``, ``tool_calls``, ``input_audio``, ``preemptive``)
send the events and engine commands."""

from __future__ import annotations

from realtime.errors import RealtimeError
from realtime.protocol.codes import ErrorCode
from realtime.protocol.model import ContentPart, Item, ItemType
from realtime.protocol.names import ContentType


class ItemMirror:
    """The conversation's items by id, in conversation order."""

    def __init__(self) -> None:
        self._items: dict[str, Item] = {}

    @property
    def items(self) -> tuple[Item, ...]:
        return tuple(self._items.values())

    def ids(self) -> list[str]:
        return list(self._items)

    def __len__(self) -> int:
        return len(self._items)

    def __contains__(self, item_id: object) -> bool:
        return item_id in self._items

    def add(self, item: Item, index: int | None = None) -> str | None:
        """Put ``item`` at ``index`` (None: last); returns the id of the item before it."""
        if index is None or index == len(self._items):
            previous = next(reversed(self._items), None)
            self._items[item.id] = item
            return previous
        entries = list(self._items.items())
        entries.insert(index, (item.id, item))
        self._items = dict(entries)
        return entries[index - 1][0] if index else None

    def get(self, item_id: str, param: str = "item_id") -> Item:
        """The item ``item_id``; ``item_not_found`` (at ``param``) if there is none."""
        item = self._items.get(item_id)
        if item is None:
            raise RealtimeError(f"item {item_id!r} does not exist", code=ErrorCode.ITEM_NOT_FOUND, param=param)
        return item

    def discard(self, item_id: str) -> None:
        """Forget ``item_id`` (nothing if it is not there)."""
        self._items.pop(item_id, None)

    def previous_id(self, item_id: str) -> str | None:
        """The id of the item before ``item_id`` (None: it is first)."""
        ids = list(self._items)
        at = ids.index(item_id)
        return ids[at - 1] if at else None

    def call_ids(self) -> set[str | None]:
        """The ``call_id`` of every ``function_call`` item."""
        return {i.call_id for i in self._items.values() if i.type is ItemType.FUNCTION_CALL}

    def input_audio_part(self, item_id: str, content_index: int) -> ContentPart | None:
        """Item ``item_id``'s input audio content part ``content_index``; None if the item is gone or the part is not
        input audio."""
        item = self._items.get(item_id)
        if item is None or content_index >= len(item.content):
            return None
        part = item.content[content_index]
        return part if part.type is ContentType.INPUT_AUDIO else None
