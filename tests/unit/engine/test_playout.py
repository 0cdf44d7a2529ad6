"""The engine's model of a real-time player (pipeline/output/playout.py) and the underruns the engine counts by it."""

from __future__ import annotations

import pytest
import torch

from conftest import greedy_stage_config, start_spoken_reply
from pipeline.output.playout import Playout


def test_a_player_starts_on_the_first_chunk_and_plays_in_real_time() -> None:
    player = Playout()
    with pytest.raises(ValueError, match="not started"):
        player.ahead_ms(0.0)
    assert player.deliver(10.0, 0.48) == 0.0  # the first chunk starts it: never late
    assert player.ahead_ms(10.0) == pytest.approx(480.0)
    assert player.ahead_ms(10.3) == pytest.approx(180.0)
    assert player.deliver(10.3, 0.48) == 0.0  # in time: appended
    assert player.ahead_ms(10.3) == pytest.approx(660.0)
    assert (player.underruns, player.starved_ms) == (0, 0.0)


def test_a_late_chunk_is_one_underrun_and_the_player_resumes_on_its_arrival() -> None:
    player = Playout()
    player.deliver(0.0, 0.24)
    assert player.ahead_ms(0.5) == pytest.approx(-260.0)  # waiting for 260 ms
    assert player.deliver(0.5, 0.72) == pytest.approx(260.0)
    # it resumed at 0.5 s: 720 ms ahead then, not 720 - 260
    assert player.ahead_ms(0.5) == pytest.approx(720.0)
    assert player.deliver(1.5, 0.72) == pytest.approx(280.0)
    assert player.underruns == 2 and player.starved_ms == pytest.approx(540.0)
    with pytest.raises(ValueError, match="duration_s"):
        player.deliver(2.0, -0.1)


def test_a_late_chunk_says_where_its_time_went() -> None:
    """Codes ready, job start and arrival of each late chunk, relative to the moment its player ran dry."""
    from pipeline.output.playout import MAX_LATE_CHUNKS

    player = Playout()
    player.chunk_ready(0.0)
    player.job_started(0.0)
    player.deliver(0.1, 0.24)  # the first chunk starts the player at 0.1 s: dry at 0.34 s
    player.chunk_ready(0.2)  # codes in 140 ms before it runs dry
    player.chunk_ready(0.25)  # a later report of the same chunk does not move its ready time
    player.job_started(0.3)
    player.deliver(0.6, 0.48)  # 260 ms late: queued 100 ms, then a 300 ms job
    player.chunk_ready(1.2)  # the talker was late: codes in 120 ms after the player ran dry at 1.08 s
    player.deliver(1.25, 0.48)  # no job reported (inline): counted from the codes
    assert [
        (c.index, round(c.waited_ms), round(c.codes_after_dry_ms), round(c.queued_ms), round(c.job_ms))
        for c in player.late
    ] == [(1, 260, -140, 100, 300), (2, 170, 120, 0, 50)]
    assert str(player.late[0]) == "#1 260 ms late (codes -140 ms from dry, queued 100, job 300)"
    player.deliver(1.7, 0.0)  # in time: nothing noted
    for i in range(MAX_LATE_CHUNKS + 5):
        player.deliver(10.0 + i, 0.1)
    assert len(player.late) == MAX_LATE_CHUNKS and player.underruns == 2 + MAX_LATE_CHUNKS + 5
    assert player.chunks == 4 + MAX_LATE_CHUNKS + 5


def test_the_player_matches_the_benchmark_client_without_its_jitter_buffer() -> None:
    """The same arrivals through realtime/bench/metrics.py's paced_playback (jitter 0) give the same underruns."""
    from realtime.bench.metrics import AudioArrival, paced_playback

    arrivals = [(0.0, 0.28), (0.2, 0.48), (0.9, 0.48), (1.1, 0.72), (2.5, 0.72), (2.6, 0.2)]
    player = Playout()
    for at, seconds in arrivals:
        player.deliver(at, seconds)
    bench = paced_playback(
        [AudioArrival(at=at, samples=round(s * 24_000), first_audible=0) for at, s in arrivals], 24_000, 0.0
    )
    assert bench.underruns == player.underruns == 2
    assert player.starved_ms == pytest.approx(bench.starved_s * 1000)
    assert player.ends_at == pytest.approx(bench.end)


@pytest.mark.slow
@torch.inference_mode()
def test_the_engine_counts_the_underruns_of_a_real_time_player_of_each_reply(tiny_model_dir, monkeypatch, caplog):
    """On the tiny model with a clock the test moves: while it stands still every chunk is in time; when each engine
    step takes 2 s of it, every chunk after the first is late (none holds 2 s of audio), and the counters, the stats
    and the response's log line say so."""
    import logging

    import pipeline.core.engine_core
    from pipeline.core.engine_core import EngineCore
    from pipeline.models.qwen2_5_omni.checkpoint import load_checkpoint
    from pipeline.response_events import AudioChunk

    cfg = greedy_stage_config(thinker={"min_tokens": 4, "max_tokens": 4}, talker={"min_tokens": 100, "max_tokens": 100})
    core = EngineCore(load_checkpoint(tiny_model_dir), cfg, seed=3)
    clock = [1000.0]
    monkeypatch.setattr(pipeline.core.engine_core.time, "perf_counter", lambda: clock[0])

    def run(name: str, seconds_per_step: float) -> list[AudioChunk]:
        events = start_spoken_reply(core, name)
        while core.stats().responses:
            core.step()
            clock[0] += seconds_per_step
        return [e for e in events if isinstance(e, AudioChunk)]

    assert len(run("a", 0.0)) >= 3
    assert (core.stats().audio_underruns_total, core.stats().audio_starved_ms_total) == (0, 0)
    with caplog.at_level(logging.INFO, logger="pipeline.core.engine_core"):
        chunks = run("b", 2.0)
    late = len(chunks) - 1
    assert late >= 2 and core.stats().audio_underruns_total == late
    # each late chunk came at least one 2 s step after the one before, which held under 2 s of audio
    assert core.stats().audio_starved_ms_total >= late * (2000 - 1000 * max(len(c.pcm) for c in chunks) / 24_000)
    stats = core.stats()
    assert (stats.audio_underruns_total, stats.audio_starved_ms_total) == (
        core.stats().audio_underruns_total,
        core.stats().audio_starved_ms_total,
    )
    line = next(r.getMessage() for r in caplog.records if "response r-b" in r.getMessage())
    assert f"{late} underruns" in line and "(#1 " in line and f"#{late} " in line  # each late chunk, by number


def test_the_servers_metrics_export_the_engines_underruns() -> None:
    from pipeline.response_events import EngineStats
    from realtime.observe.metrics import Hygiene, ServerMetrics

    metrics = ServerMetrics()
    stats = EngineStats(1, 1, 0, 30, 10, 0, audio_underruns_total=3, audio_starved_ms_total=1250)
    metrics.observe_hygiene(Hygiene(1, 3, 9, 0, 0, stats, None))
    text = metrics.render().decode()
    assert "omni_realtime_engine_audio_underruns_total 3.0" in text
    assert "omni_realtime_engine_audio_starved_seconds_total 1.25" in text
