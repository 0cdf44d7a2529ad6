"""A response inside the engine: what was asked (:class:`ResponseSpec`) and where each stage is.

:class:`ResponseState` holds one :class:`~pipeline.response_events.ResponseStatus` (ordered; a response only moves
forward)
and one streaming-state dataclass per stage: :class:`ThinkerState` (prompt and reply text), :class:`TalkerState`
(codec tokens) and :class:`AudioState` (token2wav stream, playout, start buffer). Only the engine thread reads or
writes them.
"""

from __future__ import annotations

import enum
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from pipeline.core.conversation_state import ConversationState, ConvItem
from pipeline.models.synthesis import Token2WavStream
from pipeline.output.detokenizer import IncrementalDetokenizer
from pipeline.output.function_calls import CallTracker
from pipeline.output.playout import Playout
from pipeline.output.start_buffer import StartBuffer
from pipeline.response_events import ResponseEvent, ResponseStatus
from pipeline.tools import AUTO, ToolChoice

__all__ = [
    "AudioState",
    "ResponseSpec",
    "ResponseState",
    "TalkerCode",
    "TalkerState",
    "TalkerStatus",
    "TextEnd",
    "ThinkerState",
]

TalkerCode = int | tuple[int, ...]
"""What one talker step makes: a codec id, or a frame talker's frame (one id per codebook, codebook 0 first)."""


class TextEnd(enum.Enum):
    """Why the thinker stopped writing the reply."""

    STOP = "stop"
    """It sampled a stop token."""
    MAX_TOKENS = "max_tokens"
    """The reply reached ``max_text_tokens``."""


class TalkerStatus(enum.IntEnum):
    """Ordered: a talker only moves forward."""

    WAITING = 0
    """Not started: waits for the first reply vector, a talker slot or the step's prefill budget."""
    RUNNING = 1
    """Prefilled; one codec token per step."""
    DONE = 2
    """Its last code is made (a stop code, or the most codes)."""


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
    voice: str | None
    """The reply's voice (None only from an engine without audio output, whose replies are never spoken)."""
    max_text_tokens: int
    sink: Callable[[ResponseEvent], None]
    can_accept: Callable[[], bool] = _accept_always
    tool_choice: ToolChoice = AUTO
    """Whether the reply may (or must) call one of the conversation's tools."""
    call_item_ids: tuple[str, ...] = ()
    """The conversation item ids of the calls the reply makes, in order; it makes at most that many."""

    @property
    def spoken_voice(self) -> str:
        """The voice of a spoken reply; RuntimeError (a bug) where there is none, which only an engine without audio
        output leaves, whose replies are never spoken."""
        if self.voice is None:
            raise RuntimeError(f"response {self.id} is spoken but has no voice")
        return self.voice

    def detached(self) -> ResponseSpec:
        """This spec without its callables (module-level placeholders, so it pickles); its sink raises."""
        return replace(self, sink=_unbound_sink, can_accept=_accept_always)

    def bind(self, sink: Callable[[ResponseEvent], None], can_accept: Callable[[], bool]) -> ResponseSpec:
        return replace(self, sink=sink, can_accept=can_accept)


@dataclass
class ThinkerState:
    """The reply's text side: its prompt (counted once, at the first prefill chunk) and the token in flight."""

    end: TextEnd | None = None
    """None while the thinker still writes."""
    pending_token: int | None = None
    """Sampled but not yet fed through the thinker."""
    silent: bool = False
    """The reply began a function call: what the thinker writes from then on never reaches the talker."""
    prompt_len: int = 0
    """Positions of the prompt up to the reply's header; 0 before the first prefill chunk is planned."""
    input_text_tokens: int = 0
    input_audio_tokens: int = 0
    input_image_tokens: int = 0
    cached_tokens: int = 0
    """Prompt positions already in the KV cache when the response started."""

    @property
    def done(self) -> bool:
        return self.end is not None


@dataclass
class TalkerState:
    """The reply's codec side. Its inputs are the thinker's vectors (``queue``), then text-eos once, then text-pad."""

    status: TalkerStatus = TalkerStatus.WAITING
    queue: deque = field(default_factory=deque)
    """Thinker vectors (device tensors) not consumed yet, one per reply token fed through the thinker."""
    eos_sent: bool = False
    """The text-eos vector was consumed: every later input is text-pad."""
    length: int = 0
    """Positions of the conversation's talker slot in use by this reply (prompt, speaker bos, codes so far)."""
    rope_shift: int = 0
    """Rope position - cache index of the reply's talker positions after its prompt (speaker bos, reply vectors,
    codes): the thinker's shift after the prompt (0 without pictures or video), fixed when the talker starts."""
    last_code: TalkerCode | None = None
    codes: list[TalkerCode] = field(default_factory=list)
    """The codes made so far, one per step: all ids, or all frames (a tuple of codebook ids) of a frame talker."""

    @property
    def started(self) -> bool:
        return self.status >= TalkerStatus.RUNNING

    @property
    def done(self) -> bool:
        return self.status is TalkerStatus.DONE


@dataclass
class AudioState:
    """The reply's audio: its token2wav stream, what left the engine, and a real-time player of it."""

    stream: Token2WavStream | None = None
    """The token2wav stream (the family's streaming synthesizer); None before the talker starts and once closed."""
    samples: int = 0
    """Samples sent to the sink so far (24 kHz)."""
    first_made_at: float | None = None
    """``time.perf_counter()`` when the first non-empty chunk was made (None before); it left the engine then, or with
    :attr:`start_buffer` when that released it."""
    start_buffer: StartBuffer | None = None
    """The first chunks held until the player has enough in hand; None: nothing held (not decided yet, not held, or
    released)."""
    held_ms: float | None = None
    """How long the first audio was held (ms, first chunk made to sent), once released; None: it was not held."""
    playout: Playout = field(default_factory=Playout)
    """A real-time player of the sent audio on ``time.perf_counter()``: it starts when the first chunk leaves."""

    def live_stream(self) -> Token2WavStream:
        """The stream the talker's codes go to; RuntimeError (a bug) before the talker started it or once closed."""
        if self.stream is None:
            raise RuntimeError("no token2wav stream: the talker has not started, or the response has ended")
        return self.stream


@dataclass
class ResponseState:
    spec: ResponseSpec
    conv: ConversationState
    item: ConvItem
    detok: IncrementalDetokenizer
    calls: CallTracker | None = None
    """The reply's function calls, when its conversation offers tools (None: every token is text)."""
    seed: int = 0
    """Noise seed of this response's thinker and talker sampling."""
    status: ResponseStatus = ResponseStatus.PREFILLING
    started_at: float = 0.0
    """``time.perf_counter()`` when the engine thread took the response."""
    started_at_s: float = 0.0
    """The same moment on ``time.monotonic()`` (host-wide; reported in StageTimings for callers in other processes)."""
    milestones: dict[str, float] = field(default_factory=dict)
    """StageTimings field -> ms since ``started_at`` (first occurrence only)."""
    cancel_reason: str | None = None
    thinker: ThinkerState = field(default_factory=ThinkerState)
    talker: TalkerState = field(default_factory=TalkerState)
    audio: AudioState = field(default_factory=AudioState)

    @property
    def id(self) -> str:
        return self.spec.id

    @property
    def codec_tokens(self) -> int:
        return len(self.talker.codes)

    def mark(self, milestone: str) -> None:
        if milestone not in self.milestones:
            self.milestones[milestone] = (time.perf_counter() - self.started_at) * 1000

    def tokens_done(self) -> bool:
        """Every token of the reply is made: its text, and for a spoken reply its codes."""
        return self.thinker.done and (not self.spec.audio or self.talker.done)

    def all_done(self) -> bool:
        """Every stage is done: the tokens, and the audio stream's last chunk is made."""
        stream = self.audio.stream
        return self.tokens_done() and (not self.spec.audio or stream is None or stream.done)

    def advance(self, status: ResponseStatus) -> None:
        """Move to ``status``; never backwards (a bug if asked)."""
        if status < self.status:
            raise RuntimeError(f"response {self.id} cannot go from {self.status.name} back to {status.name}")
        self.status = status
