"""The scheduler: which conversations prefill what, which responses decode, which token2wav job runs.

It owns the engine's bookkeeping — the live conversations and responses (in start order), the KV slot assignment of
both decoder stages, the step's prefill budget, the recent token2wav jobs — and answers with plain data
(:class:`~pipeline.scheduler.plan.StepPlan`, :class:`~pipeline.scheduler.plan.AudioPlan`). It never touches a model or
a device tensor: the rules it applies are the pure functions of :mod:`pipeline.scheduler.policies`,
:mod:`pipeline.scheduler.token2wav_jobs`, :mod:`pipeline.scheduler.prefill_batch` and
:mod:`pipeline.output.start_buffer`. Engine thread only.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

from pipeline.api import ContextPolicy
from pipeline.core.conversation_state import ConversationState
from pipeline.core.response_state import ResponseState
from pipeline.models.positions import PositionScheme
from pipeline.output.start_buffer import holds_start
from pipeline.response_events import ResponseStatus
from pipeline.scheduler import policies
from pipeline.scheduler.plan import AudioPlan, StepPlan
from pipeline.scheduler.prefill_batch import PrefillBatch, PrefillJob
from pipeline.scheduler.token2wav_jobs import ChunkCandidate, RecentJobs, pick_job
from pipeline.video.budget import VideoBudget
from pipeline.video.message import remove_old_videos

__all__ = ["SchedulerConfig", "Scheduler"]

log = logging.getLogger(__name__)


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
    video_budget: VideoBudget = VideoBudget(None, 1.0)
    """How much camera video the history keeps (:mod:`pipeline.video.budget`; applied before each response)."""


class Scheduler:
    def __init__(self, cfg: SchedulerConfig, *, thinker_slots, talker_slots, positions: PositionScheme) -> None:
        self.cfg = cfg
        self.thinker_slots = thinker_slots
        self.talker_slots = talker_slots
        """The two decoder stages' slot allocators (:class:`pipeline.runners.kv_pool.SlotAllocator`); the talker's is
        None in an engine without a talker (no response of it is spoken)."""
        self.positions = positions
        """The model family's rotary positions: each prefill chunk's rope positions and shift."""
        self.conversations: dict[str, ConversationState] = {}
        self.responses: dict[str, ResponseState] = {}
        """Live responses, in start order."""
        self.recent_jobs = RecentJobs()
        """How long the last token2wav jobs took, hand-over to emission (ms)."""
        self._background_turn = 0
        self.video_removed_tokens = 0
        """Thinker positions of video the video budget removed since start."""

    # -- one step ---------------------------------------------------------------------------------
    def schedule(self, *, in_worker: set[str], end: Callable[[ResponseState, Exception | None], None]) -> StepPlan:
        """This step's plan. ``in_worker``: ids of the responses whose stream the token2wav worker holds now.
        ``end(response, error)`` is called at once for each response that ends while the plan is made (cancelled:
        error None; failed: its error), before anything else is planned, so that what it frees (its conversation,
        its KV slots) is seen by the rest of the plan. Other side effects are bookkeeping only: KV slots assigned
        (an idle conversation may lose its cache to a response), caches cropped to what a rendering shares with
        them, the oldest turns dropped under ``drop_oldest``."""
        plan = StepPlan()
        batch = PrefillBatch(self.cfg.prefills_per_step, self.cfg.prefill_rows)
        for r in list(self.responses.values()):
            if r.cancel_reason is not None:
                end(r, None)
                plan.progressed = True
            elif not r.spec.can_accept():
                continue  # backpressure: its consumer is behind
            elif r.status is ResponseStatus.PREFILLING:
                if batch.has_room():
                    try:
                        plan.progressed |= self._plan_prompt(r, batch, plan)
                    except Exception as exc:  # noqa: BLE001 - this response fails; the others go on
                        end(r, exc)
                        plan.progressed = True
            else:
                plan.decoding.append(r)
        plan.background = self._plan_background(batch)
        plan.progressed |= bool(plan.background)
        plan.prefills = batch.jobs
        self._plan_decode(plan, in_worker)
        return plan

    def _plan_decode(self, plan: StepPlan, in_worker: set[str]) -> None:
        rows = [self._gpu_row(r, in_worker) for r in plan.decoding]
        if policies.first_chunks_alone(rows):
            plan.decoding = []  # nothing decodes this step, thinker included
            return
        plan.thinker_rows = [r for r in plan.decoding if not r.thinker.done]
        spoken = [r for r in plan.decoding if r.spec.audio]
        if policies.talker_may_step([self._gpu_row(r, in_worker) for r in spoken]):
            plan.talker_rows = spoken
        plan.talker_prefills = self.cfg.talker_prefills_per_step

    @staticmethod
    def _gpu_row(r: ResponseState, in_worker: set[str]) -> policies.FirstChunkRow:
        first_in_worker = r.audio.stream is not None and r.id in in_worker and r.audio.first_made_at is None
        return policies.FirstChunkRow(talking=not r.talker.done, first_chunk_in_worker=first_in_worker)

    # -- prefill ------------------------------------------------------------------------------------
    def _plan_prompt(self, r: ResponseState, batch: PrefillBatch, plan: StepPlan) -> bool:
        """Plan the next chunk of the conversation's prefill up to the reply's header; False while the response waits
        for a KV slot or the step's row budget. Raises what fails the response (a bad audio block, the context)."""
        conv = r.conv
        if (error := conv.audio_error()) is not None:
            raise error
        if r.thinker.prompt_len == 0:  # first prefill step of this response
            self.video_removed_tokens += remove_old_videos(conv.items, conv.turn_start(), self.cfg.video_budget)
            policy = conv.policy or ContextPolicy(self.cfg.drop_oldest, self.cfg.context_retention_ratio)
            conv.make_room(
                r.spec.max_text_tokens,
                drop_oldest=policy.drop_oldest,
                retention_ratio=policy.retention_ratio,
                max_history_tokens=policy.max_history_tokens,
            )
        if self.thinker_slot(conv, evict=True) is None:
            return False
        rendering = conv.render()
        if r.thinker.prompt_len == 0:
            r.thinker.cached_tokens = min(conv.common_prefix(rendering.keys), len(rendering.keys) - 1)
            r.thinker.prompt_len = len(rendering.keys)
            r.thinker.input_image_tokens = rendering.image_tokens
            r.thinker.input_audio_tokens = len(rendering.audio) - rendering.image_tokens
            r.thinker.input_text_tokens = r.thinker.prompt_len - len(rendering.audio)
            plan.sampler_resets.append((conv.slot, list(rendering.token_ids)))
        job = self._chunk(conv, rendering, need_logits=True)
        job.owner = r
        return batch.admit(job)

    def _plan_background(self, batch: PrefillBatch) -> int:
        """Idle conversations whose background prefill progressed this step (chunks planned in turn, round robin,
        under what is left of the step's prefill budget)."""
        convs = list(self.conversations.values())
        self._background_turn = (self._background_turn + 1) % max(len(convs), 1)
        planned = 0
        for conv in policies.round_robin(convs, self._background_turn):
            if not batch.has_room():
                break
            planned += self._background_chunk(conv, batch)
        return planned

    def _background_chunk(self, conv: ConversationState, batch: PrefillBatch) -> bool:
        """While a conversation is idle, plan the prefill of what the user has said so far (one chunk per step), if a
        KV slot is free (a background prefill never takes another conversation's slot), up to the context limit (the
        slot's size; beyond it the next response first makes room). A failure drops its cache."""
        if not self.needs_prefill(conv) or self.thinker_slot(conv, evict=False) is None:
            return False
        try:
            if (error := conv.audio_error()) is not None:
                raise error
            rendering = conv.render(with_open_audio=True)
            limit = min(len(rendering.keys), conv.max_context_tokens)
            common = conv.common_prefix(rendering.keys)
            if common >= limit:
                conv.crop(common)  # items were removed: drop what follows
                conv.dirty = False
                return True
            rendering.keys, rendering.token_ids = rendering.keys[:limit], rendering.token_ids[:limit]
            return batch.admit(self._chunk(conv, rendering, need_logits=False))
        except Exception:  # noqa: BLE001 - a background failure must not stop the engine thread
            log.exception("background prefill of %s failed; its cache is dropped", conv.id)
            conv.free()
            conv.dirty = False
            return True

    def _chunk(self, conv: ConversationState, rendering, *, need_logits: bool) -> PrefillJob:
        """The next chunk (at most ``prefill_chunk_tokens``) of ``rendering`` missing from the cache, cropping the
        cache to what the rendering shares with it. With ``need_logits`` the last position is recomputed if it is
        already cached (its logits are wanted)."""
        keys = rendering.keys
        start = conv.common_prefix(keys)
        if need_logits:
            start = min(start, len(keys) - 1)
        conv.crop(start)
        end = min(len(keys), start + self.cfg.prefill_chunk_tokens)
        rope = self.positions.rope_positions(end, rendering.spans, start=start)
        inside = any(span.at < end < span.at + span.length for span in rendering.spans)
        return PrefillJob(
            conv,
            keys[start:end],
            rendering.token_ids[start:end],
            audio_runs(rendering.audio, start, end),
            start,
            last=end == len(keys),
            logits=need_logits and end == len(keys),
            rope=rope,
            rope_shift=None if inside else self.positions.rope_shift(rendering.spans, end),
            deepstack=audio_runs(rendering.deepstack, start, end),
            spans=[span for span in rendering.spans if span.at < end and start < span.at + span.length],
        )

    def needs_prefill(self, conv: ConversationState) -> bool:
        return conv.active_response is None and conv.dirty

    def has_background_work(self) -> bool:
        """A conversation whose background prefill can get a thinker slot (one waiting for a slot that others hold is
        not work: a background prefill never evicts, only a command frees a slot)."""
        slots = self.thinker_slots
        return any(
            self.needs_prefill(c) and (slots.slot_of(c.id) is not None or slots.used < slots.capacity)
            for c in self.conversations.values()
        )

    # -- KV slots ---------------------------------------------------------------------------------
    def release_slots(self, conv: ConversationState) -> None:
        """Forget the conversation's caches and give its KV slots back to the pools."""
        conv.free()
        self.thinker_slots.release(conv.id)
        if self.talker_slots is not None:
            self.talker_slots.release(conv.id)
        conv.slot = conv.talker_slot = None

    def _idle_owner(self, allocator, exclude: ConversationState) -> ConversationState | None:
        """The least recently used conversation holding a slot of ``allocator`` that no response is using."""
        owners = [o for o in allocator.lru_owners() if o in self.conversations]
        busy = {o for o in owners if self.conversations[o].active_response is not None}
        owner = policies.idle_owner(owners, busy, exclude.id)
        return None if owner is None else self.conversations[owner]

    def thinker_slot(self, conv: ConversationState, *, evict: bool) -> int | None:
        """The conversation's thinker slot; a free one, or (``evict``) one taken from the least recently used idle
        conversation, which is prefilled again at its next response. None while every slot is busy."""
        slot = self.thinker_slots.acquire(conv.id)
        if slot is None and evict:
            victim = self._idle_owner(self.thinker_slots, exclude=conv)
            if victim is not None:
                log.info("KV pool full: conversation %s loses its cache to %s", victim.id, conv.id)
                self.release_slots(victim)
                slot = self.thinker_slots.acquire(conv.id)
        if slot is not None and slot != conv.slot:
            conv.free()  # a new slot holds nothing yet
            conv.slot = slot
        return slot

    def talker_slot(self, conv: ConversationState, *, evict: bool = True) -> int | None:
        """The conversation's talker slot; a free one, or (``evict``) one taken from the least recently used
        conversation with no response, which loses only its talker cache. None while every slot is busy."""
        slot = self.talker_slots.acquire(conv.id)
        if slot is None and evict:
            victim = self._idle_owner(self.talker_slots, exclude=conv)
            if victim is not None:
                victim.crop_talker(0)
                self.talker_slots.release(victim.id)
                victim.talker_slot = None
                slot = self.talker_slots.acquire(conv.id)
        if slot is not None and slot != conv.talker_slot:
            conv.crop_talker(0)
            conv.talker_slot = slot
        return slot

    # -- talker -----------------------------------------------------------------------------------
    def chain_steps(
        self,
        rows: list[tuple[ResponseState, bool]],
        *,
        alone: bool,
        can_chain: bool,
        prefills: int,
        job_in_worker: bool,
        commands_waiting: bool,
    ) -> int:
        """How many talker steps to queue at once for ``rows`` — ``(response, its input this step is the text-pad
        vector)`` — by :func:`policies.chain_steps`: only while nothing else waits for the engine."""
        alone = (
            alone and len(rows) == len(self.responses) and not prefills and not job_in_worker and not commands_waiting
        )
        chain_rows = [
            policies.ChainRow(
                next_is_pad=is_pad and r.audio.stream is not None,
                codes_until_ready=r.audio.stream.codes_until_ready() if r.audio.stream else None,
                codes=r.codec_tokens,
            )
            for r, is_pad in rows
        ]
        return policies.chain_steps(
            chain_rows,
            limit=self.cfg.chain_steps,
            can_chain=can_chain,
            alone=alone,
            max_codes=self.cfg.max_codes,
            min_codes=self.cfg.min_codes,
        )

    def quick_first_chunk(self, conv: ConversationState) -> bool:
        """Whether a reply of ``conv`` starting now gets the quick first chunk."""
        open_streams = sum(1 for r in self.responses.values() if r.audio.stream is not None and not r.audio.stream.done)
        return policies.quick_first_chunk(
            enabled=self.cfg.quick_first_chunk,
            held=self.holds_start(conv),
            open_streams=open_streams,
            max_open=self.cfg.quick_first_chunk_max_open,
        )

    # -- token2wav --------------------------------------------------------------------------------
    def holds_start(self, conv: ConversationState) -> bool:
        """Whether a reply of ``conv`` whose first chunk is made now holds it for the start buffer."""
        if not self.cfg.start_buffer_ms:
            return False
        busy = sum(
            1 for c in self.conversations.values() if c is not conv and (c.open_audio or c.active_response is not None)
        )
        return holds_start(self.cfg.start_buffer_ms, busy, self.cfg.start_buffer_busy)

    def audio_job(self, ready: list[ResponseState], now: float) -> AudioPlan | None:
        """The next token2wav job among the responses whose next chunk is ready (first chunks alone, then the streams
        with the least audio ahead); a reply whose first audio is held counts 0 ms ahead: someone waits for it."""
        candidates = [
            ChunkCandidate(
                i,
                first=r.audio.first_made_at is None,
                audio_ahead_ms=r.audio.playout.ahead_ms(now) if r.audio.playout.started else 0.0,
            )
            for i, r in enumerate(ready)
        ]
        job = pick_job(candidates, self.cfg.t2w_max_batch, starving_margin_ms=self.starving_margin())
        return AudioPlan([ready[i] for i in job.keys], job.urgent) if job else None

    def starving_margin(self) -> float:
        """The starving margin (ms) of the next job: the configured one, or with ``starving_margin_from_jobs`` at least
        the longest recent first-chunk job plus the longest recent later-chunk job."""
        if not self.cfg.starving_margin_from_jobs:
            return float(self.cfg.starving_margin_ms)
        return self.recent_jobs.starving_margin_ms(self.cfg.starving_margin_ms)

    # -- endings ------------------------------------------------------------------------------------
    def finished(self, rows: list[ResponseState], busy: Callable[[ResponseState], bool]) -> list[ResponseState]:
        """Of ``rows``, the live responses whose every stage is done and whose stream the worker does not hold."""
        return [r for r in rows if r.id in self.responses and r.all_done() and not busy(r)]


def audio_runs(audio: dict[int, tuple[object, int]], start: int, end: int) -> list[tuple[int, object, range]]:
    """The audio positions of ``[start, end)`` as runs ``(offset from start, encoder output, rows)`` of consecutive
    positions holding consecutive rows of the same block (one copy per run, not per position). Any map of positions
    to ``(a block's output, row)`` (the picture positions' deepstack features too)."""
    runs: list[tuple[int, object, range]] = []
    for pos in range(start, end):
        if pos not in audio:
            continue
        tensor, row = audio[pos]
        if runs:
            first, last_tensor, rows = runs[-1]
            if last_tensor is tensor and start + first + len(rows) == pos and rows.stop == row:
                runs[-1] = (first, tensor, range(rows.start, row + 1))
                continue
        runs.append((pos - start, tensor, range(row, row + 1)))
    return runs
