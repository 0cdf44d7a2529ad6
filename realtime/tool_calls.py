"""Function calling in the session: the engine commands it adds and the session's handling of calls.

Tools and ``tool_choice`` come from ``session.update`` (kept in :class:`~realtime.protocol.model.SessionConfig`) or
``response.create`` (that response only: its tools are set on the conversation before it starts and the session's
are restored after it ends, as for its instructions). A response whose tools are set and whose choice is not
``none`` gets item ids for up to :data:`~pipeline.tools.MAX_CALLS_PER_RESPONSE` calls, and its message item is
announced only when its first text or audio arrives (a reply may be only calls); a reply with neither text nor calls
still gets its (empty) message, as without tools.

Per call the client sees ``response.output_item.added`` (``function_call``, ``status: in_progress``, empty
``arguments``) and ``conversation.item.added`` once the model has written the function's name, then
``response.function_call_arguments.delta`` as the arguments are generated, and
``response.function_call_arguments.done``, ``response.output_item.done`` and ``conversation.item.done`` when the
call is complete. A call that never completes (the response was cancelled, failed, or the model's call was
malformed) ends ``incomplete``; the engine keeps only complete calls, so the item is also deleted
(``conversation.item.deleted``).

Client items: ``function_call`` (history replay) and ``function_call_output``, whose ``call_id`` must be that of a
``function_call`` item in the conversation (``unknown_call_id`` otherwise).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from pipeline.response_events import FunctionCallDelta, FunctionCallDone, FunctionCallStarted
from pipeline.tools import MAX_CALLS_PER_RESPONSE, Tool, ToolChoice, ToolMode
from realtime.errors import RealtimeError
from realtime.ids import IdKind
from realtime.protocol.codes import ErrorCode
from realtime.protocol.model import KEEP, Item, ItemStatus, ItemType, NewItem, ResponseParams, Role
from realtime.protocol.tools import resolve_choice

__all__ = ["AddFunctionCall", "AddFunctionOutput", "FunctionCalls", "ResponseCalls", "SetTools"]


@dataclass(frozen=True)
class SetTools:
    """The function tools offered to the model (part of its prompt); ``()``: none. Applied between responses."""

    tools: tuple[Tool, ...]


@dataclass(frozen=True)
class AddFunctionCall:
    item_id: str
    name: str
    arguments: str


@dataclass(frozen=True)
class AddFunctionOutput:
    item_id: str
    output: str


@dataclass
class ResponseCalls:
    """One response's function calling: what it may do and the call items it made (by the engine's call index)."""

    tools: tuple[Tool, ...] = ()
    choice: ToolChoice = field(default_factory=ToolChoice)
    item_ids: tuple[str, ...] = ()
    restore_tools: bool = False
    items: dict[int, Item] = field(default_factory=dict)

    @property
    def lazy_message(self) -> bool:
        """The reply may be only calls: its message is announced when text or audio first arrives."""
        return bool(self.item_ids)


class FunctionCalls:
    """The session's function calling (mixed into :class:`realtime.session.Session`, whose ``_send``, ``_emit``,
    ``_events``, ``_items``, ``_add_item``, ``config`` and ``_new_id`` it uses)."""

    # --- requests ---

    def _response_calls(self, params: ResponseParams) -> ResponseCalls:
        """The tools and choice of a new response (raises for a choice its tools cannot meet), and its call item
        ids."""
        cfg = self.config
        tools = cfg.tools if params.tools is KEEP else params.tools
        choice = cfg.tool_choice if params.tool_choice is KEEP else params.tool_choice
        problem = resolve_choice(tools, choice)
        if problem is not None:
            from_response = params.tool_choice is not KEEP or params.tools is not KEEP
            param = "response.tool_choice" if from_response else "session.tool_choice"
            raise RealtimeError(problem, code=ErrorCode.INVALID_VALUE, param=param)
        calls = ResponseCalls(tools, choice, restore_tools=tools != cfg.tools)
        if tools and choice.mode is not ToolMode.NONE:
            calls.item_ids = tuple(self._new_id(IdKind.ITEM) for _ in range(MAX_CALLS_PER_RESPONSE))
        if calls.restore_tools:
            self._emit(SetTools(tools))
        return calls

    def _function_item(self, new: NewItem, item_id: str) -> Item:
        """A client's ``function_call`` / ``function_call_output`` item, sent to the engine."""
        if new.type is ItemType.FUNCTION_CALL:
            self._emit(AddFunctionCall(item_id, new.name or "", new.arguments or ""))
            return Item(
                item_id,
                Role.ASSISTANT,
                type=ItemType.FUNCTION_CALL,
                call_id=new.call_id,
                name=new.name,
                arguments=new.arguments,
            )
        calls = {i.call_id for i in self._items.values() if i.type is ItemType.FUNCTION_CALL}
        if new.call_id not in calls:
            raise RealtimeError(
                f"no function_call item with call_id {new.call_id!r} is in the conversation",
                code=ErrorCode.UNKNOWN_CALL_ID,
                param="item.call_id",
            )
        self._emit(AddFunctionOutput(item_id, new.output or ""))
        return Item(item_id, Role.USER, type=ItemType.FUNCTION_CALL_OUTPUT, call_id=new.call_id, output=new.output)

    # --- engine output ---

    def _call_event(self, response, event: FunctionCallStarted | FunctionCallDelta | FunctionCallDone) -> None:
        """A call's progress (processed in every phase: the conversation keeps each call the engine completed)."""
        calls: ResponseCalls = response.calls
        if isinstance(event, FunctionCallStarted):
            item = Item(
                event.item_id,
                Role.ASSISTANT,
                status=ItemStatus.IN_PROGRESS,
                type=ItemType.FUNCTION_CALL,
                call_id=self._new_id(IdKind.CALL),
                name=event.name,
                arguments="",
            )
            calls.items[event.index] = item
            response.outputs.append(item)
            previous = self._add_item(item)
            self._send(self._events.output_item_added(response.id, self._output_index(response, item), item))
            self._send(self._events.item_added(item, previous))
            return
        item = calls.items[event.index]
        index = self._output_index(response, item)
        if isinstance(event, FunctionCallDelta):
            item.arguments = (item.arguments or "") + event.delta
            self._send(self._events.function_call_arguments_delta(response.id, index, item, event.delta))
            return
        item.arguments, item.status = event.arguments, ItemStatus.COMPLETED
        self._send(self._events.function_call_arguments_done(response.id, index, item))
        self._send(self._events.output_item_done(response.id, index, item))
        self._send(self._events.item_done(item, self._previous_id(item.id)))

    def _finish_calls(self, response) -> None:
        """At the response's end: calls never completed end ``incomplete`` and leave the conversation (the engine
        kept only complete calls); the session's tools come back if the response had its own."""
        calls: ResponseCalls = response.calls
        for item in calls.items.values():
            if item.status is ItemStatus.IN_PROGRESS:
                item.status = ItemStatus.INCOMPLETE
                self._send(self._events.output_item_done(response.id, self._output_index(response, item), item))
                self._items.pop(item.id, None)
                self._send(self._events.item_deleted(item.id))
        if calls.restore_tools:
            self._emit(SetTools(self.config.tools))

    @staticmethod
    def _output_index(response, item: Item) -> int:
        return response.outputs.index(item)

    def _previous_id(self, item_id: str) -> str | None:
        ids = list(self._items)
        at = ids.index(item_id)
        return ids[at - 1] if at else None
