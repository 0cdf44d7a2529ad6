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
from pipeline.scheduler.policies import ChainRow, FirstChunkRow
from pipeline.scheduler.scheduler import Scheduler, SchedulerConfig


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
    s.conversations[conv_id] = conv
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
    s.responses[rid] = r
    return r


def run_chunks(plan) -> None:
    """What the thinker runner does with a plan's chunks, as far as the scheduler can see: the caches grow."""
    for job in plan.prefills:
        job.conv.cached_keys.extend(job.keys)
        if job.owner is None:
            job.conv.dirty = not job.last
        elif job.last:
            job.owner.advance(ResponseStatus.DECODING)


def no_end(r, error):
    raise AssertionError(f"nothing should end, {r.id} did ({error})")


def decoding(r: ResponseState) -> ResponseState:
    r.advance(ResponseStatus.DECODING)
    return r


# -- the plan -----------------------------------------------------------------------------------------
def test_a_response_prefills_its_prompt_then_decodes():
    s = make_scheduler()
    r = respond(s, conversation(s, "a"))
    plan = s.schedule(in_worker=set(), end=no_end)
    (job,) = plan.prefills
    assert job.owner is r and job.start == 0 and job.last and job.logits, "the whole prompt, with its last logits"
    assert r.thinker.prompt_len == len(job.keys) == 5 + 6 + 2, "system (5) + user (6) + the reply's header (2)"
    assert r.thinker.input_text_tokens == r.thinker.prompt_len and r.thinker.cached_tokens == 0
    assert plan.sampler_resets == [(r.conv.slot, job.token_ids)], "repetition state starts from the prompt, once"
    assert plan.thinker_rows == [] and plan.progressed
    run_chunks(plan)
    plan = s.schedule(in_worker=set(), end=no_end)
    assert plan.prefills == [] and plan.sampler_resets == []
    assert plan.decoding == plan.thinker_rows == plan.talker_rows == [r]
    assert plan.talker_prefills == 1


def test_a_long_prompt_is_prefilled_in_chunks_one_per_step():
    s = make_scheduler(prefill_chunk_tokens=5)
    r = respond(s, conversation(s, "a", words=10))  # 5 + 12 + 2 = 19 positions
    starts = []
    while r.status is ResponseStatus.PREFILLING:
        plan = s.schedule(in_worker=set(), end=no_end)
        assert len(plan.prefills) == 1
        starts.append(plan.prefills[0].start)
        run_chunks(plan)
    assert starts == [0, 5, 10, 15] and plan.prefills[0].logits and plan.prefills[0].last


def test_the_prefill_budget_defers_what_does_not_fit_to_the_next_step():
    s = make_scheduler(prefills_per_step=1)
    a, b = respond(s, conversation(s, "a")), respond(s, conversation(s, "b"))
    plan = s.schedule(in_worker=set(), end=no_end)
    assert [job.owner for job in plan.prefills] == [a], "responses in start order; one chunk per step"
    run_chunks(plan)
    plan = s.schedule(in_worker=set(), end=no_end)
    assert [job.owner for job in plan.prefills] == [b] and plan.decoding == [a]


def test_the_row_budget_admits_what_one_graph_holds():
    s = make_scheduler(prefill_rows=20)
    a = respond(s, conversation(s, "a"))
    respond(s, conversation(s, "b"))  # 13 positions each: together past the 20-row graph
    plan = s.schedule(in_worker=set(), end=no_end)
    assert [job.owner for job in plan.prefills] == [a]


def test_a_paused_response_is_not_stepped():
    s = make_scheduler()
    r = decoding(respond(s, conversation(s, "a"), accepts=False))
    plan = s.schedule(in_worker=set(), end=no_end)
    assert plan.decoding == plan.thinker_rows == [] and r.id in s.responses


def test_a_cancelled_response_ends_before_the_rest_is_planned_and_frees_its_slot():
    s = make_scheduler(slots=1)
    a = respond(s, conversation(s, "a"))
    run_chunks(s.schedule(in_worker=set(), end=no_end))  # a holds the only thinker slot
    b = respond(s, conversation(s, "b"))
    a.cancel_reason = "client_cancelled"
    ended = []

    def end(r, error):
        ended.append((r.id, error))
        s.responses.pop(r.id)
        r.conv.active_response = None  # what the engine does when a response ends

    plan = s.schedule(in_worker=set(), end=end)
    assert ended == [("r-a", None)]
    assert [job.owner for job in plan.prefills] == [b], "b takes the slot a's conversation no longer uses"
    assert b.conv.slot == 0 and a.conv.slot is None and a.conv.cached_keys == []


def test_a_prompt_that_cannot_be_planned_fails_that_response_only():
    s = make_scheduler()
    bad, good = respond(s, conversation(s, "bad")), respond(s, conversation(s, "good"))
    bad.conv.max_context_tokens = 10  # the prompt and its reply budget do not fit
    ended = []
    plan = s.schedule(in_worker=set(), end=lambda r, error: ended.append((r.id, type(error).__name__)))
    assert ended == [("r-bad", "ContextLimitError")]
    assert [job.owner for job in plan.prefills] == [good]


def test_a_response_waits_while_every_slot_is_busy_and_never_evicts_a_live_response():
    s = make_scheduler(slots=1)
    a = respond(s, conversation(s, "a"))
    run_chunks(s.schedule(in_worker=set(), end=no_end))
    b = respond(s, conversation(s, "b"))
    plan = s.schedule(in_worker=set(), end=no_end)
    assert plan.prefills == [] and b.conv.slot is None and a.conv.slot == 0


def test_an_idle_conversation_loses_its_slot_to_a_response_least_recently_used_first():
    s = make_scheduler(slots=2)
    old, recent = conversation(s, "old"), conversation(s, "recent")
    run_chunks(s.schedule(in_worker=set(), end=no_end))  # both prefilled in the background
    assert old.cached_keys and recent.cached_keys and not old.dirty
    s.thinker_slot(recent, evict=False)  # recent is used again: old is now the least recently used
    r = respond(s, conversation(s, "new"))
    plan = s.schedule(in_worker=set(), end=no_end)
    assert [job.owner for job in plan.prefills] == [r]
    assert old.slot is None and old.cached_keys == [] and recent.slot is not None


def test_background_prefill_plans_idle_conversations_in_turn_under_the_budget_and_never_evicts():
    s = make_scheduler(slots=2, prefills_per_step=1)
    convs = [conversation(s, name) for name in "abc"]
    planned = []
    for _ in range(4):
        plan = s.schedule(in_worker=set(), end=no_end)
        assert all(job.owner is None and not job.logits for job in plan.prefills)
        planned += [job.conv.id for job in plan.prefills]
        run_chunks(plan)
    assert len(planned) == len(set(planned)) == 2, "one chunk per step, in turn; two slots for three conversations"
    (waiting,) = [c for c in convs if c.id not in planned]
    assert waiting.dirty and waiting.slot is None and not s.has_background_work(), "it waits; nobody is evicted"


def test_background_prefill_stops_at_the_context_limit_and_the_response_drops_the_oldest_turn():
    s = make_scheduler(drop_oldest=True)
    conv = conversation(s, "a", words=30)  # instructions 5 positions, the user message 33
    conv.add(ConvItem(id="a-old-reply", role="assistant", kind=ItemKind.REPLY, reply_ids=[100] * 7))  # 10
    conv.add(ConvItem(id="a-now", role="user", kind=ItemKind.TEXT, text="other " * 7))  # 10: 58 in all
    conv.max_context_tokens = 50
    plan = s.schedule(in_worker=set(), end=no_end)
    assert [(job.start, job.rows, job.last) for job in plan.prefills] == [(0, 50, True)], "never past the slot's end"
    run_chunks(plan)
    assert not conv.dirty and not s.has_background_work() and s.schedule(in_worker=set(), end=no_end).prefills == []
    r = respond(s, conv)  # its reply needs 16 positions beside a 2-position header: the first turn goes
    plan = s.schedule(in_worker=set(), end=no_end)
    assert [item.id for item in conv.items] == ["a-now", "a-a"] and conv.dropped == {"a-u", "a-old-reply"}
    # the instructions stay cached, and the user header both renderings start with
    assert [(job.owner, job.start) for job in plan.prefills] == [(r, 7)]


def test_first_chunks_alone_nothing_decodes():
    s = make_scheduler()
    a, b = (decoding(respond(s, conversation(s, name))) for name in "ab")
    for r in (a, b):
        r.audio.stream = SimpleNamespace(done=False)
    plan = s.schedule(in_worker={"r-a", "r-b"}, end=no_end)
    assert plan.decoding == plan.thinker_rows == plan.talker_rows == [], "both first chunks are being made"
    plan = s.schedule(in_worker={"r-a"}, end=no_end)
    assert plan.thinker_rows == [a, b] and plan.talker_rows == [a, b], "b is not in the worker: everyone steps"


def test_the_talker_waits_beside_replies_that_only_write_text():
    s = make_scheduler()
    spoken = decoding(respond(s, conversation(s, "a")))
    spoken.audio.stream = SimpleNamespace(done=False)
    text = decoding(respond(s, conversation(s, "b"), audio=False))
    plan = s.schedule(in_worker={"r-a"}, end=no_end)
    assert plan.thinker_rows == [spoken, text] and plan.talker_rows == []
    spoken.audio.first_made_at = 1.0  # its first chunk is out: the one in the worker is a later one
    plan = s.schedule(in_worker={"r-a"}, end=no_end)
    assert plan.talker_rows == [spoken]


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
    r.audio.stream = SimpleNamespace(codes_until_ready=lambda: 4, done=False)
    free = dict(alone=True, can_chain=True, prefills=0, job_in_worker=False, commands_waiting=False)
    assert s.chain_steps([(r, True)], **free) == 4
    for busy in ({"prefills": 1}, {"job_in_worker": True}, {"commands_waiting": True}, {"alone": False}):
        assert s.chain_steps([(r, True)], **free | busy) == 1, busy
    other = decoding(respond(s, conversation(s, "b")))
    assert s.chain_steps([(r, True)], **free) == 1, "a live response outside the batch"
    assert other.id in s.responses


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
        job = s.audio_job(ready, now)
        return ([], None) if job is None else (job.rows, job.urgent)

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
    assert s.finished([text, spoken], busy=lambda r: False) == [text], "the spoken reply's talker still runs"
    spoken.talker.status = TalkerStatus.DONE
    spoken.audio.stream = SimpleNamespace(done=True)
    assert s.finished([spoken], busy=lambda r: True) == [], "its last chunk is in the worker"
    assert s.finished([spoken], busy=lambda r: False) == [spoken]


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
