"""What the async API asks of the engine core: one frozen dataclass per operation, plain picklable data.

Each request carries the same fields the session layer has at hand (conversation id, item id, text, pcm, ...).
:meth:`pipeline.core.engine_core.EngineCore.handle` runs one between two engine steps, in submission order, with a
``match``
over these classes — so a reader can follow a request from the socket to the step that uses it. An engine core in a
child process receives the same objects over a pipe. Arguments must pickle (strings, numbers, numpy arrays, frozen
dataclasses); :class:`StartResponse`'s spec crosses detached (see
:meth:`pipeline.core.response_state.ResponseSpec.detached`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from pipeline.api import ContextPolicy
from pipeline.core.response_state import ResponseSpec
from pipeline.tools import Tool

__all__ = [
    "AddAudio",
    "AddFunctionCall",
    "AddFunctionOutput",
    "AddContent",
    "AddText",
    "AddVideoFrame",
    "AppendAudio",
    "CancelResponse",
    "CloseConversation",
    "CommitAudio",
    "DeleteItem",
    "DiscardAudio",
    "EngineRequest",
    "GetStats",
    "HasWork",
    "OpenConversation",
    "SetContextPolicy",
    "SetInstructions",
    "SetTools",
    "StartResponse",
    "TruncateItem",
]


@dataclass(frozen=True)
class OpenConversation:
    conv_id: str
    instructions: str


@dataclass(frozen=True)
class CloseConversation:
    """Ends the conversation's live response (``cancelled``) and frees its KV slots."""

    conv_id: str


@dataclass(frozen=True)
class SetInstructions:
    conv_id: str
    instructions: str


@dataclass(frozen=True)
class SetContextPolicy:
    """The conversation's own context policy (None: the engine's), applied from its next response on."""

    conv_id: str
    policy: ContextPolicy | None


@dataclass(frozen=True)
class SetTools:
    """The function tools offered to the model (part of its system prompt); ``()``: none."""

    conv_id: str
    tools: tuple[Tool, ...]


@dataclass(frozen=True)
class AddFunctionCall:
    """An assistant's call added by the client (history); ``arguments``: JSON text of an object."""

    conv_id: str
    item_id: str
    name: str
    arguments: str


@dataclass(frozen=True)
class AddFunctionOutput:
    """A tool's result for the model's next reply."""

    conv_id: str
    item_id: str
    output: str


@dataclass(frozen=True)
class AddContent:
    """A user message of text and pictures (uint8 RGB ``(H, W, 3)`` arrays), placed as :class:`AddText` places it."""

    conv_id: str
    item_id: str
    parts: tuple
    previous_item_id: str | None = None


@dataclass(frozen=True)
class AddText:
    """Appended, or inserted right after ``previous_item_id`` (``pipeline.api.ROOT_ITEM_ID``: first)."""

    conv_id: str
    item_id: str
    role: str
    text: str
    previous_item_id: str | None = None


@dataclass(frozen=True)
class AddAudio:
    """A whole audio message (16 kHz float32 mono): the same path as streamed audio, so features are identical.
    Placed as :class:`AddText` is."""

    conv_id: str
    item_id: str
    pcm: np.ndarray
    previous_item_id: str | None = None


@dataclass(frozen=True)
class AddVideoFrame:
    """A camera frame (uint8 RGB ``(H, W, 3)``, checked by the handle) of a message still being spoken, seen ``t``
    seconds after its first audio sample (:mod:`pipeline.video.message`). An error is kept and raised by the
    message's :class:`CommitAudio`."""

    conv_id: str
    item_id: str
    frame: np.ndarray
    t: float


@dataclass(frozen=True)
class AppendAudio:
    """More of a message still being spoken (16 kHz float32 mono); its complete 2 s blocks are encoded and prefilled
    in the background. An error is kept and raised by the message's :class:`CommitAudio`."""

    conv_id: str
    item_id: str
    pcm: np.ndarray


@dataclass(frozen=True)
class CommitAudio:
    conv_id: str
    item_id: str


@dataclass(frozen=True)
class DiscardAudio:
    conv_id: str
    item_id: str


@dataclass(frozen=True)
class DeleteItem:
    conv_id: str
    item_id: str


@dataclass(frozen=True)
class TruncateItem:
    """Keep the share of a spoken reply the user heard (``audio_end_ms`` of its audio)."""

    conv_id: str
    item_id: str
    audio_end_ms: int


@dataclass(frozen=True)
class StartResponse:
    spec: ResponseSpec


@dataclass(frozen=True)
class CancelResponse:
    """The response ends ``cancelled`` with ``reason`` at the start of the next step (every stage within one step)."""

    response_id: str
    reason: str


@dataclass(frozen=True)
class GetStats:
    """The engine's counters and sizes; ``pending_requests``: requests queued behind this one (the caller counts)."""

    pending_requests: int = 0


@dataclass(frozen=True)
class HasWork:
    """Whether a step can do something now (see :meth:`pipeline.core.engine_core.EngineCore.has_work`)."""


EngineRequest = (
    OpenConversation
    | CloseConversation
    | SetInstructions
    | SetContextPolicy
    | SetTools
    | AddFunctionCall
    | AddFunctionOutput
    | AddContent
    | AddText
    | AddAudio
    | AppendAudio
    | AddVideoFrame
    | CommitAudio
    | DiscardAudio
    | DeleteItem
    | TruncateItem
    | StartResponse
    | CancelResponse
    | GetStats
    | HasWork
)
"""Every request the engine core takes."""
