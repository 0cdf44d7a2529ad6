"""Planning the thinker prefill chunks of one step: responses' prompts, then idle conversations still being spoken.

:class:`PrefillPlanner` renders a conversation, crops its cache to what the rendering shares with it and plans the
next chunk (at most ``prefill_chunk_tokens`` positions) as a :class:`~pipeline.scheduler.prefill_batch.PrefillJob`.
Before a response's first chunk it applies the video budget and the context policy (the oldest turns dropped, or a
:class:`~pipeline.errors.ContextLimitError`). Background chunks go round robin under what is left of the step's
budget and never take another conversation's slot. A chunk that would reach a picture whose encode is not ready waits
(:meth:`PrefillPlanner.chunk`). Bookkeeping only (no tensor is made or read). Engine thread only.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from pipeline.api import ContextPolicy
from pipeline.core.conversation_state import ConversationState
from pipeline.core.response_state import ResponseState
from pipeline.models.positions import PositionScheme
from pipeline.scheduler import policies
from pipeline.scheduler.kv_slots import KVSlots
from pipeline.scheduler.prefill_batch import PrefillBatch, PrefillJob
from pipeline.video.message import remove_old_videos

__all__ = ["PrefillPlanner", "audio_runs"]

log = logging.getLogger("pipeline.scheduler.scheduler")


class PrefillPlanner:
    def __init__(self, cfg, *, slots: KVSlots, positions: PositionScheme, conversations: Mapping) -> None:
        """``cfg``: the scheduler's :class:`~pipeline.scheduler.scheduler.SchedulerConfig`; ``conversations``: the
        live conversations by id (read only)."""
        self.cfg = cfg
        self.slots = slots
        self.positions = positions
        """The model family's rotary positions: each prefill chunk's rope positions and shift."""
        self._conversations = conversations
        self._background_turn = 0
        self.video_removed_tokens = 0
        """Thinker positions of video the video budget removed since start."""

    def prompt(self, r: ResponseState, batch: PrefillBatch) -> tuple[bool, tuple[int, list[int]] | None]:
        """Plan the next chunk of the conversation's prefill up to the reply's header. Returns (admitted: False while
        the response waits for a KV slot or the step's row budget, the sampler reset of a prompt rendered for the
        first time). Raises what fails the response (a bad audio block, the context)."""
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
        slot = self.slots.thinker_slot(conv, evict=True)
        if slot is None:
            return False, None
        rendering = conv.render()
        reset = None
        if r.thinker.prompt_len == 0:
            r.thinker.cached_tokens = min(conv.common_prefix(rendering.keys), len(rendering.keys) - 1)
            r.thinker.prompt_len = len(rendering.keys)
            r.thinker.input_image_tokens = rendering.image_tokens
            r.thinker.input_audio_tokens = len(rendering.audio) - rendering.image_tokens
            r.thinker.input_text_tokens = r.thinker.prompt_len - len(rendering.audio)
            reset = (slot, list(rendering.token_ids))
        job = self.chunk(conv, slot, rendering, need_logits=True)
        if job is None:
            return False, reset  # its next chunk reaches a picture not encoded yet: it waits a step
        job.response_id = r.id
        return batch.admit(job), reset

    def background(self, batch: PrefillBatch) -> int:
        """Idle conversations whose background prefill progressed this step (chunks planned in turn, round robin,
        under what is left of the step's prefill budget)."""
        convs = list(self._conversations.values())
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
        slot = self.slots.thinker_slot(conv, evict=False) if needs_prefill(conv) else None
        if slot is None:
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
            job = self.chunk(conv, slot, rendering, need_logits=False)
            return job is not None and batch.admit(job)
        except Exception:  # noqa: BLE001 - a background failure must not stop the engine thread
            log.exception("background prefill of %s failed; its cache is dropped", conv.id)
            conv.free()
            conv.dirty = False
            return True

    def chunk(self, conv: ConversationState, slot: int, rendering, *, need_logits: bool) -> PrefillJob | None:
        """The next chunk (at most ``prefill_chunk_tokens``) of ``rendering`` into ``slot`` (the conversation's thinker
        slot) missing from the cache, cropping the cache to what the rendering shares with it. With ``need_logits``
        the last position is recomputed if it is already cached (its logits are wanted).

        The rule for pictures being encoded: a chunk that would reach a picture or camera frame pair whose block is
        not ready (:attr:`~pipeline.core.conversation_state.Rendering.ready_until`, the blocks' host-side state at the
        start of the step) is not planned: None, and the conversation waits a step. So no prefill reads an encode still
        running, and chunk boundaries (hence the reply) do not depend on when an encode finishes."""
        keys = rendering.keys
        start = conv.common_prefix(keys)
        if need_logits:
            start = min(start, len(keys) - 1)
        conv.crop(start)
        end = min(len(keys), start + self.cfg.prefill_chunk_tokens)
        if rendering.ready_until is not None and rendering.ready_until < end:
            return None
        rope = self.positions.rope_positions(end, rendering.spans, start=start)
        inside = any(span.at < end < span.at + span.length for span in rendering.spans)
        return PrefillJob(
            conv.id,
            slot,
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


def needs_prefill(conv: ConversationState) -> bool:
    """An idle conversation whose rendering may extend beyond its cache (a background prefill has work)."""
    return conv.active_response is None and conv.dirty


def audio_runs(audio: Mapping[int, tuple[Any, int]], start: int, end: int) -> list[tuple[int, Any, range]]:
    """The audio positions of ``[start, end)`` as runs ``(offset from start, encoder output, rows)`` of consecutive
    positions holding consecutive rows of the same block (one copy per run, not per position). Any map of positions
    to ``(a block's output, row)`` (the picture positions' deepstack features too)."""
    runs: list[tuple[int, Any, range]] = []
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
