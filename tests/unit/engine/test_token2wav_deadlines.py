"""token2wav by playout deadline (pipeline/scheduler/token2wav_jobs.py): the pure rule, the scheduler that feeds it
on a clock the test moves, and the step phases that read that clock. No model, no device.

Uses the fake renderer and the response helpers of ``test_scheduler.py``.
"""

from __future__ import annotations

import random
from dataclasses import replace
from types import SimpleNamespace

import pytest
from test_scheduler import Renderer, conversation, decoding, make_scheduler

from pipeline.core.conversation_state import ConvItem, ItemKind
from pipeline.core.response_state import ResponseSpec, ResponseState, TalkerStatus, TextEnd
from pipeline.output.detokenizer import IncrementalDetokenizer
from pipeline.scheduler.plan import AudioRule, StepPlan
from pipeline.scheduler.scheduler import Scheduler, StepContext
from pipeline.scheduler.token2wav_jobs import ChunkCandidate, Token2WavJob, pick_job
from pipeline.step.phases import StepPhases, chunk_candidates

NOW = 1000.0
"""The fake clock's reading (s) where a test does not move it."""


def later(key: str, deadline_ms: float, arrival: int = 0) -> ChunkCandidate:
    """A later chunk whose player runs dry ``deadline_ms`` from the pick."""
    return ChunkCandidate(key, first=False, audio_ahead_ms=deadline_ms, arrival=arrival)


def first(key: str, wanted_in_ms: float = 0.0, arrival: int = 0) -> ChunkCandidate:
    """A first chunk whose audio is wanted ``wanted_in_ms`` from the pick (negative: overdue)."""
    return ChunkCandidate(key, first=True, audio_ahead_ms=wanted_in_ms, arrival=arrival)


# -- the pure rule ----------------------------------------------------------------------------------
def test_the_nearest_deadline_goes_first_whatever_the_order_of_arrival() -> None:
    ready = [later("a", 900, 0), later("b", 2000, 1), later("c", 120, 2), later("d", 400, 3)]
    assert pick_job(ready, 8) == Token2WavJob(("c", "d", "a", "b"), urgent=False)


def test_first_chunks_are_ranked_by_when_their_audio_is_wanted() -> None:
    # an overdue first chunk goes before one still within its target, whatever the order they came in
    assert pick_job([first("young", 300, 1), first("old", -200, 0)], 8) == Token2WavJob(("old", "young"), True)
    # a later chunk within the margin of its deadline goes before a first chunk that is wanted later than that
    ready = [first("new", 300), later("low", 500)]
    assert pick_job(ready, 8, starving_margin_ms=250) == Token2WavJob(("low",), urgent=False)
    # ... and after one that is wanted sooner
    assert pick_job([first("new", 200), later("low", 500)], 8, starving_margin_ms=250) == Token2WavJob(("new",), True)


def test_ties_go_to_a_first_chunk_then_to_the_earlier_start() -> None:
    assert pick_job([later("b", 100, 1), later("a", 100, 0)], 8) == Token2WavJob(("a", "b"), urgent=False)
    assert pick_job([first("y", 0, 1), first("x", 0, 0)], 1) == Token2WavJob(("x",), urgent=True)
    # a first chunk and a later chunk at equal urgency (the later chunk's deadline less the margin)
    assert pick_job([later("l", 250, 0), first("f", 0, 1)], 8, starving_margin_ms=250) == Token2WavJob(("f",), True)
    # equal arrival too: the callers' order
    assert pick_job([later("q", 50), later("p", 50)], 8) == Token2WavJob(("q", "p"), urgent=False)


def test_a_stream_beyond_the_lead_waits_and_one_within_it_always_runs() -> None:
    far, near = later("far", 1600), later("near", 900)
    assert pick_job([far], 8, lead_ms=1500) is None, "nothing due: the step goes to decode"
    assert pick_job([far, near], 8, lead_ms=1500) == Token2WavJob(("near", "far"), urgent=False), "near due: far rides"
    assert pick_job([far, near], 1, lead_ms=1500) == Token2WavJob(("near",), urgent=False), "one pass: the due one"
    assert pick_job([later("edge", 1500)], 8, lead_ms=1500) == Token2WavJob(("edge",), urgent=False), "at the lead"
    assert pick_job([far, near], 8) == Token2WavJob(("near", "far"), urgent=False), "no lead: both at once"
    # a due first chunk runs even when a later chunk that is not due ranks above it; a job is of one kind
    assert pick_job([later("ahead", 1600), first("new", 1400)], 8, starving_margin_ms=250, lead_ms=1500) == (
        Token2WavJob(("new",), urgent=True)
    )
    # a first chunk not yet due fills a pass a due first chunk opens
    assert pick_job([first("late", 1700), first("new", 1400)], 8, lead_ms=1500) == (
        Token2WavJob(("new", "late"), urgent=True)
    )
    with pytest.raises(ValueError, match="lead_ms"):
        pick_job([far], 8, lead_ms=-1)


def test_a_job_takes_the_nearest_deadlines_up_to_one_batch() -> None:
    ready = [later(k, ms, i) for i, (k, ms) in enumerate([("a", 700), ("b", 50), ("c", 300), ("d", -10), ("e", 90)])]
    assert pick_job(ready, 3) == Token2WavJob(("d", "b", "e"), urgent=False)
    assert pick_job(ready, 3, lead_ms=60) == Token2WavJob(("d", "b", "e"), urgent=False), "due ones, then the nearest"
    assert pick_job(ready[:1] + ready[2:3], 3, lead_ms=60) is None, "none due: no pass, however full it could be"


@pytest.mark.parametrize("seed", range(40))
def test_the_rule_holds_on_random_candidates(seed: int) -> None:
    """Any set of candidates: no job exactly when none is due; a job of one kind, at most one batch, holding the most
    urgent due candidate; due candidates of its kind before any that is not, none of them left out while one that is
    not due is taken; within each group, the most urgent first."""
    rng = random.Random(seed)
    margin, lead, batch = rng.choice([0.0, 250.0]), rng.choice([None, 500.0, 1500.0]), rng.randint(1, 4)
    ready = [
        ChunkCandidate(i, first=rng.random() < 0.3, audio_ahead_ms=rng.uniform(-300, 2500), arrival=rng.randint(0, 5))
        for i in range(rng.randint(0, 9))
    ]
    job = pick_job(ready, batch, starving_margin_ms=margin, lead_ms=lead)
    due = [c for c in ready if lead is None or c.audio_ahead_ms <= lead]
    if not due:
        assert job is None
        return
    assert job is not None
    taken = [c for c in ready if c.key in job.keys]
    assert len(taken) == len(job.keys) <= batch
    assert all(c.first == job.urgent for c in taken)
    urgency = {c.key: c.urgency_ms(margin) for c in ready}
    is_due = {c.key: c in due for c in ready}
    assert urgency[job.keys[0]] == min(urgency[c.key] for c in due if c.first == job.urgent)
    assert is_due[job.keys[0]] and min(urgency[c.key] for c in due) == min(
        urgency[c.key] for c in due if c.first == job.urgent
    ), "the most urgent due candidate decides the kind"
    flags = [is_due[k] for k in job.keys]
    assert flags == sorted(flags, reverse=True), "due ones first"
    kind = [c for c in ready if c.first == job.urgent]
    left = [c for c in kind if c.key not in job.keys]
    assert not left or len(job.keys) == batch, "a pass is filled while candidates of its kind are left"
    assert not any(is_due[c.key] for c in left) or all(flags), "no due one left out for one that is not due"
    for group in (True, False):
        keys = [k for k in job.keys if is_due[k] == group]
        assert [urgency[k] for k in keys] == sorted(urgency[k] for k in keys)
        rest = [c for c in left if is_due[c.key] == group]
        assert not keys or all(urgency[c.key] >= max(urgency[k] for k in keys) for c in rest)


def test_no_ready_stream_starves() -> None:
    """A clock moves 100 ms per job of one stream (batch 1); 4 playing streams of 720-ms chunks, start times spread;
    a new reply's first chunk every 300 ms, wanted 500 ms after it started, done once made. Below capacity every
    first chunk is made and every playing stream is served again and again, each within a bounded number of jobs
    of becoming due."""
    clock, lead, margin = 0.0, 1500.0, 250.0
    deadlines = {f"s{i}": 0.2 * i for i in range(4)}  # playing streams: when each runs dry (s)
    order = {k: i for i, k in enumerate(deadlines)}
    pending: dict[str, float] = {}  # first chunks: when each is wanted (s)
    due_since: dict[str, int] = {}
    longest = {"first": 0, "later": 0}
    served = dict.fromkeys(deadlines, 0)
    for job_no in range(600):  # one job's time each, a job or none
        if job_no % 3 == 0:
            key = f"n{job_no}"
            pending[key], order[key] = clock + 0.5, len(order)
        ready = [later(k, (d - clock) * 1000, order[k]) for k, d in deadlines.items()]
        ready += [first(k, (d - clock) * 1000, order[k]) for k, d in pending.items()]
        for c in ready:
            if c.due(lead):
                due_since.setdefault(c.key, job_no)
        job = pick_job(ready, 1, starving_margin_ms=margin, lead_ms=lead)
        assert (job is None) == (not due_since), "no job exactly when nothing is due"
        clock += 0.1
        if job is None:
            continue
        (key,) = job.keys
        kind = "first" if key in pending else "later"
        longest[kind] = max(longest[kind], job_no - due_since.pop(str(key)))
        if key in pending:
            del pending[key]
        else:
            deadlines[key] += 0.72  # its chunk's audio
            served[key] += 1
    assert len(pending) <= 1, "every first chunk is made"
    assert min(served.values()) > 50, "every playing stream keeps being served"
    assert longest["first"] <= 10 and longest["later"] <= 15, longest
    assert all(d > clock for d in deadlines.values()), "and none runs dry"


def test_the_audio_rule_passes_its_lead_to_the_rule() -> None:
    ready = [later("far", 1600), later("near", 900)]
    assert AudioRule(8, 0.0, 1500.0).pick(ready) == Token2WavJob(("near", "far"), urgent=False)
    assert AudioRule(8, 0.0, 800.0).pick(ready) is None, "neither within the lead"
    assert AudioRule(8, 0.0).pick(ready) == Token2WavJob(("near", "far"), urgent=False)


# -- the scheduler, on a clock the test moves ---------------------------------------------------------
def deadline_scheduler(**overrides) -> Scheduler:
    return make_scheduler(
        slots=8,
        talker_slots=8,
        starving_margin_ms=250,
        deadline_lead_s=1.0,
        first_audio_target_ms=500,
        **overrides,
    )


def spoken(s: Scheduler, name: str, *, started_at: float) -> ResponseState:
    """A spoken reply that the engine took at ``started_at``, past its prompt, its talker running."""
    conv = conversation(s, name)
    rid = f"r-{name}"
    spec = ResponseSpec(
        id=rid, conv_id=name, item_id=f"{name}-a", audio=True, voice="v", max_text_tokens=16, sink=lambda e: None
    )
    item = ConvItem(id=spec.item_id, role="assistant", kind=ItemKind.REPLY, open=True)
    conv.add(item)
    conv.active_response = rid
    r = ResponseState(
        spec=spec, conv=conv, item=item, detok=IncrementalDetokenizer(Renderer().decode), started_at=started_at
    )
    s.add_response(r)
    decoding(r)
    r.talker.status = TalkerStatus.RUNNING
    return r


def playing(r: ResponseState, *, first_at: float, seconds: float) -> ResponseState:
    """``r``'s first audio left at ``first_at`` and ``seconds`` of it in all, in time."""
    r.audio.first_made_at = first_at
    r.audio.playout.deliver(first_at, seconds)
    return r


def picked(s: Scheduler, ready: list[ResponseState], now: float, plan: StepPlan | None = None) -> list[str]:
    rule = (plan or s.schedule(StepContext())).audio
    job = rule.pick(chunk_candidates(ready, now))
    return [] if job is None else [ready[i].id for i in job.keys]


def test_a_stream_near_its_deadline_overtakes_streams_that_started_before_it() -> None:
    s = deadline_scheduler()
    a = playing(spoken(s, "a", started_at=NOW - 10), first_at=NOW - 9.5, seconds=10.7)  # dry at NOW + 1.2
    b = playing(spoken(s, "b", started_at=NOW - 8), first_at=NOW - 7.5, seconds=8.4)  # dry at NOW + 0.9
    c = playing(spoken(s, "c", started_at=NOW - 2), first_at=NOW - 1.5, seconds=1.8)  # dry at NOW + 0.3
    ready = [a, b, c]  # in start order, as the step finds them
    plan = s.schedule(StepContext())
    assert plan.talker_rows and plan.audio.lead_ms == 1000.0, "the talkers decode: a far stream may wait"
    assert picked(s, ready, NOW, plan) == ["r-c", "r-b", "r-a"], "c first; a (1.2 s from dry) rides along"
    s.cfg = replace(s.cfg, t2w_max_batch=2)
    assert picked(s, ready, NOW) == ["r-c", "r-b"], "a pass of two: the nearest deadlines"
    s.cfg = replace(s.cfg, t2w_max_batch=1)
    assert picked(s, ready, NOW) == ["r-c"], "one per job: the nearest deadline"
    assert picked(s, [a], NOW) == [] and picked(s, [a], NOW + 0.25) == ["r-a"], "alone, a waits until it is due"


def test_a_first_chunk_is_wanted_its_target_after_the_response_started() -> None:
    s = deadline_scheduler()
    steady = playing(spoken(s, "a", started_at=NOW - 5), first_at=NOW - 4.5, seconds=5.0)  # dry at NOW + 0.5
    new = spoken(s, "b", started_at=NOW - 0.1)  # its first audio is wanted at NOW + 0.4
    assert new.audio.playout.wanted_at == pytest.approx(NOW + 0.4)
    ready = [steady, new]
    # the steady stream has 500 ms less the 250 ms margin: it goes before a first chunk wanted in 400 ms
    assert picked(s, ready, NOW) == ["r-a"]
    # a reply that started earlier has its first chunk wanted sooner, and goes first
    older = spoken(s, "c", started_at=NOW - 0.3)  # wanted at NOW + 0.2
    assert picked(s, [steady, new, older], NOW) == ["r-c", "r-b"]


def test_nothing_waits_in_a_step_without_other_gpu_work() -> None:
    s = deadline_scheduler()
    r = playing(spoken(s, "a", started_at=NOW - 10), first_at=NOW - 9.5, seconds=15.0)  # 5.5 s ahead
    r.thinker.end = TextEnd.STOP
    r.talker.status = TalkerStatus.DONE
    plan = s.schedule(StepContext())
    assert plan.audio.lead_ms is None, "nothing decodes: waiting would leave the GPU idle"
    assert picked(s, [r], NOW, plan) == ["r-a"]
    assert make_scheduler().schedule(StepContext()).audio.lead_ms is None, "no lead configured"


# -- the step phases read the injected clock --------------------------------------------------------
def test_the_step_phases_pick_at_the_time_of_their_clock() -> None:
    s = deadline_scheduler()
    a = playing(spoken(s, "a", started_at=NOW - 10), first_at=NOW - 9.5, seconds=10.7)  # dry at NOW + 1.2
    jobs: list[list[str]] = []
    runner = SimpleNamespace(
        worker=None,
        worker_idle=lambda: True,
        synthesize=lambda job, emit, record: jobs.append([r.id for r in job.rows]),
    )
    clock = [NOW]
    phases = StepPhases(
        scheduler=s,
        runner=runner,  # type: ignore[arg-type]
        image_encodes=None,
        output=SimpleNamespace(emit_audio=None),  # type: ignore[arg-type]
        talker_stage=None,
        observer=None,  # type: ignore[arg-type]
        fail_now=lambda r, exc: None,
        clock=lambda: clock[0],
    )
    plan = s.schedule(StepContext())
    phases.synthesize(plan, [a])
    assert jobs == [], "1.2 s from its deadline at the clock's time: it waits"
    clock[0] = NOW + 0.3
    phases.synthesize(plan, [a])
    assert jobs == [["r-a"]]


# -- the settings -------------------------------------------------------------------------------------
@pytest.mark.parametrize("family", ["qwen2_5_omni", "qwen3_omni"])
def test_the_lead_and_the_first_audio_target_are_token2wav_settings(family: str) -> None:
    import yaml

    from pipeline.config import PACKAGED_STAGE_CONFIGS, ConfigError, parse_stage_config

    raw = yaml.safe_load(PACKAGED_STAGE_CONFIGS[family].read_text())
    tw = parse_stage_config(raw).token2wav
    assert (tw.deadline_lead_s, tw.first_audio_target_ms) == (1.5, 500), "the typed defaults, for both families"
    section = raw["stages"]["token2wav"]
    section["deadline_lead_s"] = None
    assert parse_stage_config(raw).token2wav.deadline_lead_s is None, "null: nothing waits"
    section["deadline_lead_s"] = -0.5
    with pytest.raises(ConfigError, match="token2wav.deadline_lead_s must be a number >= 0"):
        parse_stage_config(raw)
    section["deadline_lead_s"] = 0.4
    with pytest.raises(ConfigError, match="first_audio_target_ms .500. must be at most deadline_lead_s"):
        parse_stage_config(raw)
    section["first_audio_target_ms"] = 400
    assert parse_stage_config(raw).token2wav.deadline_lead_s == 0.4
    raw["stages"]["talker"]["deadline_lead_s"] = 1.0
    with pytest.raises(ConfigError, match="unknown field 'stages.talker.deadline_lead_s'"):
        parse_stage_config(raw)
