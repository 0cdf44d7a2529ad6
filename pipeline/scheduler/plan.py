"""What one engine step does, as plain data: the scheduler's answer, the runners' input.

Ordering contract of a step (:meth:`pipeline.core.engine_core.EngineCore.step`): responses cancelled or failing while
the plan is
made end first (the scheduler's ``end`` callback); the ``sampler_resets`` apply before any prefill chunk runs; the
``prefills`` run together as one batch; then one batched thinker decode over ``thinker_rows``; then the talker over
``talker_rows`` (its prefills first, under ``talker_prefills``); then one token2wav job (:class:`AudioPlan`), chosen
once the step's codes are in.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from pipeline.core.response_state import ResponseState
from pipeline.scheduler.prefill_batch import PrefillJob

__all__ = ["AudioPlan", "StepPlan"]


@dataclass
class StepPlan:
    sampler_resets: list[tuple[int, list[int]]] = field(default_factory=list)
    """``(thinker slot, prompt token ids)`` of responses whose prompt was rendered for the first time: the sampler's
    repetition state of that slot starts from the prompt."""
    prefills: list[PrefillJob] = field(default_factory=list)
    """This step's thinker prefill chunks (responses' prompts first, then idle conversations still being spoken)."""
    background: int = 0
    """Idle conversations whose background prefill progressed (chunks planned, or a cache cropped)."""
    decoding: list[ResponseState] = field(default_factory=list)
    """Responses past their prompt that step this time (not paused by backpressure)."""
    thinker_rows: list[ResponseState] = field(default_factory=list)
    """Responses whose pending token goes through the thinker in this step's batched decode."""
    talker_rows: list[ResponseState] = field(default_factory=list)
    """Spoken replies whose talker may step (start, or decode one code)."""
    talker_prefills: int = 0
    """How many talkers may start (prefill) this step."""
    progressed: bool = False
    """Planning itself progressed (a response ended, a chunk was planned)."""


@dataclass
class AudioPlan:
    """One token2wav job: the responses whose next chunk it makes, most urgent first; ``urgent``: first chunks (it
    runs on the CUDA stream that outranks decode)."""

    rows: list[ResponseState]
    urgent: bool
