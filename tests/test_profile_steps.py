"""scripts/profile_steps.py: the trace summary (host labels only, GPU busy as the union of kernel intervals inside a
step) and the profiler-free step clock on the tiny model."""

from __future__ import annotations

import json

import pytest

from conftest import load_script


@pytest.fixture(scope="module")
def profile_steps():
    return load_script("profile_steps")


def event(name, cat, ts, dur):
    return {"ph": "X", "name": name, "cat": cat, "ts": ts, "dur": dur}


def test_the_summary_splits_steps_by_kind_and_counts_each_host_label_once(profile_steps):
    trace = {"traceEvents": [
        event("engine.step", "user_annotation", 0, 1000),
        event("thinker.decode", "user_annotation", 10, 100),
        event("talker.decode", "user_annotation", 200, 100),
        event("talker.decode", "gpu_user_annotation", 250, 700),  # the label's GPU-side copy: ignored
        event("k1", "kernel", 100, 300), event("k2", "kernel", 300, 200), event("k3", "kernel", 900, 300),
        event("engine.step", "user_annotation", 2000, 500),
        event("talker.decode", "user_annotation", 2010, 50),
        event("k4", "kernel", 2100, 100),
    ]}  # fmt: skip
    summary = profile_steps.summarize(trace)
    both, talker = summary["steps"]["thinker+talker"], summary["steps"]["talker only"]
    assert both["count"] == 1 and both["wall_ms_p50"] == 1.0
    assert both["gpu_busy_ms_p50"] == pytest.approx(0.5), "k1 and k2 overlap; k3 counts up to the step's end"
    assert talker["count"] == 1 and talker["gpu_busy_ms_p50"] == pytest.approx(0.1)
    assert summary["labels_count"] == {"talker.decode": 2, "thinker.decode": 1}


def test_the_step_clock_times_each_kind_of_step_without_the_profiler(profile_steps, tmp_path):
    assert profile_steps.main(["--users", "1", "--codec-tokens", "20", "--no-trace", "--out", str(tmp_path)]) == 0
    clock = json.loads((tmp_path / "clock.json").read_text())["1"]
    steps = clock["steps"]  # past its text the talker steps alone, mostly in chains (the packaged talker.chain_steps)
    assert steps["talker chain"]["count"] >= 1 and steps["thinker+talker"]["count"] >= 1
    assert steps["talker chain"]["wall_ms_p50"] > steps["thinker+talker"]["wall_ms_p50"]  # several steps in one
    assert len(clock["first_audio_ms"]) == 1


def test_the_timeline_spreads_the_asks_and_lists_the_token2wav_worker_jobs(profile_steps, tmp_path):
    import yaml

    from pipeline.config import DEFAULT_STAGE_CONFIG

    cfg = {"extends": str(DEFAULT_STAGE_CONFIG.parent / "bench_forced.yaml"),
           "stages": {"token2wav": {"worker_thread": "on"}}}  # off by default on the CPU
    config = tmp_path / "worker.yaml"
    config.write_text(yaml.safe_dump(cfg))
    argv = ["--users", "2", "--codec-tokens", "20", "--no-trace", "--timeline", "--spread-ms", "150",
            "--stage-config", str(config), "--out", str(tmp_path)]  # fmt: skip
    assert profile_steps.main(argv) == 0
    clock = json.loads((tmp_path / "clock.json").read_text())["2"]
    first, second = clock["asked_ms"]
    assert first == 0 and second >= 70, "user 1 of 2 asks half the spread after user 0"
    jobs = clock["token2wav_jobs"]
    assert all(ms > 0 and 1 <= streams <= 2 and 0 <= firsts <= streams for _, ms, streams, firsts in jobs)
    assert sum(firsts for *_, firsts in jobs) == 2, "each reply's first chunk in exactly one job"
    assert len(clock["first_audio_by_user"]) == 2 and None not in clock["first_audio_by_user"]
