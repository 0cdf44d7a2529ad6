"""A reply's function calls, read from its token stream as the thinker writes them.

:class:`CallTracker` sorts each accepted reply token: **text** (detokenized into ``TextDelta`` and spoken, as without
tools), **hidden** (part of a call, or what the model writes between two calls: kept in the reply, never shown nor
spoken) or **stop** (the reply's text ends there; the token is not kept). The rules, in order:

- the family's call-open token starts a call (with ``tool_choice`` none it is a stop instead: no calls);
- inside a call every token is hidden; the call's text is fed to the family's parser, which reports the function's
  name as soon as it is complete (:class:`~pipeline.response_events.FunctionCallStarted`) and then the arguments as
  they come
  (:class:`~pipeline.response_events.FunctionCallDelta`); the call-close token completes it
  (:class:`~pipeline.response_events.FunctionCallDone`);
- after a call, whitespace is hidden, another call-open token starts the next call (up to the response's number of
  call item ids), and anything else is a stop: a reply ends with its calls, so that nothing is spoken after a call.

A call that is malformed (not the family's JSON, a function the response does not offer, or still open when the text
ends) raises :class:`~pipeline.errors.FunctionCallError`: the response fails with it. :meth:`CallTracker.settle`, at
the end of the response, splits the reply item: its text stays the reply, each completed call becomes a
``FUNCTION_CALL`` item after it (the tokens exactly as generated, whitespace after the last call included, so the cache
is reused), and an unfinished call is dropped from the conversation.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass

from pipeline.core.conversation_state import ConversationState, ConvItem, ItemKind
from pipeline.errors import FunctionCallError, InvalidInputError
from pipeline.models.rendering import CallParser, ToolFormat
from pipeline.output.detokenizer import IncrementalDetokenizer
from pipeline.response_events import FunctionCallDelta, FunctionCallDone, FunctionCallStarted, ResponseEvent
from pipeline.tools import ToolChoice, ToolMode

__all__ = ["CallTracker", "Verdict", "function_calls"]


class Verdict(enum.Enum):
    TEXT = "text"
    HIDDEN = "hidden"
    STOP = "stop"


class _Mode(enum.Enum):
    TEXT = "text"
    CALL = "call"
    AFTER_CALL = "after_call"


@dataclass
class _Call:
    item_id: str
    start: int
    """Index in the reply's tokens where the call's own tokens begin (after the previous call's end)."""
    parser: CallParser
    detok: IncrementalDetokenizer
    name: str | None = None
    end: int | None = None
    """Index just past its close token, once complete."""


class CallTracker:
    def __init__(
        self,
        fmt: ToolFormat,
        *,
        tools: frozenset[str],
        choice: ToolChoice,
        item_ids: tuple[str, ...],
        decode: Callable[[list[int]], str],
        sink: Callable[[ResponseEvent], None],
    ) -> None:
        """``fmt``: the family's tool format (``call_open`` / ``call_close`` ids, ``parser(tools)``); ``tools``: the
        names the reply may call."""
        self.fmt = fmt
        self.tools = tools
        self.choice = choice
        self.item_ids = item_ids
        self.decode = decode
        self.sink = sink
        self.mode = _Mode.TEXT
        self.calls: list[_Call] = []

    @property
    def in_call(self) -> bool:
        return self.mode is _Mode.CALL

    def accept(self, token: int, position: int) -> Verdict:
        """Sort the reply's token at ``position`` (its index among the reply's tokens); emits the call events."""
        if self.mode is _Mode.CALL:
            if token == self.fmt.call_close:
                self._close(position + 1)
            else:
                self._feed(token)
            return Verdict.HIDDEN
        if token == self.fmt.call_open:
            if self.choice.mode is ToolMode.NONE or len(self.calls) >= len(self.item_ids):
                return Verdict.STOP
            self._open(self._next_call_start(position))
            return Verdict.HIDDEN
        if self.mode is _Mode.AFTER_CALL:
            return Verdict.HIDDEN if not self.decode([token]).strip() else Verdict.STOP
        return Verdict.TEXT

    def prime(self, token_ids: list[int]) -> None:
        """The reply's first tokens, written by the engine (a required call's opening), as if generated."""
        for position, token in enumerate(token_ids):
            if self.accept(token, position) is not Verdict.HIDDEN:
                raise ValueError("a forced reply start must open a call")

    def end_of_text(self) -> None:
        """The reply's text ended (a stop token or its length limit): a call still open is malformed."""
        if self.mode is _Mode.CALL:
            call = self.calls[-1]
            what = f"its call of {call.name!r}" if call.name else "its function call"
            raise FunctionCallError(f"the model's reply ended before {what} was complete")

    def settle(self, conv: ConversationState, reply: ConvItem) -> None:
        """Split ``reply`` (ended) into its text and a ``FUNCTION_CALL`` item per completed call, placed after it; an
        unfinished call and what follows the last call are dropped. A reply with calls and no text is dropped."""
        done = [c for c in self.calls if c.end is not None]
        if not self.calls or reply not in conv.items:
            return
        ids = reply.reply_ids
        if done and done[-1] is self.calls[-1]:
            done[-1].end = len(ids)  # what it wrote after its last call (whitespace) stays, as generated
        items = [
            ConvItem(
                id=c.item_id,
                role="assistant",
                kind=ItemKind.FUNCTION_CALL,
                reply_ids=ids[c.start : c.end],
                generated=True,
            )
            for c in done
        ]
        reply.reply_ids = ids[: self.calls[0].start]
        at = conv.items.index(reply) + 1
        conv.items[at:at] = items
        if done and not reply.reply_ids:
            conv.items.remove(reply)
        conv.dirty = True

    def _next_call_start(self, position: int) -> int:
        """Where a call opened at ``position`` begins: there for the first call, else just past the previous call
        (complete, as calls do not nest), so that what was written between two calls belongs to the second."""
        if not self.calls:
            return position
        end = self.calls[-1].end
        assert end is not None, "a call opens only after the previous one closed"
        return end

    # -- one call -----------------------------------------------------------------------------------
    def _open(self, start: int) -> None:
        index = len(self.calls)
        self.calls.append(
            _Call(self.item_ids[index], start, self.fmt.parser(self.tools), IncrementalDetokenizer(self.decode))
        )
        self.mode = _Mode.CALL

    def _feed(self, token: int) -> None:
        call = self.calls[-1]
        text = call.detok.push(token)
        if text:
            self._report(call, *call.parser.feed(text))

    def _close(self, end: int) -> None:
        call = self.calls[-1]
        tail = call.detok.flush()
        if tail:
            self._report(call, *call.parser.feed(tail))
        parsed, name, delta = call.parser.close()
        self._report(call, name, delta)
        call.end = end
        self.sink(FunctionCallDone(len(self.calls) - 1, call.item_id, parsed.name, parsed.arguments))
        self.mode = _Mode.AFTER_CALL

    def _report(self, call: _Call, name: str | None, delta: str) -> None:
        index = len(self.calls) - 1
        if name is not None:
            call.name = name
            self.sink(FunctionCallStarted(index, call.item_id, name))
        if delta:
            self.sink(FunctionCallDelta(index, delta))


def function_calls(renderer, tools: tuple, spec) -> CallTracker | None:
    """The tracker of a new response's calls (None when its conversation offers no tools: every token is text, as
    without function calling). Raises :class:`~pipeline.errors.InvalidInputError` for a tool choice the tools cannot
    meet: a required call without tools or without call item ids, or a named tool the conversation does not offer."""
    choice: ToolChoice = spec.tool_choice
    if not tools:
        if choice.mode is ToolMode.REQUIRED:
            raise InvalidInputError("tool_choice asks for a function call, but no tools are set", param="tool_choice")
        return None
    names = frozenset(tool.name for tool in tools)
    if choice.name is not None and choice.name not in names:
        raise InvalidInputError(
            f"tool_choice names {choice.name!r}, which is not one of the tools", param="tool_choice"
        )
    if choice.mode is ToolMode.REQUIRED and not spec.call_item_ids:
        raise InvalidInputError("a required function call needs an item id for it", param="call_item_ids")
    return CallTracker(
        renderer.tools,
        tools=frozenset({choice.name}) if choice.name is not None else names,
        choice=choice,
        item_ids=spec.call_item_ids,
        decode=renderer.decode,
        sink=spec.sink,
    )
