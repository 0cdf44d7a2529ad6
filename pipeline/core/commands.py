"""What the async API asks of the engine core: one frozen dataclass per operation, plain picklable data.

Each request carries the same fields the session layer has at hand (conversation id, item id, text, pcm, ...).
:meth:`pipeline.core.engine_core.EngineCore.handle` runs one between two engine steps, in submission order, with a
``match``
over these classes — so a reader can follow a request from the socket to the step that uses it. An engine core in a
child process receives the same objects over a pipe. Arguments must pickle (strings, numbers, numpy arrays, frozen
dataclasses); :class:`StartResponseCommand`'s spec crosses detached (see
:meth:`pipeline.core.response_state.ResponseSpec.detached`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from pipeline.api import ContextPolicy
from pipeline.core.response_state import ResponseSpec
from pipeline.tools import Tool

__all__ = [
    "AddAudioCommand",
    "AddFunctionCallCommand",
    "AddFunctionOutputCommand",
    "AddContentCommand",
    "AddTextCommand",
    "AddVideoFrameCommand",
    "AppendAudioCommand",
    "CancelResponseCommand",
    "CloseConversationCommand",
    "CommitAudioCommand",
    "DeleteItemCommand",
    "DiscardAudioCommand",
    "CoreCommand",
    "GetStatsCommand",
    "HasWorkCommand",
    "OpenConversationCommand",
    "SetContextPolicyCommand",
    "SetInstructionsCommand",
    "SetToolsCommand",
    "StartResponseCommand",
    "TruncateItemCommand",
]


@dataclass(frozen=True)
class OpenConversationCommand:
    conv_id: str
    instructions: str


@dataclass(frozen=True)
class CloseConversationCommand:
    """Ends the conversation's live response (``cancelled``) and frees its KV slots."""

    conv_id: str


@dataclass(frozen=True)
class SetInstructionsCommand:
    conv_id: str
    instructions: str


@dataclass(frozen=True)
class SetContextPolicyCommand:
    """The conversation's own context policy (None: the engine's), applied from its next response on."""

    conv_id: str
    policy: ContextPolicy | None


@dataclass(frozen=True)
class SetToolsCommand:
    """The function tools offered to the model (part of its system prompt); ``()``: none."""

    conv_id: str
    tools: tuple[Tool, ...]


@dataclass(frozen=True)
class AddFunctionCallCommand:
    """An assistant's call added by the client (history); ``arguments``: JSON text of an object."""

    conv_id: str
    item_id: str
    name: str
    arguments: str


@dataclass(frozen=True)
class AddFunctionOutputCommand:
    """A tool's result for the model's next reply."""

    conv_id: str
    item_id: str
    output: str


@dataclass(frozen=True)
class AddContentCommand:
    """A user message of text and pictures (uint8 RGB ``(H, W, 3)`` arrays), placed as :class:`AddTextCommand` places
    it."""

    conv_id: str
    item_id: str
    parts: tuple
    previous_item_id: str | None = None


@dataclass(frozen=True)
class AddTextCommand:
    """Appended, or inserted right after ``previous_item_id`` (``pipeline.api.ROOT_ITEM_ID``: first)."""

    conv_id: str
    item_id: str
    role: str
    text: str
    previous_item_id: str | None = None


@dataclass(frozen=True)
class AddAudioCommand:
    """A whole audio message (16 kHz float32 mono): the same path as streamed audio, so features are identical.
    Placed as :class:`AddTextCommand` is."""

    conv_id: str
    item_id: str
    pcm: np.ndarray
    previous_item_id: str | None = None


@dataclass(frozen=True)
class AddVideoFrameCommand:
    """A camera frame (uint8 RGB ``(H, W, 3)``, checked by the handle) of a message still being spoken, seen ``t``
    seconds after its first audio sample (:mod:`pipeline.video.message`). An error is kept and raised by the
    message's :class:`CommitAudioCommand`."""

    conv_id: str
    item_id: str
    frame: np.ndarray
    t: float


@dataclass(frozen=True)
class AppendAudioCommand:
    """More of a message still being spoken (16 kHz float32 mono); its complete 2 s blocks are encoded and prefilled
    in the background. An error is kept and raised by the message's :class:`CommitAudioCommand`."""

    conv_id: str
    item_id: str
    pcm: np.ndarray


@dataclass(frozen=True)
class CommitAudioCommand:
    conv_id: str
    item_id: str


@dataclass(frozen=True)
class DiscardAudioCommand:
    conv_id: str
    item_id: str


@dataclass(frozen=True)
class DeleteItemCommand:
    conv_id: str
    item_id: str


@dataclass(frozen=True)
class TruncateItemCommand:
    """Keep the share of a spoken reply the user heard (``audio_end_ms`` of its audio)."""

    conv_id: str
    item_id: str
    audio_end_ms: int


@dataclass(frozen=True)
class StartResponseCommand:
    spec: ResponseSpec


@dataclass(frozen=True)
class CancelResponseCommand:
    """The response ends ``cancelled`` with ``reason`` at the start of the next step (every stage within one step)."""

    response_id: str
    reason: str


@dataclass(frozen=True)
class GetStatsCommand:
    """The engine's counters and sizes; ``pending_requests``: requests queued behind this one (the caller counts)."""

    pending_requests: int = 0


@dataclass(frozen=True)
class HasWorkCommand:
    """Whether a step can do something now (see :meth:`pipeline.core.engine_core.EngineCore.has_work`)."""


CoreCommand = (
    OpenConversationCommand
    | CloseConversationCommand
    | SetInstructionsCommand
    | SetContextPolicyCommand
    | SetToolsCommand
    | AddFunctionCallCommand
    | AddFunctionOutputCommand
    | AddContentCommand
    | AddTextCommand
    | AddAudioCommand
    | AppendAudioCommand
    | AddVideoFrameCommand
    | CommitAudioCommand
    | DiscardAudioCommand
    | DeleteItemCommand
    | TruncateItemCommand
    | StartResponseCommand
    | CancelResponseCommand
    | GetStatsCommand
    | HasWorkCommand
)
"""Every request the engine core takes."""
