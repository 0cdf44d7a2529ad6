"""Function calling in Qwen's chat format (Qwen2.5-Omni and Qwen3-Omni render it alike): the tools block of the
system message, calls and tool responses.

Layout (what the Qwen chat templates render for ``tools=`` and tool messages)::

    <|im_start|>system\n{instructions}\n\n# Tools\n\n{preamble}\n<tools>\n{tool json}\n...\n</tools>
    \n\n{call format}<|im_end|>\n
    <|im_start|>assistant\n{text}\n<tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call><|im_end|>\n
    <|im_start|>user\n<tool_response>\n{output}\n</tool_response>\n<tool_response>\n...<|im_end|>\n

Each tool is written as ``{"type": "function", "function": {"name", "description", "parameters"}}`` in JSON (keys in
that order, non-ASCII kept). ``<tool_call>`` / ``</tool_call>`` are added tokens of the tokenizer: their ids come from
it, never from literals; ``<tool_response>`` is plain text.

:class:`HermesCallParser` reads one call's text as the model writes it: the name as soon as it is complete, then the
arguments streamed, holding back only what may still turn out to be the closing brace of the call object.
"""

from __future__ import annotations

import json
import re

from pipeline.errors import FunctionCallError
from pipeline.models.rendering import ParsedCall
from pipeline.tools import Tool

CALL_OPEN = "<tool_call>"
CALL_CLOSE = "</tool_call>"
RESPONSE_OPEN = "<tool_response>"
RESPONSE_CLOSE = "</tool_response>"

TOOLS_PREAMBLE = (
    "\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>"
)
TOOLS_EPILOGUE = (
    "\n</tools>\n\nFor each function call, return a json object with function name and arguments within "
    '<tool_call></tool_call> XML tags:\n<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n'
    "</tool_call>"
)
"""The tools block around the tool list: the wording Qwen2.5 was trained with (its chat template's), so calls come
out in the format below."""


def tool_json(tool: Tool) -> str:
    return json.dumps({"type": "function", "function": tool.as_dict()}, ensure_ascii=False)


def system_text(instructions: str, tools: tuple[Tool, ...]) -> str:
    """The system message's content: ``instructions`` and, with tools, the tools block after them."""
    if not tools:
        return instructions
    listing = "".join("\n" + tool_json(tool) for tool in tools)
    return instructions + TOOLS_PREAMBLE + listing + TOOLS_EPILOGUE


def call_json(name: str, arguments: str) -> str:
    """A call's JSON as the template writes it: ``arguments`` (JSON text of an object) re-serialized compactly."""
    args = json.dumps(json.loads(arguments), ensure_ascii=False)
    return '{"name": "' + name + '", "arguments": ' + args + "}"


def forced_prefix(name: str | None) -> str:
    """The start of a reply that must call (``tool_choice`` required: any tool; named: that one): the model
    completes the call from here."""
    head = CALL_OPEN + '\n{"name": "'
    return head if name is None else head + name + '", "arguments": '


_NAME_THEN_ARGS = re.compile(r'\s*\{\s*"name"\s*:\s*"((?:[^"\\]|\\.)*)"\s*,\s*"arguments"\s*:\s*')
_HELD_TAIL = re.compile(r"\s*(\}\s*)?$")


class HermesCallParser:
    """One call's text between the markers, fed as it is generated (:class:`pipeline.models.rendering.CallParser`).

    :meth:`feed` returns ``(name, arguments delta)``: the name once (when it is first complete, else None) and the
    arguments' new text (possibly empty). :meth:`close` checks the whole call and returns it, with the arguments'
    last text; the deltas joined equal its ``arguments``. Raises :class:`FunctionCallError` for a call that names a
    function not in ``tools`` or is not a JSON object with a string ``name`` and an object ``arguments``."""

    def __init__(self, tools: frozenset[str]) -> None:
        self.tools = tools
        self.text = ""
        self.name: str | None = None
        self._args_at: int | None = None
        self._sent = 0

    def feed(self, text: str) -> tuple[str | None, str]:
        self.text += text
        new_name = None
        if self._args_at is None:
            match = _NAME_THEN_ARGS.match(self.text)
            if match is None:
                return None, ""
            new_name = self._check_name(json.loads(f'"{match.group(1)}"'))
            self._args_at = match.end()
        args = self.text[self._args_at :]
        if not self._sent:  # the arguments start at their first non-blank character
            self._args_at += len(args) - len(args.lstrip())
            args = args.lstrip()
        held = _HELD_TAIL.search(args)
        end = held.start() if held else len(args)
        delta = args[self._sent : end] if end > self._sent else ""
        self._sent = max(self._sent, end)
        return new_name, delta

    def close(self) -> tuple[ParsedCall, str | None, str]:
        """The complete call, the name if :meth:`feed` never reported it, and the arguments' last delta."""
        try:
            body = json.loads(self.text)
        except json.JSONDecodeError as exc:
            raise FunctionCallError(f"the model's function call is not valid JSON ({exc.msg})") from None
        if not isinstance(body, dict) or not isinstance(body.get("name"), str):
            raise FunctionCallError('the model\'s function call has no "name"')
        if not isinstance(body.get("arguments"), dict):
            raise FunctionCallError(f'the model\'s call of {body["name"]!r} has no "arguments" object')
        if self._args_at is None:  # an unusual layout: the call is reported whole
            name = self._check_name(body["name"])
            arguments = json.dumps(body["arguments"], ensure_ascii=False)
            self.name = name
            return ParsedCall(name, arguments), name, arguments
        raw = self.text[self._args_at :].rstrip()
        arguments = raw[:-1].rstrip()  # the call object's closing brace
        try:
            exact = raw.endswith("}") and json.loads(arguments) == body["arguments"]
        except json.JSONDecodeError:
            exact = False
        if not exact:
            raise FunctionCallError(f"the model's call of {self.name!r} has extra fields after its arguments")
        return ParsedCall(self.name or body["name"], arguments), None, arguments[self._sent :]

    def _check_name(self, name: str) -> str:
        if name not in self.tools:
            known = ", ".join(sorted(self.tools)) or "none"
            raise FunctionCallError(f"the model called {name!r}, which is not a tool of this response (tools: {known})")
        self.name = name
        return name


class HermesToolFormat:
    """Qwen2.5's function-calling format over a tokenizer: the renderer's ``tools``
    (:class:`pipeline.models.rendering.ToolFormat`)."""

    def __init__(self, tokenizer, *, call_open: int, call_close: int) -> None:
        self.tokenizer = tokenizer
        self.call_open = call_open
        self.call_close = call_close

    @classmethod
    def of(cls, tokenizer) -> HermesToolFormat | None:
        """The format when the tokenizer has the call markers as single tokens; None otherwise."""
        ids = [tokenizer.convert_tokens_to_ids(t) for t in (CALL_OPEN, CALL_CLOSE)]
        if any(not isinstance(i, int) or i == tokenizer.unk_token_id for i in ids):
            return None
        return cls(tokenizer, call_open=ids[0], call_close=ids[1])

    def _encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    system_text = staticmethod(system_text)

    def call(self, name: str, arguments: str) -> list[int]:
        """``<tool_call>\\n{json}\\n</tool_call>`` of a call the client added (history)."""
        return [self.call_open, *self._encode("\n" + call_json(name, arguments) + "\n"), self.call_close]

    def call_separator(self) -> list[int]:
        """Between two calls of one turn."""
        return self._encode("\n")

    def response_text(self, output: str, *, first: bool, more: bool) -> str:
        """One tool response of a user turn of tool responses: ``first`` opens the turn's text after the role, ``more``:
        another response follows in the same turn (the newline between them is written here, so that the turn's text
        tokenizes piece by piece as it does whole)."""
        text = f"{RESPONSE_OPEN}\n{output}\n{RESPONSE_CLOSE}"
        return text + "\n" if more else text

    def forced(self, name: str | None) -> list[int]:
        """Token ids of :func:`forced_prefix`."""
        head = forced_prefix(name)[len(CALL_OPEN) :]
        return [self.call_open, *self._encode(head)]

    def parser(self, tools: frozenset[str]) -> HermesCallParser:
        return HermesCallParser(tools)
