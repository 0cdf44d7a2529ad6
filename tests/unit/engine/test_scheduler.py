"""The scheduler's rules as pure functions over plans: no model, no tensors, no device.

Conversations here render text through a fake renderer (one id per word); responses are real ``ResponseState``s whose
stages the tests move by hand, as the runners would.
"""

from __future__ import annotations

import time
from dataclasses import replace
from types import SimpleNamespace

import pytest

from pipeline.core.conversation_state import ConversationState, ConvItem, ItemKind
from pipeline.core.response_state import ResponseSpec, ResponseState, TalkerStatus, TextEnd
from pipeline.models.common.tmrope import TMROPE
from pipeline.output.detokenizer import IncrementalDetokenizer
from pipeline.output.playout import Playout
from pipeline.response_events import ResponseStatus
from pipeline.runners.kv_pool import SlotAllocator
from pipeline.scheduler import policies
from pipeline.scheduler.plan import PlannedEnd, StepPlan, TalkerStart
from pipeline.scheduler.policies import ChainRow, FirstChunkRow
from pipeline.scheduler.scheduler import Scheduler, SchedulerConfig, StepContext
from pipeline.step.phases import chunk_candidates


def scheduler_config(**overrides) -> SchedulerConfig:
    values = dict(
        prefills_per_step=4,
        prefill_rows=None,
        prefill_chunk_tokens=512,
        drop_oldest=False,
        context_retention_ratio=0.8,
        talker_prefills_per_step=1,
        chain_steps=8,
        min_text_tokens=0,
        min_codes=0,
        max_codes=4096,
        t2w_max_batch=8,
        starving_margin_ms=250,
        starving_margin_from_jobs=False,
        start_buffer_ms=None,
        start_buffer_busy=8,
        quick_first_chunk=True,
        quick_first_chunk_max_open=0,
    )
    return SchedulerConfig(**(values | overrides))


class Renderer:
    """One id per word; a message is header (2 ids), its words, footer (1 id)."""

    special = SimpleNamespace(audio_start=900, audio_token=901, audio_end=902)

    def header(self, role: str) -> list[int]:
        return [1, {"system": 10, "user": 11, "assistant": 12}[role]]

    def footer(self) -> list[int]:
        return [2]

    def text_message(self, role: str, text: str) -> list[int]:
        return self.header(role) + [100 + len(word) for word in text.split()] + self.footer()

    def decode(self, ids: list[int]) -> str:
        return " ".join(map(str, ids))


def make_scheduler(slots: int = 4, talker_slots: int = 4, **overrides) -> Scheduler:
    return Scheduler(
        scheduler_config(**overrides),
        thinker_slots=SlotAllocator(slots),
        talker_slots=SlotAllocator(talker_slots),
        positions=TMROPE,
    )


def conversation(s: Scheduler, conv_id: str, words: int = 3) -> ConversationState:
    conv = ConversationState(conv_id, Renderer(), instructions="be brief", max_context_tokens=10_000)
    conv.add(ConvItem(id=f"{conv_id}-u", role="user", kind=ItemKind.TEXT, text=" ".join(["word"] * words)))
    s.open_conversation(conv)
    return conv


def respond(s: Scheduler, conv: ConversationState, *, audio: bool = True, accepts: bool = True) -> ResponseState:
    rid = f"r-{conv.id}"
    spec = ResponseSpec(
        id=rid,
        conv_id=conv.id,
        item_id=f"{conv.id}-a",
        audio=audio,
        voice="v",
        max_text_tokens=16,
        sink=lambda event: None,
        can_accept=lambda: accepts,
    )
    item = ConvItem(id=spec.item_id, role="assistant", kind=ItemKind.REPLY, open=True)
    conv.add(item)
    conv.active_response = rid
    r = ResponseState(spec=spec, conv=conv, item=item, detok=IncrementalDetokenizer(Renderer().decode))
    s.add_response(r)
    return r


def run_chunks(s: Scheduler, plan) -> None:
    """What the thinker runner does with a plan's chunks, as far as the scheduler can see: the caches grow."""
    for job in plan.prefills:
        conv = s.conversations[job.conv_id]
        conv.cached_keys.extend(job.keys)
        if job.response_id is None:
            conv.dirty = not job.last
        elif job.last:
            s.responses[job.response_id].advance(ResponseStatus.DECODING)


def schedule(s: Scheduler, in_worker=(), **context) -> StepPlan:
    """A plan in which nothing should end."""
    plan = s.schedule(StepContext(in_worker=frozenset(in_worker), **context))
    assert plan.ends == [], f"nothing should end, {plan.ends} did"
    return plan


def decoding(r: ResponseState) -> ResponseState:
    r.advance(ResponseStatus.DECODING)
    return r


# -- the plan -----------------------------------------------------------------------------------------
def test_a_response_prefills_its_prompt_then_decodes():
    s = make_scheduler()
    r = respond(s, conversation(s, "a"))
    plan = schedule(s)
    (job,) = plan.prefills
    assert job.response_id == r.id and job.start == 0 and job.last and job.logits, "the whole prompt, its last logits"
    assert r.thinker.prompt_len == len(job.keys) == 5 + 6 + 2, "system (5) + user (6) + the reply's header (2)"
    assert r.thinker.input_text_tokens == r.thinker.prompt_len and r.thinker.cached_tokens == 0
    assert plan.sampler_resets == [(r.conv.slot, job.token_ids)], "repetition state starts from the prompt, once"
    assert plan.thinker_rows == [] and plan.progressed
    run_chunks(s, plan)
    plan = schedule(s)
    assert plan.prefills == [] and plan.sampler_resets == []
    assert plan.decoding == plan.thinker_rows == plan.talker_rows == [r.id]
    assert plan.talker_starts == [TalkerStart(r.id, r.conv.id, r.conv.talker_slot, quick=True)], "its vector comes"


def test_a_long_prompt_is_prefilled_in_chunks_one_per_step():
    s = make_scheduler(prefill_chunk_tokens=5)
    r = respond(s, conversation(s, "a", words=10))  # 5 + 12 + 2 = 19 positions
    starts = []
    while r.status is ResponseStatus.PREFILLING:
        plan = schedule(s)
        assert len(plan.prefills) == 1
        starts.append(plan.prefills[0].start)
        run_chunks(s, plan)
    assert starts == [0, 5, 10, 15] and plan.prefills[0].logits and plan.prefills[0].last


def test_the_prefill_budget_defers_what_does_not_fit_to_the_next_step():
    s = make_scheduler(prefills_per_step=1)
    a, b = respond(s, conversation(s, "a")), respond(s, conversation(s, "b"))
    plan = schedule(s)
    assert [job.response_id for job in plan.prefills] == [a.id], "responses in start order; one chunk per step"
    run_chunks(s, plan)
    plan = schedule(s)
    assert [job.response_id for job in plan.prefills] == [b.id] and plan.decoding == [a.id]


def test_the_row_budget_admits_what_one_graph_holds():
    s = make_scheduler(prefill_rows=20)
    a = respond(s, conversation(s, "a"))
    respond(s, conversation(s, "b"))  # 13 positions each: together past the 20-row graph
    plan = schedule(s)
    assert [job.response_id for job in plan.prefills] == [a.id]


def test_a_paused_response_is_not_stepped():
    s = make_scheduler()
    r = decoding(respond(s, conversation(s, "a"), accepts=False))
    plan = schedule(s)
    assert plan.decoding == plan.thinker_rows == [] and r.id in s.responses


def test_a_cancelled_response_ends_before_the_rest_is_planned_and_frees_its_slot():
    s = make_scheduler(slots=1)
    a = respond(s, conversation(s, "a"))
    run_chunks(s, schedule(s))  # a holds the only thinker slot
    b = respond(s, conversation(s, "b"))
    a.cancel_reason = "client_cancelled"
    plan = s.schedule(StepContext())
    assert plan.ends == [PlannedEnd("r-a", None)] and s.withdrawn("r-a") is a and a.id not in s.responses
    assert a.conv.active_response is None and not a.item.open, "the scheduler gave its conversation back"
    assert [job.response_id for job in plan.prefills] == [b.id], "b takes the slot a's conversation no longer uses"
    assert b.conv.slot == 0 and a.conv.slot is None and a.conv.cached_keys == []


def test_a_prompt_that_cannot_be_planned_fails_that_response_only():
    s = make_scheduler()
    bad, good = respond(s, conversation(s, "bad")), respond(s, conversation(s, "good"))
    bad.conv.max_context_tokens = 10  # the prompt and its reply budget do not fit
    plan = s.schedule(StepContext())
    assert [(end.response_id, type(end.error).__name__) for end in plan.ends] == [("r-bad", "ContextLimitError")]
    assert s.withdrawn("r-bad") is bad and bad.item not in bad.conv.items, "refused before anything was generated"
    # its conversation, given back at once, is idle again: its history is prefilled in the background, as after any end
    assert [(job.response_id, job.conv_id) for job in plan.prefills] == [(good.id, "good"), (None, "bad")]


def test_a_response_waits_while_every_slot_is_busy_and_never_evicts_a_live_response():
    s = make_scheduler(slots=1)
    a = respond(s, conversation(s, "a"))
    run_chunks(s, schedule(s))
    b = respond(s, conversation(s, "b"))
    plan = schedule(s)
    assert plan.prefills == [] and b.conv.slot is None and a.conv.slot == 0


def test_an_idle_conversation_loses_its_slot_to_a_response_least_recently_used_first():
    s = make_scheduler(slots=2)
    old, recent = conversation(s, "old"), conversation(s, "recent")
    run_chunks(s, schedule(s))  # both prefilled in the background
    assert old.cached_keys and recent.cached_keys and not old.dirty
    s.slots.thinker_slot(recent, evict=False)  # recent is used again: old is now the least recently used
    r = respond(s, conversation(s, "new"))
    plan = schedule(s)
    assert [job.response_id for job in plan.prefills] == [r.id]
    assert old.slot is None and old.cached_keys == [] and recent.slot is not None


def test_background_prefill_plans_idle_conversations_in_turn_under_the_budget_and_never_evicts():
    s = make_scheduler(slots=2, prefills_per_step=1)
    convs = [conversation(s, name) for name in "abc"]
    planned = []
    for _ in range(4):
        plan = schedule(s)
        assert all(job.response_id is None and not job.logits for job in plan.prefills)
        planned += [job.conv_id for job in plan.prefills]
        run_chunks(s, plan)
    assert len(planned) == len(set(planned)) == 2, "one chunk per step, in turn; two slots for three conversations"
    (waiting,) = [c for c in convs if c.id not in planned]
    assert waiting.dirty and waiting.slot is None and not s.has_background_work(), "it waits; nobody is evicted"


def test_background_prefill_stops_at_the_context_limit_and_the_response_drops_the_oldest_turn():
    s = make_scheduler(drop_oldest=True)
    conv = conversation(s, "a", words=30)  # instructions 5 positions, the user message 33
    conv.add(ConvItem(id="a-old-reply", role="assistant", kind=ItemKind.REPLY, reply_ids=[100] * 7))  # 10
    conv.add(ConvItem(id="a-now", role="user", kind=ItemKind.TEXT, text="other " * 7))  # 10: 58 in all
    conv.max_context_tokens = 50
    plan = schedule(s)
    assert [(job.start, job.rows, job.last) for job in plan.prefills] == [(0, 50, True)], "never past the slot's end"
    run_chunks(s, plan)
    assert not conv.dirty and not s.has_background_work() and schedule(s).prefills == []
    r = respond(s, conv)  # its reply needs 16 positions beside a 2-position header: the first turn goes
    plan = schedule(s)
    assert [item.id for item in conv.items] == ["a-now", "a-a"] and conv.dropped == {"a-u", "a-old-reply"}
    # the instructions stay cached, and the user header both renderings start with
    assert [(job.response_id, job.start) for job in plan.prefills] == [(r.id, 7)]


def test_first_chunks_alone_nothing_decodes():
    s = make_scheduler()
    a, b = (decoding(respond(s, conversation(s, name))) for name in "ab")
    for r in (a, b):
        r.audio.stream = SimpleNamespace(done=False)
    plan = schedule(s, {"r-a", "r-b"})
    assert plan.decoding == plan.thinker_rows == plan.talker_rows == [], "both first chunks are being made"
    plan = schedule(s, {"r-a"})
    assert plan.thinker_rows == plan.talker_rows == [a.id, b.id], "b is not in the worker: everyone steps"


def test_the_talker_waits_beside_replies_that_only_write_text():
    s = make_scheduler()
    spoken = decoding(respond(s, conversation(s, "a")))
    spoken.audio.stream = SimpleNamespace(done=False)
    text = decoding(respond(s, conversation(s, "b"), audio=False))
    plan = schedule(s, {"r-a"})
    assert plan.thinker_rows == [spoken.id, text.id] and plan.talker_rows == []
    spoken.audio.first_made_at = 1.0  # its first chunk is out: the one in the worker is a later one
    plan = schedule(s, {"r-a"})
    assert plan.talker_rows == [spoken.id]


# -- rules ------------------------------------------------------------------------------------------
def test_first_chunks_alone_and_talker_gating_rules():
    waiting, other = FirstChunkRow(talking=True, first_chunk_in_worker=True), FirstChunkRow(True, False)
    assert policies.first_chunks_alone([waiting, waiting]) and not policies.first_chunks_alone([])
    assert not policies.first_chunks_alone([waiting, other])
    done_talking = FirstChunkRow(talking=False, first_chunk_in_worker=False)
    assert not policies.talker_may_step([waiting, done_talking]), "the only row still talking waits for its chunk"
    assert policies.talker_may_step([waiting, other]) and policies.talker_may_step([done_talking])


def test_chains_of_talker_steps_end_at_the_next_chunk_min_and_max():
    pad = ChainRow(next_is_pad=True, codes_until_ready=5, codes=10)
    args = dict(limit=8, can_chain=True, alone=True, max_codes=100, min_codes=0)
    assert policies.chain_steps([pad], **args) == 5, "ends where the next chunk becomes ready"
    assert policies.chain_steps([replace(pad, codes_until_ready=None)], **args) == 8
    assert policies.chain_steps([pad], **args | {"max_codes": 12}) == 2
    assert policies.chain_steps([pad], **args | {"min_codes": 13}) == 3, "the stop suppression is one per chain"
    assert policies.chain_steps([pad, replace(pad, next_is_pad=False)], **args) == 1, "a row still on its text"
    assert policies.chain_steps([pad], **args | {"alone": False}) == 1
    assert policies.chain_steps([pad], **args | {"can_chain": False}) == 1
    assert policies.chain_steps([pad], **args | {"limit": 1}) == 1
    assert policies.chain_steps([replace(pad, codes_until_ready=0)], **args) == 1


def test_the_scheduler_chains_only_when_nothing_else_waits():
    s = make_scheduler()
    r = decoding(respond(s, conversation(s, "a")))
    r.thinker.end = TextEnd.STOP  # its text is over: no thinker row
    r.talker.status, r.talker.eos_sent = TalkerStatus.RUNNING, True  # its next input is text-pad
    r.audio.stream = SimpleNamespace(codes_until_ready=lambda: 4, done=False)
    assert schedule(s, can_chain=True).chain_steps == 4
    for busy in ({"job_in_worker": True}, {"commands_waiting": True}, {"can_chain": False}):
        assert schedule(s, **{"can_chain": True} | busy).chain_steps == 1, busy
    text = decoding(respond(s, conversation(s, "t"), audio=False))
    plan = schedule(s, can_chain=True)
    assert plan.thinker_rows == [text.id] and plan.chain_steps == 1, "a thinker row"
    text.thinker.end = TextEnd.STOP
    paused = respond(s, conversation(s, "b"), accepts=False)
    assert schedule(s, can_chain=True).chain_steps == 1, "a live response outside the batch"
    assert paused.id in s.responses
    for other in (paused, text):
        s.withdraw(other, policies.Cleanup())
        s.close_conversation(other.conv.id)
    assert schedule(s, can_chain=True).chain_steps == 4
    conversation(s, "idle")  # its background prefill is planned
    plan = schedule(s, can_chain=True)
    assert plan.prefills and plan.chain_steps == 1, "a prefill"


def test_quick_first_chunk_rule():
    assert policies.quick_first_chunk(enabled=True, held=False, open_streams=0, max_open=0)
    assert not policies.quick_first_chunk(enabled=True, held=False, open_streams=1, max_open=0)
    assert not policies.quick_first_chunk(enabled=True, held=True, open_streams=0, max_open=0)
    assert not policies.quick_first_chunk(enabled=False, held=False, open_streams=0, max_open=0)


def test_round_robin_and_idle_owner():
    assert policies.round_robin([1, 2, 3], 1) == [2, 3, 1] and policies.round_robin([1, 2, 3], 4) == [2, 3, 1]
    assert policies.round_robin([], 3) == []
    assert policies.idle_owner(["a", "b", "c"], busy={"a"}, exclude="b") == "c"
    assert policies.idle_owner(["a"], busy={"a"}, exclude="x") is None


def test_the_start_buffer_holds_only_under_load():
    s = make_scheduler(start_buffer_ms=960, start_buffer_busy=2)
    me, a, b = (conversation(s, name) for name in "xab")
    respond(s, a)
    assert not s.holds_start(me), "one other conversation busy"
    b.open_audio["b-u2"] = object()  # b's user is speaking
    assert s.holds_start(me)
    assert not make_scheduler(start_buffer_ms=None, start_buffer_busy=0).holds_start(me)


def test_the_scheduler_picks_token2wav_jobs_by_audio_ahead_of_a_real_time_player():
    """Stand-in responses: one waiting for its first audio, one that sent 2 s of audio 1 s ago (1 s ahead), one that
    sent 0.5 s of audio 1 s ago (starving: -0.5 s)."""
    now = time.perf_counter()

    def sent(seconds: float) -> SimpleNamespace:
        playout = Playout()
        playout.deliver(now - 1.0, seconds)
        return SimpleNamespace(audio=SimpleNamespace(first_made_at=now - 1.0, playout=playout))

    new = SimpleNamespace(audio=SimpleNamespace(first_made_at=None, playout=Playout()))
    ahead, starving = sent(2.0), sent(0.5)
    cfg = scheduler_config(starving_margin_ms=0)
    s = Scheduler(cfg, thinker_slots=None, talker_slots=None, positions=TMROPE)

    def pick(ready):
        job = s.audio_rule().pick(chunk_candidates(ready, now))
        return ([], None) if job is None else ([ready[i] for i in job.keys], job.urgent)

    assert pick([new, ahead]) == ([new], True)
    assert pick([ahead, new, starving]) == ([starving, ahead], False)
    assert pick([]) == ([], None)
    s.cfg = replace(cfg, starving_margin_ms=1500)  # the stream 1 s ahead is now within the margin
    assert pick([new, ahead]) == ([ahead], False)
    # a margin that follows the jobs: 250 stays the floor until the recent jobs add up to more
    s.cfg = replace(cfg, starving_margin_ms=250, starving_margin_from_jobs=True)
    assert pick([new, ahead]) == ([new], True)
    s.recent_jobs.record(first=True, ms=600.0)
    s.recent_jobs.record(first=False, ms=500.0)
    assert s.starving_margin() == 1100
    assert pick([new, ahead]) == ([ahead], False)


def test_a_response_finishes_when_every_stage_is_done_and_the_worker_holds_none_of_it():
    s = make_scheduler()
    text = decoding(respond(s, conversation(s, "a"), audio=False))
    spoken = decoding(respond(s, conversation(s, "b")))
    text.thinker.end = spoken.thinker.end = TextEnd.STOP
    assert s.finished([text.id, spoken.id], in_worker=set()) == [text], "the spoken reply's talker still runs"
    spoken.talker.status = TalkerStatus.DONE
    spoken.audio.stream = SimpleNamespace(done=True)
    assert s.finished([spoken.id], in_worker={spoken.id}) == [], "its last chunk is in the worker"
    assert s.finished([spoken.id], in_worker=set()) == [spoken]


# -- the status ---------------------------------------------------------------------------------------
def test_the_response_status_is_ordered_and_only_moves_forward():
    order = list(ResponseStatus)
    assert order[:3] == [ResponseStatus.PREFILLING, ResponseStatus.DECODING, ResponseStatus.SYNTHESIZING]
    assert all(a < b for a, b in zip(order, order[1:]))
    assert [s for s in order if s.is_finished()] == [
        ResponseStatus.COMPLETED,
        ResponseStatus.INCOMPLETE,
        ResponseStatus.CANCELLED,
        ResponseStatus.FAILED,
    ]
    s = make_scheduler()
    r = respond(s, conversation(s, "a"))
    r.advance(ResponseStatus.SYNTHESIZING)
    with pytest.raises(RuntimeError, match="back"):
        r.advance(ResponseStatus.DECODING)
