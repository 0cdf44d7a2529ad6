"""The step plan is the scheduler's whole decision, as plain data: ids, slot numbers, chunk specs, no live state.

Uses the fake renderer and the response helpers of ``test_scheduler.py``; no model, no device.
"""

from __future__ import annotations

import dataclasses
import pickle
from types import SimpleNamespace

import numpy as np
from test_scheduler import conversation, decoding, make_scheduler, respond, run_chunks, schedule

from pipeline.core.response_state import TalkerStatus, TextEnd
from pipeline.errors import ContextLimitError, EngineFailure, FunctionCallError
from pipeline.models.positions import GridSpan
from pipeline.scheduler import policies
from pipeline.scheduler.plan import PlannedEnd, StepPlan, TalkerListen, TalkerStart

PLAIN = (str, int, float, bool, type(None), range, np.ndarray, GridSpan)


def plain(value, where: str = "plan") -> list[str]:
    """The places in ``value`` that hold something other than ids and plain data."""
    if isinstance(value, PLAIN):
        return []
    if isinstance(value, (list, tuple, set, frozenset)):
        return [bad for i, item in enumerate(value) for bad in plain(item, f"{where}[{i}]")]
    if isinstance(value, dict):
        return [bad for k, item in value.items() for bad in plain(k, where) + plain(item, f"{where}[{k!r}]")]
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return [bad for f in dataclasses.fields(value) for bad in plain(getattr(value, f.name), f"{where}.{f.name}")]
    return [f"{where}: {type(value).__name__}"]


def busy_plan() -> tuple[StepPlan, dict]:
    """A step with a response's prompt, a reply whose talker starts, a cancelled response and a listening
    conversation."""
    s = make_scheduler()
    prompt = respond(s, conversation(s, "p"))
    spoken = decoding(respond(s, conversation(s, "s")))
    cancelled = respond(s, conversation(s, "c"))
    cancelled.cancel_reason = "client_cancelled"
    conversation(s, "idle")
    plan = s.schedule()
    return plan, dict(s=s, prompt=prompt, spoken=spoken, cancelled=cancelled)


def test_a_plan_holds_only_ids_and_plain_data_and_pickles():
    plan, r = busy_plan()
    assert not plain(plan), plain(plan)
    assert plan.prefills[0].response_id == r["prompt"].id, "responses' prompts first"
    background = {job.conv_id for job in plan.prefills[1:] if job.response_id is None}
    assert background == {"c", "idle"} and len(plan.prefills) == 3, "the cancelled reply's conversation is idle again"
    assert plan.ends == [PlannedEnd(r["cancelled"].id)]
    assert plan.decoding == plan.thinker_rows == plan.talker_rows == [r["spoken"].id]
    assert plan.talker_starts == [TalkerStart(r["spoken"].id, "s", r["spoken"].conv.talker_slot, quick=True)]
    convs = r["s"].conversations
    assert sorted(plan.talker_listens, key=lambda listen: listen.conv_id) == [
        TalkerListen(conv_id, convs[conv_id].talker_slot) for conv_id in ("c", "idle")
    ]
    again = pickle.loads(pickle.dumps(plan))
    assert again == plan


def test_a_failed_plan_lists_its_error_and_still_holds_plain_data():
    s = make_scheduler()
    bad = respond(s, conversation(s, "bad"))
    bad.conv.max_context_tokens = 10
    plan = s.schedule()
    (end,) = plan.ends
    assert end.response_id == bad.id and isinstance(end.error, ContextLimitError)
    assert not plain(dataclasses.replace(plan, ends=[])), "everything but the error is plain"


def test_talker_starts_take_their_slots_under_the_budget_in_start_order():
    s = make_scheduler(talker_prefills_per_step=1)
    a, b = (decoding(respond(s, conversation(s, name))) for name in "ab")
    plan = schedule(s)
    assert [start.response_id for start in plan.talker_starts] == [a.id], "one talker start a step"
    assert a.conv.talker_slot == plan.talker_starts[0].slot and b.conv.talker_slot is None
    a.talker.status = TalkerStatus.RUNNING  # the start ran
    a.audio.stream = SimpleNamespace(done=False, codes_until_ready=lambda: None)
    plan = schedule(s)
    assert [(start.response_id, start.quick) for start in plan.talker_starts] == [(b.id, False)], (
        "b next; a's stream is open, so no quick first chunk"
    )


def test_a_talker_start_waits_for_its_first_input_and_for_a_slot():
    s = make_scheduler(talker_slots=1, talker_prefills_per_step=2)
    a = decoding(respond(s, conversation(s, "a")))
    a.thinker.end = TextEnd.STOP  # no thinker row this step and nothing queued: no input for its talker yet
    assert schedule(s).talker_starts == []
    a.talker.queue.append("vector")
    (start,) = schedule(s).talker_starts
    assert start.slot == 0 and a.conv.talker_slot == 0
    a.talker.status = TalkerStatus.RUNNING
    b = decoding(respond(s, conversation(s, "b")))
    plan = schedule(s)
    assert plan.talker_rows == [a.id, b.id] and plan.talker_starts == [], "the only talker slot is a live reply's"
    assert b.conv.talker_slot is None and a.conv.talker_slot == 0


def test_listening_never_evicts():
    s = make_scheduler(talker_slots=1)
    a = decoding(respond(s, conversation(s, "a")))
    schedule(s)  # a's talker takes the only talker slot
    a.talker.status = TalkerStatus.RUNNING
    conversation(s, "idle")
    plan = schedule(s)
    assert [job.conv_id for job in plan.prefills] == ["idle"] and plan.talker_listens == []
    run_chunks(s, plan)


def test_a_failure_leaves_what_it_must():
    cleanup = policies.failure_cleanup
    assert cleanup(ContextLimitError("too long"), prefilling=True) == policies.Cleanup(drop_item=True)
    assert cleanup(RuntimeError("bug"), prefilling=True) == policies.Cleanup(drop_caches=True), "internal"
    assert cleanup(EngineFailure("failed"), prefilling=True) == policies.Cleanup(drop_caches=True)
    assert cleanup(FunctionCallError("bad call"), prefilling=False) == policies.Cleanup()
    assert cleanup(ContextLimitError("too long"), prefilling=False) == policies.Cleanup(drop_caches=True)
