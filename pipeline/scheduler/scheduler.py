"""The scheduler: which conversations prefill what, which responses decode, which token2wav job runs.

It owns the engine's bookkeeping — the live conversations and responses (in start order), the KV slot assignment of
both decoder stages (:mod:`pipeline.scheduler.kv_slots`), the step's prefill budget, the recent token2wav jobs — and
decides each step as plain data (:class:`~pipeline.scheduler.plan.StepPlan`): the thinker's prefill chunks
(:mod:`pipeline.scheduler.prefill_plan`) and decode rows, the talker's listens, starts (with their slots), rows and
chain length (:mod:`pipeline.scheduler.talker_plan`), the rule that picks the token2wav job, and the responses that
end while it plans. Other modules change its registry only through its methods. It never touches a model or a
device tensor: the rules it applies are the pure functions of :mod:`pipeline.scheduler.policies`,
:mod:`pipeline.scheduler.token2wav_jobs`, :mod:`pipeline.scheduler.prefill_batch` and
:mod:`pipeline.output.start_buffer`. Engine thread only.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType

from pipeline.core.conversation_state import ConversationState
from pipeline.core.response_state import ResponseState
from pipeline.models.positions import PositionScheme
from pipeline.output.start_buffer import holds_start
from pipeline.response_events import ResponseStatus
from pipeline.scheduler import policies
from pipeline.scheduler.kv_slots import KVSlots
from pipeline.scheduler.plan import AudioRule, PlannedEnd, StepPlan
from pipeline.scheduler.prefill_batch import PrefillBatch
from pipeline.scheduler.prefill_plan import PrefillPlanner, needs_prefill
from pipeline.scheduler.talker_plan import chain_rows, talker_listens, talker_starts
from pipeline.scheduler.token2wav_jobs import RecentJobs
from pipeline.video.budget import VideoBudget

__all__ = ["SchedulerConfig", "Scheduler", "StepContext"]


@dataclass(frozen=True)
class SchedulerConfig:
    """The settings the scheduler applies, taken from the stage configs once at engine start."""

    prefills_per_step: int
    """Thinker prefill chunks per step."""
    prefill_rows: int | None
    """Most positions of one step's prefill batch (the largest captured prefill graph; None: no limit)."""
    prefill_chunk_tokens: int
    drop_oldest: bool
    """Context policy: drop the oldest turns to make room (else a response that does not fit fails). A conversation's
    own policy (``ConversationState.policy``) replaces this and ``context_retention_ratio``."""
    context_retention_ratio: float
    """Under ``drop_oldest``: a drop leaves the prompt at most this fraction of the room beside the reply."""
    talker_prefills_per_step: int
    chain_steps: int
    min_text_tokens: int
    min_codes: int
    max_codes: int
    t2w_max_batch: int
    starving_margin_ms: int
    starving_margin_from_jobs: bool
    start_buffer_ms: int | None
    start_buffer_busy: int
    quick_first_chunk: bool
    """The token2wav schedule has a quick first chunk."""
    quick_first_chunk_max_open: int
    deadline_lead_s: float | None = None
    """A ready stream whose playout deadline is further away than this waits, in a step that decodes or prefills
    (:mod:`pipeline.scheduler.token2wav_jobs`); None: every ready stream is a candidate at once."""
    first_audio_target_ms: int = 0
    """A response's first audio is wanted this long after it started: its playout deadline before its audio starts."""
    video_budget: VideoBudget = VideoBudget(None, 1.0)
    """How much camera video the history keeps (:mod:`pipeline.video.budget`; applied before each response)."""


@dataclass(frozen=True)
class StepContext:
    """What the scheduler learns from outside itself when it plans a step (plain values)."""

    in_worker: frozenset[str] = frozenset()
    """Ids of the responses whose stream the token2wav worker holds now."""
    job_in_worker: bool = False
    """The token2wav worker is making a job now."""
    commands_waiting: bool = False
    """Requests wait for the engine thread (then no chain of talker steps is started)."""
    can_chain: bool = False
    """The talker runner can queue a chain of decode steps (a frame talker cannot)."""


class Scheduler:
    def __init__(
        self,
        cfg: SchedulerConfig,
        *,
        thinker_slots,
        talker_slots,
        positions: PositionScheme,
        talker_reads: Callable[[list], list] | None = None,
    ) -> None:
        """``thinker_slots``, ``talker_slots``: the two decoder stages' slot allocators
        (:class:`pipeline.runners.kv_pool.SlotAllocator`; the talker's None in an engine without a talker);
        ``talker_reads(keys)``: the keys of the positions a frame talker reads of a conversation (None: all)."""
        self.cfg = cfg
        self._conversations: dict[str, ConversationState] = {}
        self._responses: dict[str, ResponseState] = {}
        self._views = (MappingProxyType(self._conversations), MappingProxyType(self._responses))
        self._withdrawn: dict[str, tuple[ResponseState, PlannedEnd]] = {}
        """Responses a plan ended, until its update (or, if the step raised, ``fail_all``) finishes them."""
        self.slots = KVSlots(thinker_slots, talker_slots, self._conversations)
        self.prefill = PrefillPlanner(cfg, slots=self.slots, positions=positions, conversations=self._conversations)
        self.talker_reads = talker_reads
        self.recent_jobs = RecentJobs()
        """How long the last token2wav jobs took, hand-over to emission (ms)."""

    # -- the registry -------------------------------------------------------------------------------
    @property
    def conversations(self) -> Mapping[str, ConversationState]:
        """The open conversations by id (read only: :meth:`open_conversation`, :meth:`close_conversation`)."""
        return self._views[0]

    @property
    def responses(self) -> Mapping[str, ResponseState]:
        """The live responses by id, in start order (read only: :meth:`add_response`, :meth:`withdraw`)."""
        return self._views[1]

    @property
    def thinker_slots(self):
        return self.slots.thinker

    @property
    def talker_slots(self):
        return self.slots.talker

    @property
    def positions(self) -> PositionScheme:
        return self.prefill.positions

    @property
    def video_removed_tokens(self) -> int:
        """Thinker positions of video the video budget removed since start."""
        return self.prefill.video_removed_tokens

    def open_conversation(self, conv: ConversationState) -> None:
        self._conversations[conv.id] = conv

    def close_conversation(self, conv_id: str) -> ConversationState | None:
        """Forget the conversation (None if it is not open); its KV slots go back to the pools. Its live response, if
        any, must have ended first."""
        conv = self._conversations.pop(conv_id, None)
        if conv is not None:
            self.slots.release(conv)
        return conv

    def add_response(self, r: ResponseState) -> None:
        """A started response: planned from the next step on, after the live ones. Its first audio is wanted
        ``first_audio_target_ms`` after ``r.started_at`` (its player's ``wanted_at``, its playout deadline until its
        audio starts)."""
        r.audio.playout.wanted_at = r.started_at + self.cfg.first_audio_target_ms / 1000.0
        self._responses[r.id] = r

    def withdraw(self, r: ResponseState, cleanup: policies.Cleanup) -> bool:
        """Take ``r`` out of the live responses and give its conversation back (its reply item closed, or removed
        with ``cleanup.drop_item``; its caches and KV slots dropped with ``cleanup.drop_caches``), so that what it held
        is free for what is planned next. False (nothing done) when it is not live."""
        if self._responses.pop(r.id, None) is None:
            return False
        if cleanup.drop_item:
            r.conv.items.remove(r.item)
        elif cleanup.drop_caches:
            self.slots.release(r.conv)
        r.item.open = False
        if r.conv.active_response == r.id:
            r.conv.active_response = None
            r.conv.dirty = True  # the reply's footer and anything said meanwhile get prefilled
        return True

    def withdrawn(self, response_id: str) -> ResponseState:
        """A response a plan ended (:attr:`StepPlan.ends`), handed over once to whoever finishes it."""
        return self._withdrawn.pop(response_id)[0]

    def unfinished_ends(self) -> list[PlannedEnd]:
        """The ends of plans whose update never ran (the step raised before it), in the order they were planned."""
        return [end for _, end in self._withdrawn.values()]

    # -- one step ---------------------------------------------------------------------------------
    def schedule(self, ctx: StepContext = StepContext()) -> StepPlan:
        """This step's plan. Responses that end while it is made (cancelled, or their prompt cannot be planned) are
        listed in ``ends`` and withdrawn at once, before anything else is planned, so that what they free (their
        conversation, their KV slots) is seen by the rest of the plan. Other side effects are bookkeeping only: KV
        slots assigned (an idle conversation may lose its cache to a response), caches cropped to what a rendering
        shares with them, the oldest turns dropped under ``drop_oldest``."""
        plan = StepPlan(audio=self.audio_rule())  # no stream waits until the decode is planned (below)
        batch = PrefillBatch(self.cfg.prefills_per_step, self.cfg.prefill_rows)
        decoding: list[ResponseState] = []
        for r in list(self._responses.values()):
            if r.cancel_reason is not None:
                self._end(plan, r, None)
            elif not r.spec.can_accept():
                continue  # backpressure: its consumer is behind
            elif r.status is ResponseStatus.PREFILLING:
                if batch.has_room():
                    try:
                        admitted, reset = self.prefill.prompt(r, batch)
                    except Exception as exc:  # noqa: BLE001 - this response fails; the others go on
                        self._end(plan, r, exc)
                        continue
                    plan.progressed |= admitted
                    if reset is not None:
                        plan.sampler_resets.append(reset)
            else:
                decoding.append(r)
        plan.background = self.prefill.background(batch)
        plan.progressed |= bool(plan.background)
        plan.prefills = batch.jobs
        if self.slots.talker is not None:
            plan.talker_listens = talker_listens(batch.jobs, self._conversations, self.slots, self.talker_reads)
        self._plan_decode(plan, decoding, ctx)
        plan.audio = self.audio_rule(may_wait=self._busy(plan))
        return plan

    def _busy(self, plan: StepPlan) -> bool:
        """Whether the step has GPU work beside token2wav: a prefill chunk, a thinker row, or a talker that has not
        made its last code."""
        talking = any(not self._responses[rid].talker.done for rid in plan.talker_rows)
        return bool(plan.prefills or plan.thinker_rows) or talking

    def _end(self, plan: StepPlan, r: ResponseState, error: Exception | None) -> None:
        prefilling = r.status is ResponseStatus.PREFILLING
        cleanup = policies.Cleanup() if error is None else policies.failure_cleanup(error, prefilling=prefilling)
        self.withdraw(r, cleanup)
        end = PlannedEnd(r.id, error)
        self._withdrawn[r.id] = (r, end)
        plan.ends.append(end)
        plan.progressed = True

    def _plan_decode(self, plan: StepPlan, decoding: list[ResponseState], ctx: StepContext) -> None:
        plan.decoding = [r.id for r in decoding]
        if policies.first_chunks_alone([self._gpu_row(r, ctx.in_worker) for r in decoding]):
            plan.decoding = []  # nothing decodes this step, thinker included
            return
        plan.thinker_rows = [r.id for r in decoding if not r.thinker.done]
        spoken = [r for r in decoding if r.spec.audio]
        if not policies.talker_may_step([self._gpu_row(r, ctx.in_worker) for r in spoken]):
            return
        plan.talker_rows = [r.id for r in spoken]
        streams = [r.audio.stream for r in self._responses.values()]
        open_streams = sum(1 for stream in streams if stream is not None and not stream.done)
        plan.talker_starts = talker_starts(
            spoken,
            thinker_rows=set(plan.thinker_rows),
            budget=self.cfg.talker_prefills_per_step,
            slots=self.slots,
            quick=self._quick_first_chunk,
            open_streams=open_streams,
        )
        if not plan.thinker_rows:
            rows = chain_rows(spoken)
            alone = (
                len(rows) == len(self._responses)
                and not plan.prefills
                and not ctx.job_in_worker
                and not ctx.commands_waiting
            )
            plan.chain_steps = self._chain_steps(rows, alone=alone, can_chain=ctx.can_chain)

    @staticmethod
    def _gpu_row(r: ResponseState, in_worker: frozenset[str]) -> policies.FirstChunkRow:
        first_in_worker = r.audio.stream is not None and r.id in in_worker and r.audio.first_made_at is None
        return policies.FirstChunkRow(talking=not r.talker.done, first_chunk_in_worker=first_in_worker)

    def _chain_steps(self, rows: list[policies.ChainRow], *, alone: bool, can_chain: bool) -> int:
        """How many talker steps to queue at once for the batch ``rows`` (:func:`policies.chain_steps`)."""
        return policies.chain_steps(
            rows,
            limit=self.cfg.chain_steps,
            can_chain=can_chain,
            alone=alone,
            max_codes=self.cfg.max_codes,
            min_codes=self.cfg.min_codes,
        )

    def _quick_first_chunk(self, conv: ConversationState, open_streams: int) -> bool:
        """Whether a reply of ``conv`` starting now, beside ``open_streams`` open streams, gets the quick first
        chunk."""
        return policies.quick_first_chunk(
            enabled=self.cfg.quick_first_chunk,
            held=self.holds_start(conv),
            open_streams=open_streams,
            max_open=self.cfg.quick_first_chunk_max_open,
        )

    def has_background_work(self) -> bool:
        """A conversation whose background prefill can get a thinker slot (one waiting for a slot that others hold is
        not work: a background prefill never evicts, only a command frees a slot)."""
        return any(needs_prefill(c) and self.slots.thinker_slot_open(c) for c in self._conversations.values())

    # -- token2wav --------------------------------------------------------------------------------
    def holds_start(self, conv: ConversationState) -> bool:
        """Whether a reply of ``conv`` whose first chunk is made now holds it for the start buffer."""
        if not self.cfg.start_buffer_ms:
            return False
        busy = sum(
            1 for c in self._conversations.values() if c is not conv and (c.open_audio or c.active_response is not None)
        )
        return holds_start(self.cfg.start_buffer_ms, busy, self.cfg.start_buffer_busy)

    def audio_rule(self, *, may_wait: bool = False) -> AudioRule:
        """How the next token2wav job is picked among the streams whose next chunk is ready: earliest playout deadline
        first, a job of first chunks or of later chunks, under the starving margin
        (:mod:`pipeline.scheduler.token2wav_jobs`). ``may_wait``: the step has other GPU work (a decode or a
        prefill), so a stream more than ``deadline_lead_s`` from its deadline waits; otherwise every ready stream is
        a candidate (waiting would leave the GPU idle)."""
        lead_s = self.cfg.deadline_lead_s if may_wait else None
        return AudioRule(self.cfg.t2w_max_batch, self.starving_margin(), None if lead_s is None else lead_s * 1000.0)

    def starving_margin(self) -> float:
        """The starving margin (ms) of the next job: the configured one, or with ``starving_margin_from_jobs`` at least
        the longest recent first-chunk job plus the longest recent later-chunk job."""
        if not self.cfg.starving_margin_from_jobs:
            return float(self.cfg.starving_margin_ms)
        return self.recent_jobs.starving_margin_ms(self.cfg.starving_margin_ms)

    def record_job(self, first: bool, ms: float) -> None:
        """A token2wav job of first chunks (``first``) or later chunks took ``ms`` from hand-over to emission."""
        self.recent_jobs.record(first, ms)

    # -- endings ------------------------------------------------------------------------------------
    def finished(self, response_ids: list[str], in_worker: set[str]) -> list[ResponseState]:
        """Of ``response_ids``, the live responses whose every stage is done and whose stream the worker does not
        hold (``in_worker``)."""
        live = [self._responses[rid] for rid in response_ids if rid in self._responses]
        return [r for r in live if r.all_done() and r.id not in in_worker]
