"""What one engine step does, as plain data: the scheduler's decision, the step's input, and what the step made.

A :class:`StepPlan` names responses and conversations by id and KV slots by number; it holds no live state, so it can
be logged, compared and pickled. :meth:`pipeline.scheduler.scheduler.Scheduler.schedule` makes it, the step's phases
(:class:`pipeline.step.phases.StepPhases`) execute it into a :class:`StepOutput`, and
:meth:`pipeline.core.lifecycle.ResponseLifecycle.update_from_output` applies that output: every response that ends in
a step ends there.

Ordering contract of a step (:meth:`pipeline.core.engine_core.EngineCore.step`): the ``sampler_resets`` apply before
any prefill chunk runs; the ``prefills`` run together as one batch, then the ``talker_listens`` of the background
chunks that ran; then one batched thinker decode over ``thinker_rows`` beside the talker over ``talker_rows`` (its
``talker_starts`` after the thinker's decode, then one batched decode or a chain of ``chain_steps``); then one
token2wav job, picked by ``audio`` among the streams whose next chunk the step's codes made ready (earliest playout
deadline first; none when no stream is due); then the update: the ``ends`` decided while planning, the step's
failures, the responses whose every stage is done.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from pipeline.scheduler.prefill_batch import PrefillJob
from pipeline.scheduler.token2wav_jobs import ChunkCandidate, Token2WavJob, pick_job

__all__ = ["AudioRule", "PlannedEnd", "StepOutput", "StepPlan", "TalkerListen", "TalkerStart"]


@dataclass(frozen=True)
class PlannedEnd:
    """A response the plan ends: cancelled (``error`` None) or failed while its prompt was planned. The scheduler
    already took it out of its live responses and gave its conversation back (what the rest of the plan sees); the
    update sends its end."""

    response_id: str
    error: Exception | None = None


@dataclass(frozen=True)
class TalkerStart:
    """A reply's talker that starts this step (its prefill and first code), into talker ``slot`` (already assigned to
    its conversation); ``quick``: its audio starts with the quick first chunk."""

    response_id: str
    conv_id: str
    slot: int
    quick: bool


@dataclass(frozen=True)
class TalkerListen:
    """An idle conversation whose talker cache follows its thinker cache after this step's background chunk, into
    talker ``slot`` (its own or a free one: listening never evicts)."""

    conv_id: str
    slot: int


@dataclass(frozen=True)
class AudioRule:
    """How this step's token2wav job is picked. Why a rule and not a job: the job's candidates are the streams whose
    next chunk the codes of this very step make ready, and how long each has until its playout deadline at that
    moment, neither of which exists while the plan is made. The plan fixes the policy's inputs (the batch limit, the
    starving margin, the lead: ``lead_ms`` None when no stream may wait this step); :meth:`pick` is pure over the
    candidates the step found, their deadlines read off the engine's clock when it picks."""

    max_streams: int
    starving_margin_ms: float
    lead_ms: float | None = None

    def pick(self, candidates: Sequence[ChunkCandidate]) -> Token2WavJob | None:
        """The job among ``candidates`` (:func:`pipeline.scheduler.token2wav_jobs.pick_job`; None: none is due)."""
        return pick_job(candidates, self.max_streams, starving_margin_ms=self.starving_margin_ms, lead_ms=self.lead_ms)


@dataclass
class StepPlan:
    audio: AudioRule
    """How the step's token2wav job is picked once its codes are in."""
    ends: list[PlannedEnd] = field(default_factory=list)
    """Responses ended while planning (cancelled, or their prompt could not be planned), in start order."""
    sampler_resets: list[tuple[int, list[int]]] = field(default_factory=list)
    """``(thinker slot, prompt token ids)`` of responses whose prompt was rendered for the first time: the sampler's
    repetition state of that slot starts from the prompt."""
    prefills: list[PrefillJob] = field(default_factory=list)
    """This step's thinker prefill chunks (responses' prompts first, then idle conversations still being spoken)."""
    background: int = 0
    """Idle conversations whose background prefill progressed (chunks planned, or a cache cropped)."""
    talker_listens: list[TalkerListen] = field(default_factory=list)
    """Conversations of background chunks whose talker cache follows their thinker cache once the chunk ran."""
    decoding: list[str] = field(default_factory=list)
    """Responses past their prompt that step this time (not paused by backpressure)."""
    thinker_rows: list[str] = field(default_factory=list)
    """Responses whose pending token goes through the thinker in this step's batched decode."""
    talker_rows: list[str] = field(default_factory=list)
    """Spoken replies whose talker may step (start, or decode one code)."""
    talker_starts: list[TalkerStart] = field(default_factory=list)
    """Of ``talker_rows``, the talkers that start this step, in order (under the step's talker prefill budget)."""
    chain_steps: int = 1
    """Talker decode steps queued at once (1: one step as usual)."""
    progressed: bool = False
    """Planning itself progressed (a response ended, a chunk was planned)."""


@dataclass
class StepOutput:
    """What executing a :class:`StepPlan` made, as plain data (ids, tokens, codes); the update applies it."""

    tokens: list[tuple[str, int]] = field(default_factory=list)
    """``(response id, text token)`` accepted this step, in order."""
    codes: list[tuple[str, object]] = field(default_factory=list)
    """``(response id, code)`` accepted this step (a frame talker's code is its frame, a list of ids)."""
    failures: dict[str, Exception] = field(default_factory=dict)
    """Response id -> error of the responses that failed while the plan ran (the first error of each, in the order
    they failed); each is skipped by the rest of the step and ends ``failed`` in the update."""
    ready: list[str] = field(default_factory=list)
    """Responses whose stream had the codes of its next chunk and was not in the token2wav worker."""
    audio_job: tuple[str, ...] = ()
    """The responses whose chunks the step's token2wav job makes (empty: no job this step)."""
    in_worker: set[str] = field(default_factory=set)
    """Responses whose stream the token2wav worker holds once the step's job was handed over."""

    def fail(self, response_id: str, error: Exception) -> None:
        """Record that a response failed (a second error of the same response is dropped: it already failed)."""
        self.failures.setdefault(response_id, error)
