"""scripts/profile_steps.py: the trace summary (host labels only, GPU busy as the union of kernel intervals inside a
step), the profiled steps and the profiler-free step clock on the tiny model, and its ``--timeline`` (the engine's own
timeline, ``engine.timeline_path``)."""

from __future__ import annotations

import json

import pytest

from conftest import load_script

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def profile_steps():
    return load_script("profile_steps")


def event(name, cat, ts, dur):
    return {"ph": "X", "name": name, "cat": cat, "ts": ts, "dur": dur}


def test_the_summary_splits_steps_by_kind_and_counts_each_host_label_once(profile_steps):
    trace = {
        "traceEvents": [
            event("engine.step", "user_annotation", 0, 1000),
            event("thinker.decode", "user_annotation", 10, 100),
            event("talker.decode", "user_annotation", 200, 100),
            event("talker.decode", "gpu_user_annotation", 250, 700),  # the label's GPU-side copy: ignored
            event("k1", "kernel", 100, 300),
            event("k2", "kernel", 300, 200),
            event("k3", "kernel", 900, 300),
            event("engine.step", "user_annotation", 2000, 500),
            event("talker.decode", "user_annotation", 2010, 50),
            event("k4", "kernel", 2100, 100),
        ]
    }
    summary = profile_steps.summarize(trace)
    both, talker = summary["steps"]["thinker+talker"], summary["steps"]["talker only"]
    assert both["count"] == 1 and both["wall_ms_p50"] == 1.0
    assert both["gpu_busy_ms_p50"] == pytest.approx(0.5), "k1 and k2 overlap; k3 counts up to the step's end"
    assert talker["count"] == 1 and talker["gpu_busy_ms_p50"] == pytest.approx(0.1)
    assert summary["labels_count"] == {"talker.decode": 2, "thinker.decode": 1}


def test_a_step_counts_only_the_labels_of_its_own_thread(profile_steps):
    trace = {
        "traceEvents": [
            event("engine.step", "user_annotation", 0, 1000) | {"tid": 1},
            event("talker.decode", "user_annotation", 10, 100) | {"tid": 1},
            event("token2wav.step_many", "user_annotation", 20, 500) | {"tid": 2},  # the token2wav worker's thread
        ]
    }
    summary = profile_steps.summarize(trace)
    assert summary["labels_count"] == {"talker.decode": 1} and summary["steps"]["talker only"]["count"] == 1


def test_the_profiled_steps_carry_the_runners_labels_and_the_levels_counters(profile_steps, tmp_path):
    assert profile_steps.main(["--users", "1", "--codec-tokens", "20", "--out", str(tmp_path)]) == 0
    level = json.loads((tmp_path / "summary.json").read_text())["1"]
    steps = level["steps"]
    assert steps["thinker+talker"]["count"] >= 1 and steps["talker chain"]["count"] >= 1
    counts = level["labels_count"]
    assert counts["thinker.prefill"] >= 1 and counts["thinker.decode"] >= 1 and counts["talker.decode_chain"] >= 1
    # one reply: its first token and its first code sampled on the host, its talker prefilled once
    assert counts["thinker.sample_first"] == counts["talker.sample_first"] == counts["talker.prefill"] == 1
    assert level["counters"]["talker_tokens"] == 20 and level["counters"]["thinker_tokens"] == 10
    assert level["counters"]["talker_chains"] == steps["talker chain"]["count"]
    assert len(level["first_audio_ms"]) == 1 and (tmp_path / "trace_1.json.gz").exists()


def test_the_step_clock_times_each_kind_of_step_without_the_profiler(profile_steps, tmp_path):
    assert profile_steps.main(["--users", "1", "--codec-tokens", "20", "--no-trace", "--out", str(tmp_path)]) == 0
    clock = json.loads((tmp_path / "clock.json").read_text())["1"]
    steps = clock["steps"]  # past its text the talker steps alone, mostly in chains (the packaged talker.chain_steps)
    assert steps["talker chain"]["count"] >= 1 and steps["thinker+talker"]["count"] >= 1
    assert steps["talker chain"]["wall_ms_p50"] > steps["thinker+talker"]["wall_ms_p50"]  # several steps in one
    assert clock["counters"]["talker_chains"] == steps["talker chain"]["count"]
    assert len(clock["first_audio_ms"]) == 1


def test_the_timeline_option_keeps_the_engines_timeline_of_the_spread_asks(profile_steps, tmp_path):
    import yaml

    from pipeline.config import DEFAULT_STAGE_CONFIG

    cfg = {
        "extends": str(DEFAULT_STAGE_CONFIG.parent / "bench_forced.yaml"),
        "stages": {"token2wav": {"worker_thread": "on"}},
    }  # off by default on the CPU
    config = tmp_path / "worker.yaml"
    config.write_text(yaml.safe_dump(cfg))
    timeline = tmp_path / "timeline.json"
    argv = [
        "--users",
        "2",
        "--codec-tokens",
        "20",
        "--no-trace",
        "--spread-ms",
        "150",
        "--timeline",
        str(timeline),
        "--stage-config",
        str(config),
        "--out",
        str(tmp_path),
    ]
    assert profile_steps.main(argv) == 0
    clock = json.loads((tmp_path / "clock.json").read_text())["2"]
    assert len(clock["first_audio_ms"]) == 2
    written = json.loads(timeline.read_text())  # written when the engine closed
    started = [t for t, _, event in written["responses"] if event == "started"]
    assert len(started) == 3, "the warm-up's reply, then the level's two"
    assert started[2] - started[1] >= 70, "user 1 of 2 asks half the spread after user 0"
    jobs = written["jobs"]
    assert jobs and all(ms >= 0 and 1 <= streams <= 2 for _, ms, streams, _ in jobs)
    # a job holds only first chunks or only later ones: each reply's first chunk in exactly one job
    assert sum(streams for _, _, streams, first in jobs if first) == 3
    assert len({rid for _, rid, index, *_ in written["chunks"] if index == 0}) == 3
