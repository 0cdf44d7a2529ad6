"""What a response stream yields: typed, immutable events.

Order contract for one response: zero or more :class:`TextDelta` and :class:`AudioChunk` events,
interleaved as produced (text usually leads audio), then exactly one :class:`ResponseDone`, last. A response whose
conversation offers function tools may also make calls, after its text: per call one :class:`FunctionCallStarted`,
its :class:`FunctionCallDelta` events, and :class:`FunctionCallDone` once the call is complete and valid (a call that
is not fails the response instead). A call's text is never in a ``TextDelta`` and never spoken.
Audio is float32 mono at :data:`OUTPUT_SAMPLE_RATE` (24 kHz); chunks are contiguous and
``AudioChunk.start_sample`` counts samples from the start of the response.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

import numpy as np

OUTPUT_SAMPLE_RATE = 24_000
"""Sample rate of every audio chunk the engine yields (Hz)."""


class ResponseStatus(enum.Enum):
    """Where a response is, in order: a response only moves forward (``a < b``: ``a`` comes first). The first three
    are live (inside the engine); the last four are final, and :class:`ResponseDone` carries one of them
    (``is_finished()``). A text-only response skips ``SYNTHESIZING``."""

    PREFILLING = "prefilling"
    """The thinker is prefilling the conversation up to the reply's header."""
    DECODING = "decoding"
    """The thinker samples reply tokens and, for a spoken reply, the talker codec tokens (either may be done)."""
    SYNTHESIZING = "synthesizing"
    """Every token is made; token2wav is turning the last codes into audio."""
    COMPLETED = "completed"
    INCOMPLETE = "incomplete"
    """Stopped at ``max_output_tokens``."""
    CANCELLED = "cancelled"
    FAILED = "failed"

    def is_finished(self) -> bool:
        return _STATUS_ORDER[self] >= _STATUS_ORDER[ResponseStatus.COMPLETED]

    def __lt__(self, other: ResponseStatus) -> bool:
        if not isinstance(other, ResponseStatus):
            return NotImplemented
        return _STATUS_ORDER[self] < _STATUS_ORDER[other]

    def __le__(self, other: ResponseStatus) -> bool:
        if not isinstance(other, ResponseStatus):
            return NotImplemented
        return _STATUS_ORDER[self] <= _STATUS_ORDER[other]


_STATUS_ORDER = {status: i for i, status in enumerate(ResponseStatus)}


@dataclass(frozen=True, kw_only=True)
class Usage:
    """Token counts of one response. Input counts the whole prompt (the conversation so far), split
    into text, audio and image positions (video frames count as image positions); ``cached_tokens`` of it were
    already in the KV cache when the response started (prefilled earlier, in the background or by earlier turns)."""

    input_text_tokens: int = 0
    input_audio_tokens: int = 0
    input_image_tokens: int = 0
    cached_tokens: int = 0
    output_text_tokens: int = 0
    output_audio_tokens: int = 0

    @property
    def input_tokens(self) -> int:
        return self.input_text_tokens + self.input_audio_tokens + self.input_image_tokens

    @property
    def output_tokens(self) -> int:
        return self.output_text_tokens + self.output_audio_tokens


@dataclass(frozen=True)
class StageTimings:
    """Milliseconds from the moment the engine thread started the response to each milestone
    (None if not reached). Measured on the engine thread; GPU work is synchronised by the
    milestones themselves (each needs its result on the host)."""

    prefill_done_ms: float | None = None
    """The conversation is prefilled and the first reply token sampled."""
    talker_first_code_ms: float | None = None
    talker_first_chunk_ms: float | None = None
    """The talker has produced every code the first token2wav chunk needs (its look-ahead included)."""
    token2wav_first_job_ms: float | None = None
    """The token2wav job holding the first chunk started: later than ``talker_first_chunk_ms`` while the worker was
    busy with another job (or the policy picked other streams first)."""
    token2wav_first_made_ms: float | None = None
    """The first audio chunk was made; it left the engine then, or later when held for a start buffer
    (``token2wav.start_buffer_ms``)."""
    token2wav_first_chunk_ms: float | None = None
    """The first audio chunk left the engine."""
    started_at_s: float | None = None
    """``time.monotonic()`` (seconds) when the engine took the response: a host-wide clock, so a caller in
    another process on the same host can place the milestones on its own timeline."""


@dataclass(frozen=True)
class TextDelta:
    """Newly decoded reply text. ``token_ids`` are the thinker tokens behind it (may be empty
    text when a token ends mid UTF-8 sequence; the bytes arrive with a later delta)."""

    text: str
    token_ids: tuple[int, ...]


@dataclass(frozen=True)
class AudioChunk:
    """A piece of reply audio, float32 in [-1, 1], 24 kHz mono, ready to play."""

    pcm: np.ndarray
    start_sample: int
    codec_tokens_so_far: int = 0
    """How many codec tokens (or frames, for a talker that makes frames) the talker had sampled when this chunk was
    yielded (the family's ``codes_per_second`` per second of audio); fewer than the reply's total means audio started
    while the talker was still running."""

    @property
    def duration_ms(self) -> float:
        return 1000.0 * len(self.pcm) / OUTPUT_SAMPLE_RATE


@dataclass(frozen=True)
class FunctionCallStarted:
    """The model began call ``index`` (0, 1, ... within the response) of function ``name``; it joins the conversation
    as item ``item_id`` if it completes."""

    index: int
    item_id: str
    name: str


@dataclass(frozen=True)
class FunctionCallDelta:
    """More of call ``index``'s arguments (JSON text), as generated."""

    index: int
    delta: str


@dataclass(frozen=True)
class FunctionCallDone:
    """Call ``index`` is complete: ``arguments`` is the JSON text of an object, its deltas joined."""

    index: int
    item_id: str
    name: str
    arguments: str


@dataclass(frozen=True)
class ResponseDone:
    """Always the last event. ``reason`` is set when status is not completed:
    ``client_cancelled`` / ``turn_detected`` (or any reason given to ``cancel``),
    ``max_output_tokens``, or ``error`` with ``error`` holding the exception."""

    status: ResponseStatus
    usage: Usage
    text: str = ""
    text_token_ids: tuple[int, ...] = ()
    """The reply's thinker tokens (the final end-of-turn token excluded)."""
    audio_codes: tuple[int | tuple[int, ...], ...] = ()
    """The reply's talker codec tokens (the stop token excluded): one per talker step, a codec id or, from a frame
    talker, a frame (one id per codebook); one kind in a reply."""
    audio_samples: int = 0
    reason: str | None = None
    error: Exception | None = field(default=None, compare=False)
    timings: StageTimings = field(default_factory=StageTimings, compare=False)


ResponseEvent = TextDelta | AudioChunk | FunctionCallStarted | FunctionCallDelta | FunctionCallDone | ResponseDone


@dataclass(frozen=True)
class EngineStats:
    """A snapshot of what the engine holds, for resource-hygiene checks and metrics."""

    conversations: int
    responses: int
    """Responses being generated."""
    open_audio_messages: int
    """User audio messages being recorded (not committed yet)."""
    cached_tokens: int
    """Thinker KV positions held over all conversations."""
    talker_cached_tokens: int
    pending_commands: int
    """Commands queued for the engine thread."""
    thinker_tokens_total: int = 0
    """Thinker tokens sampled since start (reply tokens, the final stop token included; prefill positions are
    not counted)."""
    talker_tokens_total: int = 0
    """Codec tokens (or frames) sampled since start (the family's ``codes_per_second`` per second of audio)."""
    audio_samples_total: int = 0
    """24 kHz samples of audio emitted since start."""
    decode_steps_total: int = 0
    """Engine steps that decoded at least one thinker or talker token."""
    talker_chains_total: int = 0
    """Talker batches run as a chain of steps (``talker.chain_steps``); their codes count in ``talker_tokens_total``."""
    audio_underruns_total: int = 0
    """Chunks emitted after a real-time player of their reply, started on its first chunk, would have run dry
    (pipeline/output/playout.py): the engine's own lateness, before any network."""
    audio_starved_ms_total: int = 0
    """How long those players waited for those chunks in all (ms)."""
    audio_start_holds_total: int = 0
    """Replies whose first audio the engine held until their player had ``token2wav.start_buffer_ms`` in hand
    (pipeline/output/start_buffer.py), counted when released."""
    audio_start_held_ms_total: int = 0
    """How long those replies' first audio was held in all (ms, first chunk made to sent)."""
    device_memory_bytes: int = 0
    """Accelerator memory allocated by torch now (0 on the CPU)."""
    device_memory_peak_bytes: int = 0
    """Highest accelerator memory allocated by torch since start (0 on the CPU)."""
    video_positions: int = 0
    """Camera video positions in the conversations' committed messages (what the video budget bounds)."""
    video_frames_dropped_total: int = 0
    """Camera frames the engine dropped since start (a second frame in a frame slot, late frames, frames after the
    video ended or of another size than the message's first; pipeline/video/message.py), counted when their message
    is committed or discarded."""
    kv_slots: int = 0
    """Conversations whose thinker KV cache the engine keeps on its device at once (``stages.thinker.kv_slots`` as
    resolved at load; 0 from an engine that does not report it)."""
    talker_kv_slots: int = 0
    """Conversations whose talker KV cache it keeps at once: the spoken replies that may run together (0 without a
    talker)."""
    kv_capacity_tokens: int = 0
    """Thinker KV positions the engine's pool holds: ``kv_slots`` x the positions of a slot
    (``max_context_tokens``); ``cached_tokens`` is how many of them are used."""
    talker_kv_capacity_tokens: int = 0
    """Talker KV positions its pool holds (``talker_kv_slots`` x the positions of a talker slot)."""
