"""Function calling in the session: a response's tools and call items, the calls the engine writes, and the client's
``function_call`` / ``function_call_output`` items.

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

from pipeline.response_events import FunctionCallDelta, FunctionCallDone, FunctionCallStarted
from pipeline.tools import MAX_CALLS_PER_RESPONSE, ToolMode
from realtime.errors import RealtimeError
from realtime.ids import IdGenerator, IdKind
from realtime.protocol.codes import ErrorCode
from realtime.protocol.model import KEEP, Item, ItemStatus, ItemType, NewItem, ResponseParams, Role
from realtime.protocol.server import ServerEvents
from realtime.protocol.tools import resolve_choice
from realtime.session.commands import AddFunctionCall, AddFunctionOutput, SetTools
from realtime.session.emitter import ConfigView, Emitter
from realtime.session.mirror import ItemMirror
from realtime.session.response_state import ActiveResponse, ResponseCalls


class FunctionCalls:
    """The session's function calling. No state of its own: a response's calls are in its
    :class:`~realtime.session.response_state.ResponseCalls`, the call items in the conversation (``mirror``)."""

    def __init__(
        self, config: ConfigView, ids: IdGenerator, events: ServerEvents, out: Emitter, mirror: ItemMirror
    ) -> None:
        self._config = config
        self._ids = ids
        self._events = events
        self._out = out
        self._mirror = mirror

    def response_calls(self, params: ResponseParams) -> ResponseCalls:
        """The tools and choice of a new response (raises for a choice its tools cannot meet), and its call item
        ids; a response with tools of its own sets them (:class:`SetTools`) now."""
        cfg = self._config.config
        tools = cfg.tools if params.tools is KEEP else params.tools
        choice = cfg.tool_choice if params.tool_choice is KEEP else params.tool_choice
        problem = resolve_choice(tools, choice)
        if problem is not None:
            from_response = params.tool_choice is not KEEP or params.tools is not KEEP
            param = "response.tool_choice" if from_response else "session.tool_choice"
            raise RealtimeError(problem, code=ErrorCode.INVALID_VALUE, param=param)
        calls = ResponseCalls(tools, choice, restore_tools=tools != cfg.tools)
        if tools and choice.mode is not ToolMode.NONE:
            calls.item_ids = tuple(self._ids.new(IdKind.ITEM) for _ in range(MAX_CALLS_PER_RESPONSE))
        if calls.restore_tools:
            self._out.emit(SetTools(tools))
        return calls

    def client_item(self, new: NewItem, item_id: str) -> Item:
        """A client's ``function_call`` / ``function_call_output`` item, sent to the engine (``unknown_call_id`` for
        an output whose call is not in the conversation). The caller adds it to the conversation."""
        if new.type is ItemType.FUNCTION_CALL:
            self._out.emit(AddFunctionCall(item_id, new.name or "", new.arguments or ""))
            return Item(
                item_id,
                Role.ASSISTANT,
                type=ItemType.FUNCTION_CALL,
                call_id=new.call_id,
                name=new.name,
                arguments=new.arguments,
            )
        if new.call_id not in self._mirror.call_ids():
            raise RealtimeError(
                f"no function_call item with call_id {new.call_id!r} is in the conversation",
                code=ErrorCode.UNKNOWN_CALL_ID,
                param="item.call_id",
            )
        self._out.emit(AddFunctionOutput(item_id, new.output or ""))
        return Item(item_id, Role.USER, type=ItemType.FUNCTION_CALL_OUTPUT, call_id=new.call_id, output=new.output)

    def call_event(
        self, response: ActiveResponse, event: FunctionCallStarted | FunctionCallDelta | FunctionCallDone
    ) -> None:
        """A call's progress (processed in every phase: the conversation keeps each call the engine completed)."""
        calls = response.calls
        if isinstance(event, FunctionCallStarted):
            item = Item(
                event.item_id,
                Role.ASSISTANT,
                status=ItemStatus.IN_PROGRESS,
                type=ItemType.FUNCTION_CALL,
                call_id=self._ids.new(IdKind.CALL),
                name=event.name,
                arguments="",
            )
            calls.items[event.index] = item
            response.outputs.append(item)
            previous = self._mirror.add(item)
            self._out.send(self._events.output_item_added(response.id, response.output_index(item), item))
            self._out.send(self._events.item_added(item, previous))
            return
        item = calls.items[event.index]
        index = response.output_index(item)
        if isinstance(event, FunctionCallDelta):
            item.arguments = (item.arguments or "") + event.delta
            self._out.send(self._events.function_call_arguments_delta(response.id, index, item, event.delta))
            return
        item.arguments, item.status = event.arguments, ItemStatus.COMPLETED
        self._out.send(self._events.function_call_arguments_done(response.id, index, item))
        self._out.send(self._events.output_item_done(response.id, index, item))
        self._out.send(self._events.item_done(item, self._mirror.previous_id(item.id)))

    def finish(self, response: ActiveResponse) -> None:
        """At the response's end: calls never completed end ``incomplete`` and leave the conversation (the engine
        kept only complete calls); the session's tools come back if the response had its own."""
        calls = response.calls
        for item in calls.items.values():
            if item.status is ItemStatus.IN_PROGRESS:
                item.status = ItemStatus.INCOMPLETE
                self._out.send(self._events.output_item_done(response.id, response.output_index(item), item))
                self._mirror.discard(item.id)
                self._out.send(self._events.item_deleted(item.id))
        if calls.restore_tools:
            self._out.emit(SetTools(self._config.config.tools))
