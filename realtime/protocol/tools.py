"""Function tools on the wire: ``tools`` and ``tool_choice`` of ``session.update`` / ``response.create``, checked and
converted to the engine's :class:`~pipeline.tools.Tool` / :class:`~pipeline.tools.ToolChoice`, and written back into
``session.*`` objects.

Checks (each failure is an ``invalid_value`` error naming the client's field): a tool's ``name`` is 1-64 letters,
digits, ``_`` or ``-`` and unique in its list; ``parameters`` is a JSON-schema object: ``type`` (if given) is
``"object"``, ``properties`` (if given) maps names to objects, ``required`` (if given) lists property names.
``tool_choice`` is ``"auto"``, ``"none"``, ``"required"`` or ``{"type": "function", "name": ...}``; whether a named
function is one of the tools is checked when a response starts (the tools may come from either event).
"""

from __future__ import annotations

import json
import re
from typing import Any

from pipeline.tools import AUTO, Tool, ToolChoice, ToolMode

NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")


def check_name(name: Any) -> str:
    if not isinstance(name, str) or NAME.fullmatch(name) is None:
        raise ValueError(f"must be 1 to 64 letters, digits, '_' or '-', not {json.dumps(name)[:60]}")
    return name


def check_parameters(schema: Any) -> dict | None:
    """A function's JSON schema, as far as a call's arguments depend on it (an object of named properties)."""
    if schema is None:
        return None
    if not isinstance(schema, dict):
        raise ValueError("must be a JSON schema object")
    if schema.get("type", "object") != "object":
        raise ValueError(f"must describe an object (its arguments): 'type' is {json.dumps(schema['type'])[:40]}")
    properties = schema.get("properties", {})
    if not isinstance(properties, dict) or not all(isinstance(p, dict) for p in properties.values()):
        raise ValueError("'properties' must map each argument name to a JSON schema object")
    required = schema.get("required", [])
    if not isinstance(required, list) or not all(isinstance(r, str) and r in properties for r in required):
        raise ValueError("'required' must list names defined in 'properties'")
    return schema


def check_unique(tools: list | None) -> list | None:
    if tools is not None:
        names = [tool.name for tool in tools]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise ValueError(f"has more than one tool named {', '.join(map(repr, duplicates))}")
    return tools


def check_tool_choice(value: Any) -> ToolChoice | None:
    """``None`` (left out or null), a mode name, or a named function."""
    if value is None:
        return None
    if isinstance(value, str):
        modes = {m.value: m for m in ToolMode}
        if value not in modes:
            raise ValueError(f"must be 'auto', 'none', 'required' or a function object, not {json.dumps(value)[:40]}")
        return ToolChoice(modes[value])
    if isinstance(value, dict) and value.get("type") == "function":
        if set(value) - {"type", "name"}:
            raise ValueError("a function tool choice has only 'type' and 'name'")
        return ToolChoice(ToolMode.REQUIRED, check_name(value.get("name")))
    if isinstance(value, dict) and value.get("type") == "mcp":
        raise ValueError("MCP tools are not supported: name a function tool, or send 'auto', 'none' or 'required'")
    raise ValueError("must be 'auto', 'none', 'required' or {\"type\": \"function\", \"name\": ...}")


def engine_tool(name: str, description: str | None, parameters: dict | None) -> Tool:
    return Tool(name, description or "", json.dumps(parameters, ensure_ascii=False) if parameters is not None else "")


def tool_object(tool: Tool) -> dict:
    """A tool as ``session.tools`` lists it."""
    body: dict = {"type": "function", "name": tool.name, "description": tool.description}
    body["parameters"] = json.loads(tool.parameters) if tool.parameters else {"type": "object", "properties": {}}
    return body


def tool_choice_object(choice: ToolChoice) -> str | dict:
    if choice.name is not None:
        return {"type": "function", "name": choice.name}
    return choice.mode.value


def beta_tool_choice(choice: ToolChoice) -> str:
    """The beta session's ``tool_choice`` is a string: a named function appears as its name."""
    return choice.name if choice.name is not None else choice.mode.value


def resolve_choice(tools: tuple[Tool, ...], choice: ToolChoice) -> str | None:
    """Why ``choice`` cannot apply to ``tools`` (None: it can)."""
    if choice.mode is ToolMode.REQUIRED and not tools:
        return "tool_choice asks for a function call, but no tools are set"
    if choice.name is not None and choice.name not in {t.name for t in tools}:
        known = ", ".join(t.name for t in tools) or "none"
        return f"tool_choice names function {choice.name!r}, which is not one of the tools ({known})"
    return None


__all__ = [
    "AUTO",
    "beta_tool_choice",
    "check_name",
    "check_parameters",
    "check_tool_choice",
    "check_unique",
    "engine_tool",
    "resolve_choice",
    "tool_choice_object",
    "tool_object",
]
