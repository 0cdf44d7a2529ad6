"""The token2wav job policy (pipeline/scheduler/token2wav_jobs.py): pure, no engine."""

from __future__ import annotations

import pytest

from pipeline.scheduler.token2wav_jobs import ChunkCandidate, RecentJobs, Token2WavJob, pick_job, split_later_job


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
    with pytest.raises(ConfigError, match="talker.starving_margin_ms only applies to token2wav"):
        parse_stage_config(raw)


def line(fixed_ms: float, per_stream_ms: float):
    return lambda n: fixed_ms + per_stream_ms * n


def test_a_later_chunk_job_is_split_when_its_most_urgent_streams_would_starve_in_it() -> None:
    """The burst of BENCHMARKS.md §23.2: jobs of 16 streams take ~280 ms (85 + 12 per stream here); one stream has
    140 ms in hand, the others 400-500."""
    ahead = [140.0] + [400.0 + 10 * i for i in range(15)]
    # one job of all 16: done at 277 ms, the first stream starves 137 ms; a job of the first 4 is done at 133 ms, in
    # time, the other 12 at 133 + 229 = 362 ms, in time too; so would be 1-3 first, but ties take the larger job
    assert split_later_job(ahead, line(85, 12)) == 4
    ready = [steady(f"s{i}", a) for i, a in enumerate(ahead)]
    assert pick_job(ready, 16, later_job_ms=line(85, 12)) == Token2WavJob(("s0", "s1", "s2", "s3"), urgent=False)
    assert pick_job(ready, 16) == Token2WavJob(tuple(f"s{i}" for i in range(16)), urgent=False)  # not asked: one job
    # three short of time: they go together (one job of three beats three jobs of one)
    assert split_later_job([120.0, 125.0, 130.0] + [600.0] * 13, line(85, 12)) == 3


def test_a_later_chunk_job_stays_whole_unless_splitting_starves_less() -> None:
    assert split_later_job([500.0] * 16, line(85, 12)) == 16  # nobody starves: one job
    # everyone short: a split would only make some run dry for less time and the rest for longer, at the cost of
    # another job's fixed time (the sum of their waits would fall: 3632 -> 3396 ms with 12 first)
    assert split_later_job([50.0] * 16, line(85, 12)) == 16
    # one stream that no job can save: it does not make the others wait
    assert split_later_job([20.0] + [300.0] * 15, line(85, 12)) == 16
    assert split_later_job([100.0], line(85, 12)) == 1
    assert split_later_job([], line(85, 12)) == 0
    assert split_later_job([140.0, 500.0], lambda n: None) == 2  # job times not known yet: one job
    # with a first-chunk candidate at hand and no stream within the margin, first chunks still go first
    assert pick_job([first("new"), steady("a", 300)], 8, starving_margin_ms=250, later_job_ms=line(85, 12)) == (
        Token2WavJob(("new",), urgent=True))


def test_recent_jobs_fit_a_later_chunk_jobs_time_by_its_streams() -> None:
    jobs = RecentJobs(fit_window=4)
    assert jobs.later_job_ms(4) is None  # nothing seen
    jobs.record(first=False, ms=133.0, streams=4)
    jobs.record(first=False, ms=133.0, streams=4)
    assert jobs.later_job_ms(4) is None  # one size: no line yet
    jobs.record(first=True, ms=60.0, streams=8)  # first-chunk jobs are not in the fit
    jobs.record(first=False, ms=277.0, streams=16)
    assert jobs.later_job_ms(16) == pytest.approx(277.0)  # 85 + 12 n through the three points
    assert jobs.later_job_ms(1) == pytest.approx(97.0)
    for _ in range(2):  # the window of 4 keeps one job of 4 and three of 16: still that line
        jobs.record(first=False, ms=277.0, streams=16)
    assert jobs.later_job_ms(4) == pytest.approx(133.0)
    jobs.record(first=False, ms=300.0, streams=16)  # only 16s left: unknown again
    assert jobs.later_job_ms(4) is None
    flat = RecentJobs()
    flat.record(first=False, ms=200.0, streams=2)
    flat.record(first=False, ms=100.0, streams=10)  # a bigger job that happened to be quicker: no falling line
    assert flat.later_job_ms(2) == flat.later_job_ms(10) == pytest.approx(150.0)
    with pytest.raises(ValueError, match="streams"):
        flat.record(first=False, ms=1.0, streams=0)
    with pytest.raises(ValueError, match="window"):
        RecentJobs(fit_window=0)


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


@pytest.mark.parametrize("key", ["starving_margin_from_jobs", "split_later_jobs"])
def test_token2wav_job_switches_are_token2wav_booleans_off_by_default(key: str) -> None:
    import yaml

    from pipeline.config import DEFAULT_STAGE_CONFIG, ConfigError, parse_stage_config

    raw = yaml.safe_load(DEFAULT_STAGE_CONFIG.read_text())
    raw["stages"]["token2wav"].pop(key, None)
    assert getattr(parse_stage_config(raw).token2wav, key) is False  # off unless asked for
    raw["stages"]["token2wav"][key] = "yes"
    with pytest.raises(ConfigError, match=f"token2wav.{key} has the wrong type"):
        parse_stage_config(raw)
    raw["stages"]["token2wav"][key] = True
    assert getattr(parse_stage_config(raw).token2wav, key) is True
    raw["stages"]["thinker"][key] = True
    with pytest.raises(ConfigError, match=f"thinker.{key} only applies to token2wav"):
        parse_stage_config(raw)
