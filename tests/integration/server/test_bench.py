"""The latency bench (realtime.bench): metric math on hand-made timelines, the WAV folder loader,
the microphone, the simulated user's script against a scripted link (no sockets), the one-worker
reference queue, stage throughput from counter snapshots (and /metrics), the report writers,
option resolution, and one quick end-to-end run on the tiny model (server in process, user in a
child process, reference beside it)."""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import shutil
from dataclasses import replace

import numpy as np
import pytest
import soundfile as sf

from realtime.bench.client import FRAME_SAMPLES, ClientOptions, Microphone, SimulatedUser, UserPlan
from realtime.bench.metrics import (
    AudioArrival,
    BargeInLog,
    Distribution,
    ResponseLog,
    ResponseOutcome,
    TurnLog,
    TurnMetrics,
    first_audible,
    media_gaps,
    paced_playback,
    status_counts,
    summarize,
    turn_metrics,
)
from realtime.bench.reference import Served, serve_one_worker
from realtime.bench.speech import (
    RATE,
    Speech,
    SpeechFolderError,
    energy_speech_bounds,
    load_speech_folder,
    with_pause,
)
from realtime.bench.sweep import LevelResult, SweepPlan, user_plans
from realtime.bench.throughput import (
    EngineCounters,
    counters_from_metrics,
    level_throughput,
    reference_throughput,
    replying_seconds,
    scrape_counters,
)
from tests.helpers.paths import REPO, TESTS

SPEECH_DIR = TESTS / "fixtures" / "speech"


def loud(n: int, at: int | None = 0) -> np.ndarray:
    """``n`` int16 samples, silent except one loud sample at index ``at``."""
    x = np.zeros(n, dtype=np.int16)
    if at is not None:
        x[at] = 1000
    return x


# --- metric primitives ---------------------------------------------------------------------------


def test_first_audible_uses_the_pcm16_threshold_for_ints_and_floats():
    assert first_audible(np.array([0, 5, -32, 33, 0], dtype=np.int16)) == 3
    assert first_audible(np.array([0, -40], dtype=np.int16)) == 1  # magnitude, either sign
    assert first_audible(np.zeros(100, dtype=np.int16)) is None
    assert first_audible(np.array([0.0, 0.0005, 0.002], dtype=np.float32)) == 2  # 0.002 * 32768 = 65.5
    assert first_audible(np.array([0, 40], dtype=np.int16), threshold=50) is None


def test_paced_playback_on_time_never_starves():
    # 100 ms pieces arriving every 50 ms: always ahead of the player
    arrivals = [AudioArrival(10.0 + 0.05 * i, 2400, 0) for i in range(5)]
    p = paced_playback(arrivals, 24_000, jitter_s=0.06)
    assert (p.underruns, p.starved_s) == (0, 0.0)
    assert p.start == pytest.approx(10.06) and p.end == pytest.approx(10.56)


def test_paced_playback_counts_each_late_piece_and_its_wait():
    # 100 ms pieces; the player starts at 0.06 and needs piece 2 at 0.26 but gets it at 0.50,
    # then (resumed at 0.50) needs piece 3 at 0.60 and gets it at 0.65
    arrivals = [
        AudioArrival(0.0, 2400, 0),
        AudioArrival(0.05, 2400, 0),
        AudioArrival(0.50, 2400, 0),
        AudioArrival(0.65, 2400, 0),
    ]
    p = paced_playback(arrivals, 24_000, jitter_s=0.06)
    assert p.underruns == 2
    assert p.starved_s == pytest.approx(0.24 + 0.05)
    assert p.end == pytest.approx(0.75)
    assert paced_playback([], 24_000, 0.06) is None


def test_media_gaps_count_silent_runs_inside_the_audible_span_only():
    frame = 960
    pattern = [
        None,
        None,
        0,
        0,
        None,
        None,
        5,
        None,
        0,
        None,
    ]  # silence before the first and after the last don't count
    arrivals = [AudioArrival(0.02 * i, frame, a) for i, a in enumerate(pattern)]
    runs, silent_s = media_gaps(arrivals, 48_000)
    assert runs == 2 and silent_s == pytest.approx(0.06)
    assert media_gaps(arrivals[:3], 48_000) == (0, 0.0)


# --- a whole turn --------------------------------------------------------------------------------


def spoken_turn(**overrides) -> TurnLog:
    """Speech ends at t=1.000; VAD says stopped at 1.600, committed 1.610; response created 1.620;
    silent delta at 1.700, first sound at 1.800 (sample 240 of its 2400), 3 more deltas; done 2.300."""
    response = ResponseLog(
        "resp_1", created_at=1.62, first_transcript_at=1.75, done_at=2.3, status=ResponseOutcome.COMPLETED
    )
    response.audio = [
        AudioArrival(1.70, 2400, None),
        AudioArrival(1.80, 2400, 240),
        AudioArrival(1.85, 2400, 0),
        AudioArrival(2.20, 2400, 0),
        AudioArrival(2.25, 2400, 0),
    ]
    log = TurnLog(
        user=0,
        turn=0,
        wav="a.wav",
        speech_start_at=0.2,
        speech_end_at=1.0,
        speech_started_at=0.5,
        speech_stopped_at=1.6,
        committed_at=1.61,
        responses=[response],
    )
    for key, value in overrides.items():
        setattr(log, key, value)
    return log


def test_turn_metrics_of_a_spoken_turn():
    m = turn_metrics(spoken_turn(), jitter_ms=60)
    assert m.status == "completed"
    assert m.end_of_turn_ms == pytest.approx(600)
    assert m.ttfa_ms == pytest.approx(200)  # stopped 1.6 -> first non-silent delta 1.8
    assert m.voice_to_voice_ms == pytest.approx(810)  # speech end 1.0 -> 1.8 + 240 / 24000
    assert m.first_transcript_ms == pytest.approx(150)
    assert m.audio_ms == pytest.approx(500)
    assert m.rtf == pytest.approx((2.25 - 1.70) / 0.5)
    # player: starts 1.76, piece 3 due 2.06 arrives 2.20 (0.14 starved), then on time
    assert m.underruns == 1 and m.starved_ms == pytest.approx(140)
    assert m.barge_in_stop_ms is None


def test_turn_metrics_fall_back_to_the_commit_and_mark_missing_replies():
    m = turn_metrics(spoken_turn(speech_stopped_at=None))
    assert m.ttfa_ms == pytest.approx(190)  # from the commit at 1.61
    silent = spoken_turn()
    silent.responses[0].audio = [AudioArrival(1.7, 2400, None)]
    m = turn_metrics(silent)
    assert m.ttfa_ms is None and m.voice_to_voice_ms is None and m.underruns == 0
    assert turn_metrics(spoken_turn(responses=[])).status == "no_response"
    assert turn_metrics(spoken_turn(responses=[], timed_out=True)).status == "timed_out"
    pending = spoken_turn()
    pending.responses[0].status = None
    assert turn_metrics(pending).status == "timed_out"


def test_barge_in_over_websocket_cancelled_stopped_or_played_out():
    log = spoken_turn(barge_in=BargeInLog(onset_at=2.0, detected_at=2.15))
    log.responses[0].status = ResponseOutcome.CANCELLED
    log.responses[0].reason = "turn_detected"
    log.responses[0].done_at = 2.17
    m = turn_metrics(log)
    assert m.status == "cancelled" and m.barge_in_kind == "cancelled"
    assert m.barge_in_ms == pytest.approx(170)  # onset 2.0 -> response.done 2.17
    assert m.barge_in_stop_ms == pytest.approx(20)
    assert m.barge_in_audio_stop_ms == pytest.approx(100)  # the last delta arrived at 2.25
    assert m.rtf is None and m.underruns is None  # a reply cut short is not a delivery figure
    # generation had ended (done 2.3); the player (1.76 + 0.5 s + 0.14 s starved) plays until 2.40
    playing = turn_metrics(spoken_turn(barge_in=BargeInLog(onset_at=2.2, detected_at=2.3)))
    assert playing.barge_in_kind == "stopped_playback" and playing.barge_in_ms == pytest.approx(100)
    assert playing.barge_in_stop_ms is None and playing.barge_in_audio_stop_ms is None
    finished = turn_metrics(spoken_turn(barge_in=BargeInLog(onset_at=2.4, detected_at=2.5)))
    assert finished.barge_in_kind == "played_out" and finished.barge_in_ms is None


def test_webrtc_turn_uses_frames_gaps_and_the_track_stop():
    frames = [AudioArrival(1.8 + 0.02 * i, 960, a) for i, a in enumerate([0, 0, None, None, 0, 0])]
    response = ResponseLog("r", 1.6, done_at=1.75, status=ResponseOutcome.INCOMPLETE, audio=frames)
    log = TurnLog(
        0, 0, "a.wav", 0.2, 1.0, sample_rate=48_000, paced_audio=True, speech_stopped_at=1.6, responses=[response]
    )
    m = turn_metrics(log)
    assert m.rtf is None  # paced media: no synthesis speed to see
    assert (m.underruns, m.starved_ms) == (1, pytest.approx(40))
    assert m.audio_ms == pytest.approx(120)
    # the user talks at 1.7, heard at 1.85: the finished reply still playing on the track is cleared at 1.86
    log.barge_in = BargeInLog(onset_at=1.7, detected_at=1.85)
    response.output_cleared_at = 1.86
    m = turn_metrics(log)
    assert m.barge_in_kind == "stopped_playback" and m.barge_in_ms == pytest.approx(160)
    assert m.barge_in_stop_ms is None  # not cancelled: generation had finished
    assert m.barge_in_audio_stop_ms == pytest.approx((1.9 + 0.02 - 1.85) * 1000)
    response.output_cleared_at = None  # no clear: the track played on
    assert turn_metrics(log).barge_in_kind == "not_stopped" and turn_metrics(log).barge_in_ms is None


def test_distribution_percentiles_skip_missing_values():
    values = [None, 10.0, 20.0, 30.0, 40.0, float("nan"), 50.0]
    d = Distribution.of(values)
    assert d.n == 5
    assert (d.p50, d.p90, d.p95) == pytest.approx((30.0, 46.0, 48.0))
    assert d.mean == pytest.approx(30.0) and d.max == 50.0
    empty = Distribution.of([None])
    assert empty.n == 0 and math.isnan(empty.p50)


def test_summary_and_status_counts():
    metrics = [TurnMetrics(0, i, "a", "completed", ttfa_ms=100.0 * (i + 1)) for i in range(4)]
    metrics.append(TurnMetrics(1, 0, "a", "timed_out"))
    summary = summarize(metrics)
    assert summary["ttfa_ms"].n == 4 and summary["ttfa_ms"].p50 == pytest.approx(250)
    assert summary["rtf"].n == 0
    counts = status_counts(metrics)
    assert counts["completed"] == 4 and counts["timed_out"] == 1 and counts["cancelled"] == 0


# --- inputs --------------------------------------------------------------------------------------


def test_energy_bounds_find_a_tone_between_silences():
    rate = 16_000
    t = np.arange(rate) / rate
    pcm = np.concatenate([np.zeros(rate * 3 // 10), 0.3 * np.sin(2 * np.pi * 300 * t), np.zeros(rate // 2)])
    start, end = energy_speech_bounds(pcm + 1e-5 * np.random.default_rng(0).standard_normal(len(pcm)), rate)
    assert start == pytest.approx(300, abs=20) and end == pytest.approx(1300, abs=20)
    assert energy_speech_bounds(np.zeros(rate), rate) is None


def test_speech_folder_uses_the_manifest_else_energy_and_resamples(tmp_path):
    shutil.copy(SPEECH_DIR / "short_joke.wav", tmp_path)
    (tmp_path / "manifest.json").write_text(
        json.dumps({"short_joke.wav": {"speech_start_ms": 300, "speech_end_ms": 1507}})
    )
    rate = 16_000
    t = np.arange(rate // 2) / rate
    tone = np.concatenate([np.zeros(rate // 5), 0.3 * np.sin(2 * np.pi * 200 * t), np.zeros(rate // 5)])
    sf.write(tmp_path / "tone.wav", np.stack([tone, tone], axis=1), rate)  # 16 kHz stereo
    sf.write(tmp_path / "silent.wav", np.zeros(rate), rate)
    sf.write(tmp_path / "long.wav", np.full(rate * 3, 0.1), rate)
    speeches = load_speech_folder(tmp_path, max_seconds=2.9)
    assert [s.name for s in speeches] == ["short_joke.wav", "tone.wav"]  # silent and too long left out
    joke, tone_speech = speeches
    assert (joke.bounds_from, joke.speech_start_ms, joke.speech_end_ms) == ("manifest", 300.0, 1507.0)
    assert tone_speech.bounds_from == "energy"
    assert len(tone_speech.pcm) == pytest.approx(0.9 * RATE, abs=2) and tone_speech.pcm.dtype == np.float32
    assert tone_speech.speech_start_ms == pytest.approx(200, abs=20)
    assert tone_speech.speech_end_ms == pytest.approx(700, abs=20)
    with pytest.raises(SpeechFolderError):
        load_speech_folder(tmp_path / "nowhere")


def test_a_pause_goes_into_the_quietest_frame_in_the_middle_of_the_speech():
    n = RATE  # 1 s of "speech" from 0 to 1000 ms: a tone with one quiet 20 ms gap at 600 ms, another at 100 ms
    pcm = (0.5 * np.sin(2 * np.pi * 200 * np.arange(n) / RATE)).astype(np.float32)
    for gap_ms in (100, 600):
        pcm[gap_ms * 24 : (gap_ms + 20) * 24] *= 0.01
    paused = with_pause(Speech("q.wav", pcm, 0.0, 1000.0, "manifest"), 300)
    at = 610 * 24  # the middle of the gap between 35 % and 65 % of the speech
    assert len(paused.pcm) == n + 300 * 24 and paused.speech_end_ms == 1300.0 and paused.speech_start_ms == 0.0
    assert not paused.pcm[at : at + 300 * 24].any()
    np.testing.assert_array_equal(paused.pcm[:at], pcm[:at])
    np.testing.assert_array_equal(paused.pcm[at + 300 * 24 :], pcm[at:])
    assert paused.name == "q.wav+pause300ms@610"
    with pytest.raises(ValueError):
        with_pause(paused, 0)


def test_microphone_frames_queued_speech_then_silence():
    mic = Microphone()
    assert not mic.next_frame().any()  # idle: silence
    start = mic.queue(np.full(700, 0.5, dtype=np.float32))
    assert start == FRAME_SAMPLES
    first, second, third = mic.next_frame(), mic.next_frame(), mic.next_frame()
    assert first.tolist() == [0.5] * FRAME_SAMPLES
    assert second[: 700 - FRAME_SAMPLES].tolist() == [0.5] * (700 - FRAME_SAMPLES)
    assert not second[700 - FRAME_SAMPLES :].any() and not third.any()
    assert mic.queue(np.ones(10, dtype=np.float32)) == 4 * FRAME_SAMPLES


# --- plans, the scripted user, the reference queue -------------------------------------------------


def speech(name: str, end_ms: float = 50.0, n: int = 2400) -> Speech:
    return Speech(name, np.zeros(n, dtype=np.float32), 0.0, end_ms, "manifest")


def test_user_plans_cycle_files_spread_starts_and_mark_barge_ins():
    files = [speech("a"), speech("b"), speech("c")]
    plan = SweepPlan(levels=(1, 4), turns=2, min_samples=6, barge_in_every=2, ramp_s=1.0)
    assert plan.turns_per_user(1) == 6 and plan.turns_per_user(4) == 2
    plans = user_plans(files, 4, plan)
    assert [p.start_delay_s for p in plans] == [0.0, 0.25, 0.5, 0.75]
    assert [s.name for s in plans[1].speeches] == ["b", "c"]
    assert plans[0].barge_in_turns == frozenset({1})
    with pytest.raises(ValueError):
        SweepPlan(levels=(0,))


class ScriptedLink:
    """A server in a box: every utterance is heard 10 ms after it starts and ends 20 ms after its
    speech ends; the reply is created 5 ms later and streams ``chunks`` deltas of 20 ms audio, one
    every 5 ms, then ``response.done``. Speech during a reply cancels it (turn_detected)."""

    paced_audio = False
    output_rate = RATE

    def __init__(self, chunks: int = 6) -> None:
        self.chunks = chunks
        self.replies = 0
        self.active: asyncio.Task | None = None
        self.tasks: list[asyncio.Task] = []

    async def connect(self, listener) -> None:
        self.listener = listener
        fmt = {"type": "audio/pcm", "rate": RATE}
        session = {
            "audio": {
                "input": {"format": fmt, "turn_detection": {"silence_duration_ms": 20}},
                "output": {"format": fmt},
            }
        }
        self.emit({"type": "session.created", "session": session})

    def emit(self, event: dict) -> None:
        self.listener.on_event(asyncio.get_running_loop().time(), event)

    async def speak(self, pcm: np.ndarray) -> float:
        self.tasks.append(asyncio.create_task(self.hear(len(pcm) / RATE)))
        return asyncio.get_running_loop().time()

    async def hear(self, seconds: float) -> None:
        await asyncio.sleep(0.01)
        self.emit({"type": "input_audio_buffer.speech_started"})
        if self.active is not None and not self.active.done():
            self.active.cancel()
        await asyncio.sleep(seconds + 0.01)
        self.emit({"type": "input_audio_buffer.speech_stopped"})
        self.emit({"type": "input_audio_buffer.committed"})
        self.replies += 1
        self.active = asyncio.create_task(self.reply(f"resp_{self.replies}"))

    async def reply(self, rid: str) -> None:
        self.emit({"type": "response.created", "response": {"id": rid}})
        try:
            for i in range(self.chunks):
                await asyncio.sleep(0.005)
                self.listener.on_audio(asyncio.get_running_loop().time(), loud(480), rid)
                if i == 0:
                    self.emit({"type": "response.output_audio_transcript.delta", "response_id": rid, "delta": "hi"})
        except asyncio.CancelledError:
            self.emit(
                {
                    "type": "response.done",
                    "response": {"id": rid, "status": "cancelled", "status_details": {"reason": "turn_detected"}},
                }
            )
            raise
        self.emit({"type": "response.done", "response": {"id": rid, "status": "completed"}})

    async def close(self) -> None:
        for task in self.tasks + [self.active]:
            if task is not None:
                task.cancel()


async def test_simulated_user_waits_for_playback_and_barges_in():
    # turn 0 is interrupted 10 ms after its first sound by turn 1's speech; turn 1 plays out
    plan = UserPlan(
        0, (speech("a.wav", end_ms=40, n=960), speech("b.wav", end_ms=40, n=960)), barge_in_turns=frozenset({0})
    )
    link = ScriptedLink(chunks=40)  # 40 x 20 ms of audio, 5 ms apart: still streaming when interrupted
    user = SimulatedUser(plan, link, ClientOptions(barge_in_after_ms=10, jitter_ms=10, turn_timeout_s=5))
    async with asyncio.timeout(10):
        logs = await user.run()
    first, second = (turn_metrics(log, jitter_ms=10) for log in logs)
    assert first.status == "cancelled" and logs[0].barge_in.detected_at is not None
    assert first.barge_in_kind == "cancelled"
    assert first.barge_in_stop_ms is not None and 0 <= first.barge_in_stop_ms < 50
    assert first.barge_in_ms > first.barge_in_stop_ms
    assert second.status == "completed" and second.audio_ms == pytest.approx(800)
    assert 0 < second.ttfa_ms < 100 and second.first_transcript_ms == pytest.approx(second.ttfa_ms, abs=5)
    assert second.end_of_turn_ms > 0 and second.voice_to_voice_ms > second.ttfa_ms
    # the user waited until the modelled player finished before leaving
    played = paced_playback(logs[1].response.audio, RATE, 0.01)
    assert asyncio.get_running_loop().time() >= played.end
    assert user.errors == []


class TranscribingLink(ScriptedLink):
    """The scripted server, with input transcription: once the client turned it on, each commit is answered by two
    transcription deltas and a completed transcript."""

    def __init__(self, chunks: int = 6) -> None:
        super().__init__(chunks)
        self.sent: list[dict] = []

    async def send(self, event: dict) -> None:
        self.sent.append(event)

    def emit(self, event: dict) -> None:
        super().emit(event)
        if event["type"] == "input_audio_buffer.committed" and self.sent:
            for delta in ("Hel", "lo"):
                super().emit({"type": "conversation.item.input_audio_transcription.delta", "delta": delta})
            super().emit({"type": "conversation.item.input_audio_transcription.completed", "transcript": "Hello"})


async def test_a_transcribing_user_turns_transcription_on_and_counts_its_events():
    plan = UserPlan(0, (speech("a.wav", end_ms=40, n=960), speech("b.wav", end_ms=40, n=960)))
    link = TranscribingLink(chunks=4)
    user = SimulatedUser(plan, link, ClientOptions(jitter_ms=10, turn_timeout_s=5, transcription=True))
    async with asyncio.timeout(10):
        await user.run()
    (update,) = link.sent
    assert update["type"] == "session.update"
    assert update["session"]["audio"]["input"]["transcription"] == {"model": "whisper-1"}
    assert user.counts == {
        "input_audio_buffer.committed": 2,
        "conversation.item.input_audio_transcription.delta": 4,
        "conversation.item.input_audio_transcription.completed": 2,
        "conversation.item.input_audio_transcription.failed": 0,
    }
    quiet = SimulatedUser(plan, TranscribingLink(chunks=4), ClientOptions(jitter_ms=10, turn_timeout_s=5))
    async with asyncio.timeout(10):
        await quiet.run()
    assert quiet.link.sent == [] and quiet.counts["conversation.item.input_audio_transcription.completed"] == 0


def test_reference_queue_serves_one_at_a_time_in_arrival_order():
    a, b = speech("a", end_ms=1000), speech("b", end_ms=500)
    plans = [UserPlan(0, (a, b)), UserPlan(1, (b,), start_delay_s=0.2)]
    calls = []

    def serve(s: Speech) -> Served:
        calls.append(s.name)
        return Served(seconds=2.0, audio_s=1.0)

    served = serve_one_worker(plans, serve, silence_window_s=0.5)
    # user 1 arrives at 0.2 + 0.5 + 0.5 = 1.2, user 0 at 1.0 + 0.5 = 1.5
    assert [(q.user, q.turn) for q in served] == [(1, 0), (0, 0), (0, 1)]
    assert [q.arrival_s for q in served] == pytest.approx([1.2, 1.5, 3.2 + 2.0 + 1.0 + 0.5 + 0.5])
    assert [q.start_s for q in served] == pytest.approx([1.2, 3.2, 7.2])
    ttfa = [q.metrics().ttfa_ms for q in served]
    assert ttfa == pytest.approx([2000.0, 3700.0, 2000.0])  # user 0 waited 1.7 s behind user 1
    m = served[1].metrics()
    assert m.voice_to_voice_ms == pytest.approx(4200.0) and m.rtf == pytest.approx(2.0) and m.underruns == 0
    assert calls == ["b", "a", "b"]


# --- stage throughput ------------------------------------------------------------------------------


def test_level_throughput_divides_counter_deltas_by_the_window():
    before = EngineCounters(
        10.0,
        thinker_tokens=100,
        talker_tokens=1000,
        audio_samples=240_000,
        decode_steps=500,
        device_memory_bytes=3 << 30,
        device_memory_peak_bytes=4 << 30,
    )
    after = EngineCounters(
        14.0,
        thinker_tokens=140,
        talker_tokens=1400,
        audio_samples=432_000,
        decode_steps=700,
        device_memory_bytes=2 << 30,
        device_memory_peak_bytes=5 << 30,
    )
    t = level_throughput(before, after, "engine")
    assert (t.window_s, t.thinker_tokens, t.talker_tokens, t.decode_steps) == (4.0, 40, 400, 200)
    assert t.thinker_tokens_per_s == pytest.approx(10.0) and t.talker_tokens_per_s == pytest.approx(100.0)
    assert t.audio_s == pytest.approx(8.0) and t.audio_s_per_s == pytest.approx(2.0)  # 192 000 samples at 24 kHz
    assert t.decode_steps_per_s == pytest.approx(50.0) and t.tokens_per_step == pytest.approx(2.2)
    assert (t.device_memory_bytes, t.device_memory_peak_bytes) == (2 << 30, 5 << 30)  # the end's, not deltas
    assert t.replying_s is None and t.talker_tokens_per_replying_s is None
    busy = level_throughput(before, after, "engine", replying_s=2.0)
    assert busy.talker_tokens_per_replying_s == pytest.approx(200.0)
    assert busy.audio_s_per_replying_s == pytest.approx(4.0)
    idle = level_throughput(before, EngineCounters(11.0, 100, 1000, 240_000, 500, 0, 0), "metrics", replying_s=0.0)
    assert idle.tokens_per_step is None and idle.thinker_tokens_per_s == 0.0
    assert idle.thinker_tokens_per_replying_s is None  # no time with a reply in flight
    with pytest.raises(ValueError):
        level_throughput(after, before, "engine")


def test_replying_seconds_is_the_union_of_response_spans():
    def log(*spans) -> TurnLog:
        turn = TurnLog(0, 0, "a", 0.0, 1.0)
        for start, end in spans:
            turn.responses.append(ResponseLog("r", start, done_at=end))
        return turn

    overlapping = [log((1.0, 3.0), (2.5, 4.0)), log((2.0, 2.5)), log((6.0, 7.0))]
    assert replying_seconds(overlapping) == pytest.approx(4.0)  # [1, 4] and [6, 7]
    no_done = TurnLog(0, 1, "a", 0.0, 1.0, responses=[ResponseLog("r", 10.0, audio=[AudioArrival(10.5, 480, 0)])])
    never = TurnLog(0, 2, "a", 0.0, 1.0, responses=[ResponseLog("r", 20.0)])
    assert replying_seconds([no_done, never]) == pytest.approx(0.5) and replying_seconds([]) == 0.0


def test_reference_throughput_is_per_busy_second():
    plans = [UserPlan(0, (speech("a"), speech("b"))), UserPlan(1, (speech("a"),))]
    served = serve_one_worker(
        plans, lambda s: Served(2.0, 1.0, thinker_tokens=8, talker_tokens=50), silence_window_s=0.5
    )
    assert [(q.thinker_tokens, q.talker_tokens) for q in served] == [(8, 50)] * 3
    r = reference_throughput(served)
    assert (r.busy_s, r.thinker_tokens, r.talker_tokens) == (pytest.approx(6.0), 24, 150)
    assert r.thinker_tokens_per_s == pytest.approx(4.0) and r.talker_tokens_per_s == pytest.approx(25.0)
    assert r.audio_s_per_s == pytest.approx(0.5)
    assert reference_throughput([]) is None


async def test_counters_round_trip_through_the_servers_metrics():
    from pipeline.response_events import EngineStats
    from realtime.observe.metrics import Hygiene, ServerMetrics

    metrics = ServerMetrics()
    assert counters_from_metrics(metrics.render().decode()) is None  # nothing before the engine reported
    stats = EngineStats(
        1,
        1,
        0,
        30,
        10,
        0,
        thinker_tokens_total=12,
        talker_tokens_total=345,
        audio_samples_total=96_000,
        decode_steps_total=350,
        device_memory_bytes=(17 << 30) + 5,
        device_memory_peak_bytes=81 << 30,
    )
    metrics.observe_hygiene(Hygiene(1, 3, 9, 0, 0, stats, None))
    text = metrics.render().decode()
    assert "# TYPE omni_realtime_engine_thinker_tokens_total counter" in text
    got = counters_from_metrics(text, at=1.0)
    assert got == EngineCounters(1.0, 12, 345, 96_000, 350, (17 << 30) + 5, 81 << 30)
    assert got == EngineCounters.from_stats(stats, at=1.0)
    assert counters_from_metrics(text.replace("decode_steps", "other")) is None  # one missing: none
    import socket

    with socket.socket() as sock:  # a port nobody listens on: "–" in the report, not a failure
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    assert await scrape_counters(f"ws://127.0.0.1:{port}", timeout_s=2.0) is None


# --- reports and options ----------------------------------------------------------------------------


def level(concurrency: int, ttfa: list[float], with_reference: bool = True) -> LevelResult:
    turns = [
        TurnMetrics(u, 0, "a", "completed", ttfa_ms=t, voice_to_voice_ms=t + 500, rtf=0.5, underruns=0, starved_ms=0.0)
        for u, t in enumerate(ttfa)
    ]
    result = LevelResult(concurrency, 1, 1.0, turns)
    if with_reference:
        result.reference = serve_one_worker(
            [UserPlan(u, (speech("a"),)) for u in range(concurrency)],
            lambda s: Served(1.0, 2.0, 4, 100),
            silence_window_s=0.5,
        )
    return result


def test_report_writes_json_markdown_and_plots(tmp_path):
    from realtime.bench.report import PLOTS, RunInfo, markdown, write_report

    info = RunInfo(
        "omni-realtime bench",
        "today",
        "tiny",
        "CPU",
        "ws",
        "in process",
        4,
        40,
        "fixtures",
        1,
        3,
        "3 turns per user, replies forced to 4 text + 40 codec tokens (0.8 s of audio)",
        "replies of 4 text",
    )
    levels = [level(1, [100.0]), level(2, [120.0, 300.0])]
    paths = write_report(tmp_path, info, levels)
    assert {p.name for p in paths} == {"results.json", "report.md", *PLOTS}
    data = json.loads((tmp_path / "results.json").read_text())  # strict JSON: no NaN
    assert [lv["concurrency"] for lv in data["levels"]] == [1, 2]
    assert data["levels"][1]["summary"]["ttfa_ms"]["p50"] == pytest.approx(210.0)
    assert data["levels"][1]["summary"]["barge_in_stop_ms"]["p50"] is None
    assert data["levels"][1]["reference"]["summary"]["ttfa_ms"]["max"] == pytest.approx(2000.0)
    table = markdown(info, levels)
    assert "| 2 | 2 | 210 / 282 / 291 |" in table
    assert "Workload: 3 turns per user, replies forced to 4 text + 40 codec tokens" in table
    assert "**lighter workload: replies of 4 text**" in table
    assert (data["info"]["turns_per_user"], data["info"]["lighter_workload"]) == (3, "replies of 4 text")
    assert "lighter workload" not in markdown(replace(info, lighter_workload=None), levels)
    assert "TTFA (reference)" in table and "1500 / 1900 / 1950" in table
    for name in PLOTS:
        assert (tmp_path / name).read_bytes()[:4] == b"\x89PNG"
    # input transcription: said in the header; its table counts the events each level received
    assert "input transcription: off." in table and "Input transcription (events" not in table
    levels[0].event_counts = {
        "input_audio_buffer.committed": 3,
        "conversation.item.input_audio_transcription.completed": 3,
        "conversation.item.input_audio_transcription.delta": 17,
    }
    transcribed = markdown(replace(info, transcription=True), levels)
    assert "input transcription: on." in transcribed and "| 1 | 3 | 3 | 0 | 17 |" in transcribed
    assert "| 2 | 0 | 0 | 0 | 0 |" in transcribed
    assert data["levels"][0]["event_counts"] == {}
    no_ref = markdown(info, [level(1, [100.0], with_reference=False)])
    assert "reference" not in no_ref
    # stage throughput: "–" without counters; GiB from bytes, "–" for no device memory (CPU)
    assert data["levels"][0]["throughput"] is None
    assert data["levels"][1]["reference"]["throughput"]["talker_tokens_per_s"] == pytest.approx(100.0)
    assert "| 2 | – | – | – | – | – | – | – | – | 4.0 | 100.0 | 2.00 |" in table
    levels[1].throughput = level_throughput(
        EngineCounters(0.0, 0, 0, 0, 0, 0, 0),
        EngineCounters(2.0, 8, 200, 96_000, 100, 3 << 29, 0),
        "engine",
        replying_s=1.0,
    )
    assert (
        "| 2 | 4.0 / 8.0 | 100.0 / 200.0 | 2.00 / 4.00 | 50 | 50.0 | 2.08 | 1.50 | – | 4.0 | 100.0 | 2.00 |"
        in markdown(info, levels)
    )


def bench_args(*argv: str) -> argparse.Namespace:
    from realtime.bench.cli import build_parser

    return build_parser().parse_args(list(argv))


def test_quick_sets_defaults_that_explicit_flags_override():
    from realtime.bench.cli import _stage_config, resolve_options
    from realtime.bench.models import ReplyLength, reply_length

    quick = resolve_options(bench_args("--quick"))
    assert (quick.levels, quick.turns, quick.barge_in_every, quick.reply_s, quick.warmup_turns) == ((1,), 2, 1, 0.8, 0)
    # --quick's replies are 0.8 s of audio at the family's rate: 40 Qwen2.5-Omni codes
    assert quick.codec_tokens is None and reply_length(_stage_config(quick)) == ReplyLength(4, 40)
    mixed = resolve_options(bench_args("--quick", "--concurrency", "2,8", "--turns", "5", "--codec-tokens", "100"))
    assert (mixed.levels, mixed.turns, mixed.codec_tokens, mixed.text_tokens) == ((2, 8), 5, 100, 4)
    normal = resolve_options(bench_args())
    assert normal.levels == (1, 2, 4) and normal.text_tokens is None and normal.min_samples == 8
    assert normal.turns == 3 and normal.codec_tokens is None  # a conversation, replies of the default length
    assert normal.reply_s == 8.0
    assert normal.preemptive_response_ms == 200 and normal.pause_inside_ms is None  # the server's default
    off = resolve_options(bench_args("--preemptive-response-ms", "off", "--pause-inside-ms", "300"))
    assert (off.preemptive_response_ms, off.pause_inside_ms) == (None, 300.0)
    assert not normal.transcription and resolve_options(bench_args("--transcription")).transcription
    for bad in ("0", "1,x", ""):
        with pytest.raises(ValueError):
            resolve_options(bench_args("--concurrency", bad))


def test_stage_config_forces_reply_lengths():
    from realtime.bench.models import ReplyLength, bench_stage_config, reply_length

    cfg = bench_stage_config(None, device="cpu", length=ReplyLength(4, 40))
    assert reply_length(cfg) == ReplyLength(4, 40) and cfg.talker.device == "cpu"
    assert reply_length(bench_stage_config(None, device=None, length=None)) == ReplyLength(30, 400)  # about 8 s
    packaged = REPO / "pipeline" / "stage_configs" / "qwen2_5_omni.yaml"
    with pytest.raises(ValueError, match="forced reply lengths"):
        reply_length(bench_stage_config(packaged, device=None, length=None))


def test_a_workload_lighter_than_the_default_says_what_is_lighter():
    from realtime.bench.models import ReplyLength, Workload, default_reply_length

    default = Workload(default_reply_length(), 3)
    assert default.length == ReplyLength(30, 400) and default.length.audio_s == 8.0
    assert default.lighter_than(default) is None
    assert Workload(ReplyLength(60, 500), 4).lighter_than(default) is None  # heavier
    assert default.describe() == (
        "3 turns per user, replies forced to 8.0 s of audio (400 codec tokens at 50 a second) and 30 text tokens"
    )
    quick = Workload(ReplyLength(4, 40), 2).lighter_than(default)
    assert quick == (
        "replies of 4 text + 40 codec tokens (0.8 s) instead of 30 + 400 (8.0 s); 2 turns per user instead of 3"
    )
    assert Workload(ReplyLength(30, 100), 3).lighter_than(default).startswith("replies of 30 text + 100 codec")
    assert Workload(ReplyLength(30, 400), 1).lighter_than(default) == "1 turn per user instead of 3"


def test_bench_refuses_bad_options_models_and_servers(tmp_path, capsys):
    import socket

    from realtime.cli.main import main

    assert main(["bench", "--turns", "0", "--out", str(tmp_path)]) == 2
    assert main(["bench", "--pause-inside-ms", "-5", "--out", str(tmp_path)]) == 2
    assert main(["bench", "--wavs", str(tmp_path), "--out", str(tmp_path)]) == 2  # no WAVs there
    assert main(["bench", "--quick", "--model", "random:13b", "--out", str(tmp_path)]) == 2
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    assert main(["bench", "--quick", "--url", f"http://127.0.0.1:{port}", "--no-plots", "--out", str(tmp_path)]) == 1
    errors = capsys.readouterr().err
    assert "turns must be >= 1" in errors and "no .wav files" in errors and "unknown random architecture" in errors
    assert "no session" in errors


# --- end to end ------------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_quick_bench_end_to_end_on_the_tiny_model(tiny_model_dir, tmp_path, capsys):
    """``omni-realtime bench --quick --reference``: a real server, VAD and engine; one user speaks two
    fixtures in real time (the first reply interrupted while it plays: one barge-in, reported with its kind and
    latency), the reference serves the same two turns; the run names the folder it wrote."""
    from realtime.cli.main import main

    wavs = tmp_path / "wavs"
    wavs.mkdir()
    manifest = json.loads((SPEECH_DIR / "manifest.json").read_text())
    for name in ("short_joke.wav", "weather_today.wav"):
        shutil.copy(SPEECH_DIR / name, wavs)
    (wavs / "manifest.json").write_text(json.dumps({k: v for k, v in manifest.items() if (wavs / k).exists()}))
    out = tmp_path / "out"
    status = main(
        [
            "--log-level",
            "WARNING",
            "bench",
            "--quick",
            "--reference",
            "--model",
            str(tiny_model_dir),
            "--wavs",
            str(wavs),
            "--codec-tokens",
            "60",
            "--no-plots",
            "--out",
            str(out),
        ]
    )
    assert status == 0
    data = json.loads((out / "results.json").read_text())
    (lv,) = data["levels"]
    first, second = lv["turns"]
    assert [first["wav"], second["wav"]] == ["short_joke.wav", "weather_today.wav"]
    assert second["status"] == "incomplete"  # forced length: the talker stops at its token cap
    assert second["audio_ms"] == pytest.approx(1200, abs=1)  # 60 codec tokens
    for turn in (first, second):
        assert 0 < turn["ttfa_ms"] < 10_000
        assert turn["voice_to_voice_ms"] > turn["ttfa_ms"]
        assert turn["end_of_turn_ms"] >= 400  # includes the 500 ms VAD silence window (minus a frame)
    assert second["rtf"] > 0 and second["underruns"] is not None
    # one barge-in: the user talked over the first reply while it played, cancelling it if it was still being
    # generated, else stopping its playback (the tiny model on a CPU usually generates faster than it plays)
    assert first["barge_in_kind"] in ("cancelled", "stopped_playback") and second["barge_in_kind"] is None
    assert 0 < first["barge_in_ms"] < 2000
    assert first["rtf"] is None and first["underruns"] is None  # talked over: no delivery figures
    barge = lv["barge_in"]
    assert {kind: entry["count"] for kind, entry in barge.items() if entry["count"]} == {first["barge_in_kind"]: 1}
    assert barge[first["barge_in_kind"]]["ms"]["p50"] == pytest.approx(first["barge_in_ms"])
    assert lv["silence_window_ms"] == 500
    assert [t["audio_s"] for t in lv["reference"]["turns"]] == pytest.approx([1.2, 1.2], abs=0.01)
    assert lv["reference"]["summary"]["ttfa_ms"]["n"] == 2
    assert data["info"]["codec_tokens"] == 60 and data["info"]["text_tokens"] == 4
    # stage throughput over the level (the in-process engine's counters) and the reference's
    t = lv["throughput"]
    assert t["source"] == "engine" and 0 < t["window_s"] <= lv["wall_s"] + 1.0
    assert t["device_memory_bytes"] == 0 and t["device_memory_peak_bytes"] == 0  # CPU
    assert t["thinker_tokens"] > 0 and t["talker_tokens"] > 0 and t["decode_steps"] > 0  # the engine counts
    assert t["thinker_tokens_per_s"] > 0 and t["talker_tokens_per_s"] > 0 and t["audio_s_per_s"] > 0
    assert t["talker_tokens"] <= 2 * 60 and t["thinker_tokens"] <= 2 * 4 + 2  # two replies (one cut short)
    assert 0 < t["replying_s"] == lv["replying_s"] < t["window_s"]
    assert t["talker_tokens_per_replying_s"] > t["talker_tokens_per_s"]
    ref = lv["reference"]["throughput"]
    assert (ref["thinker_tokens"], ref["talker_tokens"]) == (2 * 4, 2 * 60)
    assert ref["talker_tokens_per_s"] > ref["thinker_tokens_per_s"] > 0
    assert ref["audio_s"] == pytest.approx(2.4, abs=0.02)
    report = (out / "report.md").read_text()
    # the reference served one user: a row of the latency table (no columns: no level of more users)
    assert "| transformers reference, 1 user | 2 | " in report and "TTFA (reference)" not in report
    assert "thinker tok/s" in report and "GPU GiB peak" in report
    assert "replies forced to 1.2 s of audio (60 codec tokens at 50 a second) and 4 text tokens" in report
    assert data["info"]["turns_per_user"] == 2
    assert data["info"]["lighter_workload"] == (
        "replies of 4 text + 60 codec tokens (1.2 s) instead of 30 + 400 (8.0 s); 2 turns per user instead of 3"
    )
    assert "**lighter workload: replies of 4 text + 60 codec tokens" in report
    cut = f"1, {first['barge_in_ms']:.0f} / {first['barge_in_ms']:.0f}"
    row = f"| 1 | 1 | {cut} | 0 |" if first["barge_in_kind"] == "cancelled" else f"| 1 | 1 | 0 | {cut} |"
    assert row in report
    printed = capsys.readouterr().out
    assert "| 1 | 2 |" in printed and row in printed
    assert printed.rstrip().endswith(f"Wrote results.json, report.md to {out.resolve()} (the log above is not saved).")
