"""Per-response state held by the engine thread (vLLM-style request object)."""

from __future__ import annotations

import enum
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field, replace


from pipeline.conversation_state import ConversationState, ConvItem
from pipeline.output.detokenizer import IncrementalDetokenizer
from pipeline.outputs import ResponseEvent
from pipeline.output.playout import Playout
from pipeline.output.start_buffer import StartBuffer


class Phase(enum.IntEnum):
    """Ordered: a response only moves forward."""

    PREFILL = 0
    DECODE = 1
    FINISHED = 2


class TextEnd(enum.Enum):
    NOT_YET = "not_yet"
    STOP = "stop"
    MAX_TOKENS = "max_tokens"


def _accept_always() -> bool:
    return True


def _unbound_sink(event: ResponseEvent) -> None:
    raise RuntimeError("this ResponseSpec crossed a process boundary and was never bound to a sink")


@dataclass
class ResponseSpec:
    """What the async layer asks for. ``sink`` is called on the engine thread with each event;
    ``can_accept`` is polled before each step (False pauses the response: backpressure).

    The callables stay in the process that made them: :meth:`detached` is the picklable copy that an engine
    in a child process receives, and the child gives it its own callables with :meth:`bind`."""

    id: str
    conv_id: str
    item_id: str
    audio: bool
    voice: str
    max_text_tokens: int
    sink: Callable[[ResponseEvent], None]
    can_accept: Callable[[], bool] = _accept_always

    def detached(self) -> ResponseSpec:
        """This spec without its callables (module-level placeholders, so it pickles); its sink raises."""
        return replace(self, sink=_unbound_sink, can_accept=_accept_always)

    def bind(self, sink: Callable[[ResponseEvent], None], can_accept: Callable[[], bool]) -> ResponseSpec:
        return replace(self, sink=sink, can_accept=can_accept)


@dataclass
class ResponseState:
    spec: ResponseSpec
    conv: ConversationState
    item: ConvItem
    detok: IncrementalDetokenizer
    seed: int = 0
    """Noise seed of this response's thinker and talker sampling (pipeline/runners/sampling.py)."""
    phase: Phase = Phase.PREFILL
    started_at: float = 0.0
    """perf_counter() when the engine thread took the response."""
    started_at_s: float = 0.0
    """The same moment on ``time.monotonic()`` (host-wide; reported in StageTimings for callers in other
    processes)."""
    milestones: dict[str, float] = field(default_factory=dict)
    """StageTimings field -> ms since ``started_at`` (first occurrence only)."""
    cancel_reason: str | None = None
    # thinker
    text_end: TextEnd = TextEnd.NOT_YET
    pending_token: int | None = None
    """Sampled but not yet fed through the thinker."""
    prompt_len: int = 0
    input_text_tokens: int = 0
    input_audio_tokens: int = 0
    cached_tokens: int = 0
    # talker
    talker_len: int = 0
    """Positions of the conversation's talker slot in use by this reply (prompt, speaker bos, codes so far)."""
    talker_queue: deque = field(default_factory=deque)
    talker_started: bool = False
    talker_done: bool = False
    text_eos_sent: bool = False
    last_code: int | None = None
    codes: list[int] = field(default_factory=list)
    codec_tokens: int = 0
    # token2wav
    t2w: object | None = None
    samples: int = 0
    first_audio_at: float | None = None
    """``time.perf_counter()`` when the first non-empty audio chunk was made (None before); it left the engine then,
    or with :attr:`start_buffer` when that released it."""
    start_buffer: StartBuffer | None = None
    """The first chunks held until the player has enough in hand (``token2wav.start_buffer_ms``, pipeline/
    start_buffer.py); None: nothing held (not decided yet, not held, or released)."""
    start_held_ms: float | None = None
    """How long the first audio was held (ms, first chunk made to sent), once released; None: it was not held."""
    playout: Playout = field(default_factory=Playout)
    """A real-time player of the emitted audio, on ``time.perf_counter()`` (pipeline/output/playout.py): it starts when the
    first chunk leaves the engine."""

    @property
    def id(self) -> str:
        return self.spec.id

    def mark(self, milestone: str) -> None:
        if milestone not in self.milestones:
            self.milestones[milestone] = (time.perf_counter() - self.started_at) * 1000

    @property
    def thinker_done(self) -> bool:
        return self.text_end is not TextEnd.NOT_YET

    def all_done(self) -> bool:
        if not self.thinker_done:
            return False
        if not self.spec.audio:
            return True
        return self.talker_done and (self.t2w is None or self.t2w.done)
