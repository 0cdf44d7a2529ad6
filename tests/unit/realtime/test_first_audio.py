"""realtime.observe.first_audio: the per-response trace of the first audio's hops through the server. Pure:
a fake clock, no runner."""

from __future__ import annotations

import pytest

from conftest import load_script
from pipeline.response_events import StageTimings
from realtime.observe.first_audio import FirstAudioTrace, FirstAudioTracer, Hop


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now

    def advance(self, ms: float) -> None:
        self.now += ms / 1000.0


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def traces() -> list[FirstAudioTrace]:
    return []


def test_a_spoken_turn_is_traced_hop_by_hop(clock, traces):
    tracer = FirstAudioTracer(clock, traces.append)
    tracer.turn_ended()
    clock.advance(1)
    tracer.requested("r1")  # right behind the commit, not waiting for it
    engine_start = clock.now + 0.003
    clock.advance(12)
    tracer.committed()
    clock.advance(288)
    tracer.received_audio("r1")
    clock.advance(2)
    tracer.sent_audio("r1")
    clock.advance(50)
    tracer.received_audio("r1")  # later chunks change nothing
    tracer.sent_audio("r1")
    assert traces == []  # reported at the done, with the engine's moments
    tracer.done("r1", StageTimings(token2wav_first_chunk_ms=290.0, started_at_s=engine_start))
    (trace,) = traces
    assert list(trace.segments()) == [
        "turn_end->requested",
        "requested->engine_started",
        "engine_started->engine_first_audio",
        "engine_first_audio->received",
        "received->sent",
        "turn_end->committed",
    ]
    assert list(trace.segments().values()) == pytest.approx([1.0, 3.0, 290.0, 7.0, 2.0, 13.0])
    assert trace.total_ms() == pytest.approx(303.0)


def test_a_commit_answered_before_the_request_is_kept_for_it(clock, traces):
    tracer = FirstAudioTracer(clock, traces.append)
    tracer.turn_ended()
    clock.advance(5)
    tracer.committed()
    clock.advance(1)
    tracer.requested("r1")
    tracer.committed()  # a later commit without a turn end of its own changes nothing
    tracer.done("r1", StageTimings())
    (trace,) = traces
    assert trace.segments() == pytest.approx({"turn_end->requested": 6.0, "turn_end->committed": 5.0})


def test_a_response_to_text_starts_at_its_request(clock, traces):
    tracer = FirstAudioTracer(clock, traces.append)
    tracer.requested("r1")
    clock.advance(40)
    tracer.received_audio("r1")
    tracer.sent_audio("r1")
    tracer.done("r1", StageTimings())  # an engine that reports no start: no engine hops
    (trace,) = traces
    assert trace.segments() == pytest.approx({"requested->received": 40.0, "received->sent": 0.0})
    assert trace.total_ms() == pytest.approx(40.0)


def test_a_turn_end_belongs_to_the_next_request_only(clock, traces):
    tracer = FirstAudioTracer(clock, traces.append)
    tracer.turn_ended()
    tracer.requested("r1")
    tracer.done("r1", StageTimings())
    tracer.requested("r2")
    tracer.done("r2", StageTimings())
    assert [set(t.at) for t in traces] == [{Hop.TURN_END, Hop.REQUESTED}, {Hop.REQUESTED}]


def test_a_done_before_the_first_audio_left_waits_for_it(clock, traces):
    tracer = FirstAudioTracer(clock, traces.append)
    tracer.requested("r1")
    tracer.received_audio("r1")
    tracer.done("r1", StageTimings())
    assert traces == []
    clock.advance(5)
    tracer.sent_audio("r1")
    (trace,) = traces
    assert trace.total_ms() == pytest.approx(5.0)


def test_dropped_audio_and_no_audio_end_the_trace_at_the_done(clock, traces):
    tracer = FirstAudioTracer(clock, traces.append)
    tracer.requested("r1")
    tracer.received_audio("r1")
    tracer.done("r1", StageTimings())
    tracer.dropped("r1")  # a cancel dropped the queued audio after the done
    tracer.requested("r2")
    tracer.received_audio("r2")
    tracer.dropped("r2")  # ... or before it
    tracer.done("r2", StageTimings())
    tracer.requested("r3")  # text only
    tracer.done("r3", StageTimings())
    assert [t.response_id for t in traces] == ["r1", "r2", "r3"]
    assert all(t.total_ms() is None for t in traces)
    tracer.sent_audio("r1")  # nothing is held any more
    tracer.dropped("r9")
    assert len(traces) == 3 and tracer._traces == {} and tracer._done == set() and tracer._dropped == set()


def test_the_log_summary_splits_bench_levels_and_leaves_out_the_warm_up(tmp_path, capsys):
    def line(session: str, committed: float, sent: float) -> str:
        return (
            f"2026-11-22 05:48:38,296 INFO realtime.runner: session {session} response r first audio path (ms): "
            f"turn_end->committed {committed}, committed->requested 0.1, received->sent {sent}, total 9.5\n"
        )

    log = tmp_path / "server.log"
    log.write_text(
        line("s0", 99.0, 99.0)  # the warm-up
        + "2026-11-22 05:48:39,000 INFO realtime.bench.sweep: bench level 1: 1 users start\n"
        + line("s1", 10.0, 2.0)
        + line("s1", 12.0, 4.0)
        + "2026-11-22 05:49:39,000 INFO realtime.bench.sweep: bench level 2: 2 users start\n"
        + line("s2", 30.0, 5.0)
        + line("s3", 50.0, 7.0)
    )
    script = load_script("first_audio_path")
    levels = script.parse(log.read_text().splitlines())
    assert list(levels) == ["warm-up", "1 users", "2 users"]
    summary = script.summarize(levels["1 users"], skip=1)
    assert {name: list(v) for name, v in summary.items()} == {
        "turn_end->committed": [12.0],
        "committed->requested": [0.1],
        "received->sent": [4.0],
        "total": [9.5],
    }
    assert script.main([str(log)]) == 0
    rows = capsys.readouterr().out.splitlines()
    assert "| 2 users | turn_end->committed | 2 | 40.0 |" in "\n".join(rows)
    assert not any("99.0" in row for row in rows)


def test_the_log_summary_counts_preemptive_replies_and_leaves_withdrawn_ones_out(tmp_path, capsys):
    def line(kind: str, total: float) -> str:
        return (
            f"2026-11-22 05:48:38,296 INFO realtime.runner: session s1 response r{kind} first audio path (ms): "
            f"requested->received {total}, total {total}\n"
        )

    log = tmp_path / "server.log"
    log.write_text(
        line(" (preemptive, withdrawn)", 1.0)
        + line(" (preemptive)", 2.0)
        + line("", 3.0)
        + line(" (preemptive, withdrawn)", 4.0)
    )
    script = load_script("first_audio_path")
    lines = log.read_text().splitlines()
    assert list(script.summarize(script.parse(lines)["all"], skip=0)["total"]) == [2.0, 3.0]
    assert script.preemptive_counts(lines) == {"all": {"shown": 1, "withdrawn": 2}}
    assert script.main([str(log)]) == 0
    assert "| all | 1 | 2 |" in capsys.readouterr().out


def test_a_preemptive_reply_is_handed_over_once_shown(clock, traces):
    tracer = FirstAudioTracer(clock, traces.append)
    tracer.turn_ended()  # the commit at the pause
    tracer.preempted("r1")  # the session reports it before the runner's worker requests it
    clock.advance(1)
    tracer.requested("r1")
    clock.advance(150)
    tracer.received_audio("r1")  # held by the session: nothing sent yet
    tracer.done("r1", StageTimings())
    assert traces == []  # the client has not seen it: not settled
    clock.advance(149)
    tracer.shown("r1")
    clock.advance(2)
    tracer.sent_audio("r1")
    (trace,) = traces
    assert trace.preemptive and not trace.withdrawn
    segments = trace.segments()
    assert segments["turn_end->shown"] == pytest.approx(300.0) and segments["shown->sent"] == pytest.approx(2.0)
    assert segments["received->sent"] == pytest.approx(151.0)  # the hold is on the path, between the two
    assert trace.total_ms() == pytest.approx(302.0)


def test_a_tentative_reply_without_audio_waits_to_be_shown_or_withdrawn(clock, traces):
    tracer = FirstAudioTracer(clock, traces.append)
    for rid in ("r1", "r2"):
        tracer.turn_ended()
        tracer.requested(rid)
        tracer.preempted(rid)  # reported after the request this time
        tracer.done(rid, StageTimings())  # e.g. it failed before any audio
    assert traces == []
    tracer.withdrawn("r2")
    tracer.shown("r1")
    assert [(t.response_id, t.withdrawn, Hop.SHOWN in t.at) for t in traces] == [
        ("r2", True, False),
        ("r1", False, True),
    ]


def test_a_withdrawn_reply_is_handed_over_at_its_done_without_a_send(clock, traces):
    tracer = FirstAudioTracer(clock, traces.append)
    tracer.turn_ended()
    tracer.requested("r1")
    tracer.preempted("r1")
    tracer.received_audio("r1")
    tracer.withdrawn("r1")
    assert traces == []
    tracer.done("r1", StageTimings())
    (trace,) = traces
    assert trace.withdrawn and trace.total_ms() is None


def test_a_preemptive_reply_keeps_its_pause_even_when_its_request_runs_after_the_next_turn(clock, traces):
    tracer = FirstAudioTracer(clock, traces.append)
    tracer.turn_ended()  # the commit at the pause
    pause = clock.now
    tracer.preempted("r1")
    clock.advance(900)
    tracer.withdrawn("r1")
    tracer.turn_ended()  # the turn's real end, while r1's request still waits in the command queue
    stop = clock.now
    clock.advance(5)
    tracer.requested("r1")  # late
    tracer.requested("r2")
    tracer.done("r1", StageTimings())
    tracer.done("r2", StageTimings())
    first, second = traces
    assert (first.response_id, first.at[Hop.TURN_END]) == ("r1", pause)
    assert (second.response_id, second.at[Hop.TURN_END]) == ("r2", stop)
