"""Function tools as the engine takes them: what a conversation offers the model, and what a response may do with them.

A conversation's tools (:class:`Tool`) are part of its system prompt, rendered by the model family
(:meth:`pipeline.models.family.ModelFamily.renderer`'s ``tools``); changing them re-renders the prompt, so the KV cache
keeps only what precedes the system message's change. A response's :class:`ToolChoice` says whether it may call,
must call, or must call one named tool. Plain picklable data (requests cross to an engine in a child process).
"""

from __future__ import annotations

import enum
import json
from dataclasses import dataclass

__all__ = ["AUTO", "MAX_CALLS_PER_RESPONSE", "Tool", "ToolChoice", "ToolMode"]

MAX_CALLS_PER_RESPONSE = 8
"""Calls one response may make; the reply ends after the last one it may make."""


@dataclass(frozen=True)
class Tool:
    """One function tool. ``parameters``: its JSON schema as JSON text (``""``: none)."""

    name: str
    description: str = ""
    parameters: str = ""

    def as_dict(self) -> dict:
        """``name``, ``description`` (when set), ``parameters`` (when set), in that order."""
        function: dict = {"name": self.name}
        if self.description:
            function["description"] = self.description
        if self.parameters:
            function["parameters"] = json.loads(self.parameters)
        return function


class ToolMode(enum.Enum):
    AUTO = "auto"
    """The model decides whether to call."""
    NONE = "none"
    """No calls: the reply's text ends where the model starts one."""
    REQUIRED = "required"
    """The reply starts with a call (the engine writes its opening; the model completes it)."""


@dataclass(frozen=True)
class ToolChoice:
    """``mode``, and with ``REQUIRED`` optionally the one tool ``name`` the reply must call."""

    mode: ToolMode = ToolMode.AUTO
    name: str | None = None

    def __post_init__(self) -> None:
        if self.name is not None and self.mode is not ToolMode.REQUIRED:
            raise ValueError("a named tool choice is a required call")


AUTO = ToolChoice()
