"""The token2wav job policy (pipeline/scheduler/token2wav_jobs.py): pure, no engine."""

from __future__ import annotations

import pytest

from pipeline.scheduler.token2wav_jobs import ChunkCandidate, RecentJobs, Token2WavJob, pick_job


def steady(key: str, ahead_ms: float) -> ChunkCandidate:
    return ChunkCandidate(key, first=False, audio_ahead_ms=ahead_ms)


def first(key: str) -> ChunkCandidate:
    return ChunkCandidate(key, first=True)


def test_nothing_ready_is_no_job() -> None:
    assert pick_job([], 8) is None


def test_first_chunks_run_alone_and_urgent() -> None:
    job = pick_job([steady("a", 300), first("b"), steady("c", 50), first("d")], 8)
    assert job == Token2WavJob(("b", "d"), urgent=True)


def test_steady_chunks_least_audio_ahead_first_one_batch_at_most() -> None:
    job = pick_job([steady("a", 900), steady("b", 100), steady("c", 500), steady("d", 100)], 3)
    assert job == Token2WavJob(("b", "d", "c"), urgent=False)  # ties keep the callers' order


def test_a_starving_stream_outranks_first_chunks() -> None:
    job = pick_job([first("new"), steady("late", -40), steady("fine", 800)], 8)
    assert job == Token2WavJob(("late", "fine"), urgent=False)
    # at exactly 0 ms ahead the first chunk still goes first
    assert pick_job([steady("edge", 0.0), first("new")], 8) == Token2WavJob(("new",), urgent=True)


def test_a_stream_within_the_margin_of_starving_outranks_first_chunks() -> None:
    ready = [first("new"), steady("low", 180), steady("fine", 800)]
    assert pick_job(ready, 8) == Token2WavJob(("new",), urgent=True)
    # waiting for the first chunk's job and then its own, "low" would run dry: with a 250 ms margin it goes first
    assert pick_job(ready, 8, starving_margin_ms=250) == Token2WavJob(("low", "fine"), urgent=False)
    # at exactly the margin the first chunk still goes first
    assert pick_job([steady("edge", 250), first("new")], 8, starving_margin_ms=250) == Token2WavJob(("new",), True)
    with pytest.raises(ValueError, match="starving_margin_ms"):
        pick_job(ready, 8, starving_margin_ms=-1)


def test_starving_margin_ms_is_a_token2wav_setting_of_zero_or_more() -> None:
    import yaml

    from pipeline.config import DEFAULT_STAGE_CONFIG, ConfigError, parse_stage_config

    raw = yaml.safe_load(DEFAULT_STAGE_CONFIG.read_text())
    assert parse_stage_config(raw).token2wav.starving_margin_ms >= 0
    raw["stages"]["token2wav"]["starving_margin_ms"] = -5
    with pytest.raises(ConfigError, match="token2wav.starving_margin_ms must be an integer >= 0"):
        parse_stage_config(raw)
    raw["stages"]["token2wav"]["starving_margin_ms"] = 200
    assert parse_stage_config(raw).token2wav.starving_margin_ms == 200
    raw["stages"]["talker"]["starving_margin_ms"] = 200
    with pytest.raises(ConfigError, match="unknown field 'stages.talker.starving_margin_ms'"):
        parse_stage_config(raw)


def test_first_chunks_beyond_one_batch_wait_in_order() -> None:
    job = pick_job([first(k) for k in "abcde"], 2)
    assert job == Token2WavJob(("a", "b"), urgent=True)


def test_the_batch_bound_must_be_positive() -> None:
    with pytest.raises(ValueError, match="max_streams"):
        pick_job([first("a")], 0)


def test_recent_jobs_give_the_longest_first_chunk_job_plus_the_longest_later_one() -> None:
    jobs = RecentJobs(window=3)
    assert jobs.starving_margin_ms(250) == 250  # nothing seen: the floor
    jobs.record(first=False, ms=180.0)
    assert jobs.starving_margin_ms(100) == 180  # no first-chunk job yet: it counts 0
    for ms in (120.0, 90.0, 60.0):
        jobs.record(first=True, ms=ms)
    assert jobs.starving_margin_ms(100) == 300  # 120 + 180
    jobs.record(first=True, ms=40.0)  # the 120 ms job leaves the window of 3
    assert jobs.starving_margin_ms(100) == 270  # 90 + 180
    assert jobs.starving_margin_ms(400) == 400  # the floor when the jobs are quick
    with pytest.raises(ValueError, match="ms must be >= 0"):
        jobs.record(first=True, ms=-1.0)
    with pytest.raises(ValueError, match="window"):
        RecentJobs(window=0)


@pytest.mark.parametrize("key", ["starving_margin_from_jobs"])
def test_token2wav_job_switches_are_token2wav_booleans(key: str) -> None:
    import yaml

    from pipeline.config import DEFAULT_STAGE_CONFIG, ConfigError, parse_stage_config

    raw = yaml.safe_load(DEFAULT_STAGE_CONFIG.read_text())
    raw["stages"]["token2wav"][key] = False
    assert getattr(parse_stage_config(raw).token2wav, key) is False
    raw["stages"]["token2wav"][key] = "yes"
    with pytest.raises(ConfigError, match=f"token2wav.{key} has the wrong type"):
        parse_stage_config(raw)
    raw["stages"]["token2wav"][key] = True
    assert getattr(parse_stage_config(raw).token2wav, key) is True
    raw["stages"]["thinker"][key] = True
    with pytest.raises(ConfigError, match=f"unknown field 'stages.thinker.{key}'"):
        parse_stage_config(raw)
