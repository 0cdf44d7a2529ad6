"""What the async API asks of the engine core: commands as plain, picklable data.

A :class:`Command` names one :class:`~pipeline.core.EngineCore` method and its positional arguments. The
engine thread runs it between two steps as ``getattr(core, method)(*args)``; an engine core in a child
process receives the same object over a pipe and runs it the same way. :data:`ENGINE_COMMANDS` is the one
list of what the engine accepts.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pipeline.core import EngineCore

ENGINE_COMMANDS = frozenset({
    "open_conversation", "close_conversation", "set_instructions",
    "add_text", "add_audio", "append_audio", "commit_audio", "discard_audio",
    "delete_item", "truncate_item",
    "start_response", "cancel_response",
    "stats", "has_work",
})  # fmt: skip
"""The EngineCore methods a command may name. ``start_response`` takes a
:class:`~pipeline.request.ResponseSpec`, whose callables an engine process replaces with its own."""


@dataclass(frozen=True)
class Command:
    """``getattr(core, method)(*args)``, run on the engine thread between two steps. Arguments must pickle
    (strings, numbers, numpy arrays, frozen dataclasses) when the engine core runs in a child process."""

    method: str
    args: tuple[Any, ...] = ()

    def __post_init__(self) -> None:
        if self.method not in ENGINE_COMMANDS:
            raise ValueError(f"unknown engine command {self.method!r} (one of {sorted(ENGINE_COMMANDS)})")

    def __call__(self, core: EngineCore) -> Any:
        return getattr(core, self.method)(*self.args)
