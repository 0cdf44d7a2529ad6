"""The bench's barge-in: what became of a reply the user talked over (cancelled while generating, stopped during
playback, played out, not stopped, no reply) and its latency, on hand-made event timelines; when the interrupting
speech starts; and a simulated user against a scripted server whose replies are generated faster than they play."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from realtime.bench.client import BARGE_IN_TAIL_MS, ClientOptions, SimulatedUser, UserPlan
from realtime.bench.metrics import (
    AudioArrival,
    BargeInKind,
    BargeInLog,
    ResponseLog,
    ResponseOutcome,
    TurnLog,
    TurnMetrics,
    barge_in_counts,
    first_sound_played_at,
    turn_metrics,
)
from realtime.bench.speech import RATE, Speech, without_tail

DELTA = 2400
"""100 ms of 24 kHz audio per delta."""


def ws_turn(*, done_at: float, status=ResponseOutcome.COMPLETED, reason=None, onset=None, heard=None) -> TurnLog:
    """Five 100 ms deltas arriving at 1.0 .. 1.4 s (a player with a 60 ms jitter buffer plays them from 1.06 to
    1.56); the reply is done at ``done_at``; the user talked over it at ``onset``, heard at ``heard``."""
    response = ResponseLog("resp_1", created_at=0.9, done_at=done_at, status=status, reason=reason)
    response.audio = [AudioArrival(1.0 + 0.1 * i, DELTA, 0) for i in range(5)]
    log = TurnLog(0, 0, "a.wav", 0.2, 0.4, speech_stopped_at=0.8, responses=[response])
    if onset is not None:
        log.barge_in = BargeInLog(onset_at=onset, detected_at=heard)
    return log


def test_a_reply_still_generating_is_cancelled_and_timed_to_its_response_done():
    log = ws_turn(done_at=1.33, status=ResponseOutcome.CANCELLED, reason="turn_detected", onset=1.2, heard=1.3)
    m = turn_metrics(log, jitter_ms=60)
    assert m.barge_in_kind == BargeInKind.CANCELLED.value
    assert m.barge_in_ms == pytest.approx(130)  # onset 1.2 -> response.done 1.33
    assert m.barge_in_stop_ms == pytest.approx(30)  # speech_started 1.3 -> response.done 1.33
    assert m.barge_in_audio_stop_ms == pytest.approx(100)  # the last delta came at 1.4
    assert m.rtf is None and m.underruns is None


def test_a_reply_generated_before_the_user_spoke_is_stopped_during_playback():
    # generation ended at 1.45; the player plays until 1.56; the user speaks at 1.3 and is heard at 1.42
    m = turn_metrics(ws_turn(done_at=1.45, onset=1.3, heard=1.42), jitter_ms=60)
    assert m.barge_in_kind == BargeInKind.STOPPED_PLAYBACK.value
    assert m.barge_in_ms == pytest.approx(120)  # onset -> speech_started, the WebSocket client's signal to stop
    assert m.barge_in_stop_ms is None and m.barge_in_audio_stop_ms is None
    # a reply the client cancelled itself is no barge-in cancel: the user still stopped its playback
    client = ws_turn(done_at=1.2, status=ResponseOutcome.CANCELLED, reason="client_cancelled", onset=1.3, heard=1.42)
    assert turn_metrics(client, jitter_ms=60).barge_in_kind == BargeInKind.STOPPED_PLAYBACK.value


def test_a_signal_after_the_reply_played_out_cuts_nothing():
    late = turn_metrics(ws_turn(done_at=1.45, onset=1.5, heard=1.6), jitter_ms=60)  # heard after 1.56
    assert late.barge_in_kind == BargeInKind.PLAYED_OUT.value and late.barge_in_ms is None
    after = turn_metrics(ws_turn(done_at=1.45, onset=1.6, heard=1.65), jitter_ms=60)  # spoke after the end
    assert after.barge_in_kind == BargeInKind.PLAYED_OUT.value
    # a bigger jitter buffer plays longer: the same signal then comes in time
    assert turn_metrics(ws_turn(done_at=1.45, onset=1.5, heard=1.6), jitter_ms=100).barge_in_kind == (
        BargeInKind.STOPPED_PLAYBACK.value
    )


def test_no_signal_and_no_sound_are_named():
    unheard = turn_metrics(ws_turn(done_at=1.45, onset=1.3, heard=None))
    assert unheard.barge_in_kind == BargeInKind.NOT_STOPPED.value and unheard.barge_in_ms is None
    silent = ws_turn(done_at=1.45, onset=1.3, heard=1.4)
    silent.responses[0].audio = [AudioArrival(1.0, DELTA, None)]
    assert turn_metrics(silent).barge_in_kind == BargeInKind.NO_REPLY.value
    nothing = ws_turn(done_at=1.45, onset=1.3, heard=1.4)
    nothing.responses = []
    assert turn_metrics(nothing).barge_in_kind == BargeInKind.NO_REPLY.value
    assert turn_metrics(ws_turn(done_at=1.45)).barge_in_kind is None  # not a barge-in turn


def test_webrtc_stops_playback_by_clearing_the_track():
    # 20 ms frames at 48 kHz from 1.0 to 1.2 s; generation ended at 1.05
    frames = [AudioArrival(1.0 + 0.02 * i, 960, 0) for i in range(10)]
    response = ResponseLog("r", 0.9, done_at=1.05, status=ResponseOutcome.COMPLETED, audio=frames)
    log = TurnLog(0, 0, "a.wav", 0.2, 0.4, sample_rate=48_000, paced_audio=True, responses=[response])
    log.barge_in = BargeInLog(onset_at=1.1, detected_at=1.15)
    assert turn_metrics(log).barge_in_kind == BargeInKind.NOT_STOPPED.value  # heard, but the track was not cleared
    response.output_cleared_at = 1.16
    m = turn_metrics(log)
    assert m.barge_in_kind == BargeInKind.STOPPED_PLAYBACK.value and m.barge_in_ms == pytest.approx(60)
    assert m.barge_in_audio_stop_ms == pytest.approx(50)  # speech_started 1.15 -> the last frame ended at 1.2
    response.output_cleared_at = 1.25  # after the last frame: nothing was cut
    assert turn_metrics(log).barge_in_kind == BargeInKind.PLAYED_OUT.value


def test_barge_in_counts_per_kind_with_latencies_for_the_cut_ones():
    turns = [
        TurnMetrics(0, 0, "a", "cancelled", barge_in_kind="cancelled", barge_in_ms=200.0),
        TurnMetrics(0, 1, "a", "completed", barge_in_kind="stopped_playback", barge_in_ms=100.0),
        TurnMetrics(0, 2, "a", "completed", barge_in_kind="stopped_playback", barge_in_ms=140.0),
        TurnMetrics(0, 3, "a", "completed", barge_in_kind="played_out"),
        TurnMetrics(0, 4, "a", "completed"),
    ]
    counts = barge_in_counts(turns)
    assert {k: v["count"] for k, v in counts.items()} == {
        "cancelled": 1,
        "stopped_playback": 2,
        "played_out": 1,
        "not_stopped": 0,
        "no_reply": 0,
    }
    assert counts["stopped_playback"]["ms"].p50 == pytest.approx(120) and counts["cancelled"]["ms"].n == 1
    assert "ms" not in counts["played_out"]


def test_the_first_sound_plays_after_the_jitter_buffer_and_the_silence_before_it():
    arrivals = [AudioArrival(1.0, DELTA, None), AudioArrival(1.05, DELTA, 240)]
    # the player starts at 1.06, plays the silent 100 ms, then 10 ms into the second delta
    assert first_sound_played_at(arrivals, RATE, 0.06, paced=False) == pytest.approx(1.17)
    late = [AudioArrival(1.0, DELTA, None), AudioArrival(1.5, DELTA, 0)]  # starved until 1.5
    assert first_sound_played_at(late, RATE, 0.06, paced=False) == pytest.approx(1.5)
    assert first_sound_played_at(arrivals, 48_000, 0.06, paced=True) == pytest.approx(1.05 + 0.005 + 0.06)
    assert first_sound_played_at(arrivals[:1], RATE, 0.06, paced=False) is None


def test_without_tail_keeps_the_speech_and_a_little_silence():
    pcm = np.ones(RATE, dtype=np.float32)  # 1 s file, speech 100 .. 500 ms
    cut = without_tail(Speech("a.wav", pcm, 100.0, 500.0, "manifest"), 100.0)
    assert len(cut.pcm) == RATE * 600 // 1000 and (cut.name, cut.speech_end_ms) == ("a.wav", 500.0)
    short = Speech("b.wav", pcm, 100.0, 950.0, "manifest")
    assert without_tail(short, 100.0) is short


class FastServerLink:
    """A scripted server whose replies are generated at once: every utterance is heard 60 ms after its file
    starts (10 ms after the speech in the files below) and ends 20 ms after the file ends; the reply (``chunks``
    deltas of 100 ms) arrives in one burst with its ``response.done``, so the user can only talk over its
    playback."""

    paced_audio = False
    output_rate = RATE

    def __init__(self, chunks: int = 8) -> None:
        self.chunks = chunks
        self.spoken: list[int] = []
        self.tasks: list[asyncio.Task] = []

    async def connect(self, listener) -> None:
        self.listener = listener
        fmt = {"type": "audio/pcm", "rate": RATE}
        self.emit(
            {"type": "session.created", "session": {"audio": {"input": {"format": fmt}, "output": {"format": fmt}}}}
        )

    def emit(self, event: dict) -> None:
        self.listener.on_event(asyncio.get_running_loop().time(), event)

    async def speak(self, pcm: np.ndarray) -> float:
        self.spoken.append(len(pcm))
        self.tasks.append(asyncio.create_task(self.hear(len(pcm) / RATE, f"resp_{len(self.spoken)}")))
        return asyncio.get_running_loop().time()

    async def hear(self, seconds: float, rid: str) -> None:
        await asyncio.sleep(0.06)
        self.emit({"type": "input_audio_buffer.speech_started"})
        await asyncio.sleep(seconds - 0.04)
        self.emit({"type": "input_audio_buffer.speech_stopped"})
        self.emit({"type": "response.created", "response": {"id": rid}})
        samples = np.full(DELTA, 1000, dtype=np.int16)
        for _ in range(self.chunks):
            self.listener.on_audio(asyncio.get_running_loop().time(), samples, rid)
        self.emit({"type": "response.done", "response": {"id": rid, "status": "completed"}})

    async def close(self) -> None:
        for task in self.tasks:
            task.cancel()


async def test_the_user_talks_over_a_reply_that_finished_generating_while_it_plays():
    long_tail = Speech("a.wav", np.zeros(RATE, dtype=np.float32), 50.0, 90.0, "manifest")  # 910 ms of silence after
    interrupting = Speech("b.wav", np.zeros(2400, dtype=np.float32), 50.0, 80.0, "manifest")
    plan = UserPlan(0, (long_tail, interrupting), barge_in_turns=frozenset({0}))
    link = FastServerLink(chunks=8)  # 800 ms of reply audio, all there at once
    user = SimulatedUser(plan, link, ClientOptions(barge_in_after_ms=100, jitter_ms=20, turn_timeout_s=5))
    async with asyncio.timeout(10):
        logs = await user.run()
    assert link.spoken[0] == RATE * (90 + int(BARGE_IN_TAIL_MS)) // 1000  # the barge-in turn's long tail is cut
    first = turn_metrics(logs[0], jitter_ms=20)
    assert first.status == "completed" and first.barge_in_kind == BargeInKind.STOPPED_PLAYBACK.value
    assert 10 <= first.barge_in_ms < 60  # the scripted server hears speech 10 ms after it starts
    # the interrupting speech (its file 50 ms earlier) starts 100 ms into the reply's playback (first delta + 20 ms
    # jitter buffer)
    played = logs[0].response.audio[0].at + 0.02
    assert logs[0].barge_in.onset_at == pytest.approx(played + 0.1, abs=0.03)
    second = turn_metrics(logs[1], jitter_ms=20)
    assert second.barge_in_kind is None and second.rtf is not None and second.underruns == 0
