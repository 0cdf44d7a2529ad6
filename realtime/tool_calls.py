"""Moved: function calling is :mod:`realtime.session.tool_calls`, its engine commands are in
:mod:`realtime.session.commands` (importable from :mod:`realtime.session`). This module only re-exports the commands
for ``realtime/runner/engine_commands.py`` until it imports them from :mod:`realtime.session`; then delete it."""

from __future__ import annotations

from realtime.session.commands import AddFunctionCall, AddFunctionOutput, SetTools

__all__ = ["AddFunctionCall", "AddFunctionOutput", "SetTools"]
