"""The state of one response, shared by the parts that write its output: :class:`ActiveResponse` (with its
:class:`ResponsePhase` and its function calling, :class:`ResponseCalls`). Plain data; the rules are
:mod:`realtime.session.responses`', :mod:`~realtime.session.output_audio`'s and :mod:`~realtime.session.tool_calls`'.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from pipeline.tools import Tool, ToolChoice
from realtime.protocol.audio_format import AudioFormat
from realtime.protocol.codes import StatusReason
from realtime.protocol.model import ContentPart, Item, OutputModality, ResponseSummary, ResponseWireStatus
from realtime.protocol.server import ContentRef
from realtime.session.settings import AudioEncoder


class ResponsePhase(enum.Enum):
    IN_PROGRESS = "in_progress"
    CANCELLING = "cancelling"
    """Cancel decided: engine output is dropped until its ``ResponseDone`` arrives."""


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


@dataclass
class ActiveResponse:
    """The response in progress (one at a time) and everything its output has made so far."""

    id: str
    item: Item
    part: ContentPart
    previous_item_id: str | None
    modality: OutputModality
    voice: str | None
    output_format: AudioFormat
    max_output_tokens: int | None
    metadata: dict[str, str] | None
    encoder: AudioEncoder | None
    restore_instructions: bool
    event_id: str | None = None
    """The ``event_id`` of the ``response.create`` that asked for it (None for one started by turn detection):
    an ``error`` of its failure carries it."""
    requested: bool = False
    """Asked for by a ``response.create`` (rather than by turn detection)."""
    first_audio_ms: float | None = None
    """The audio clock when its first audio delta was sent (WebSocket), for the idle timeout."""
    phase: ResponsePhase = ResponsePhase.IN_PROGRESS
    cancel_reason: StatusReason | None = None
    calls: ResponseCalls = field(default_factory=ResponseCalls)
    outputs: list[Item] = field(default_factory=list)
    """The output items announced so far, in output order (the message, then function calls)."""

    @property
    def announced(self) -> bool:
        return self.item in self.outputs

    @property
    def ref(self) -> ContentRef:
        return ContentRef(self.id, self.item.id, output_index=self.outputs.index(self.item))

    def output_index(self, item: Item) -> int:
        return self.outputs.index(item)

    def summary(self, conversation_id: str, state: ResponseWireStatus, **done: object) -> ResponseSummary:
        return ResponseSummary(
            id=self.id,
            conversation_id=conversation_id,
            state=state,
            modality=self.modality,
            voice=self.voice,
            output_format=self.output_format,
            max_output_tokens=self.max_output_tokens,
            metadata=self.metadata,
            **done,  # type: ignore[arg-type]
        )
