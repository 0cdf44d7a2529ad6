"""``engine.timeline_path``: the engine's record of its steps, token2wav jobs, audio chunks and responses, written when
it closes, and ``scripts/engine_timeline.py``, which reads it."""

from __future__ import annotations

import json
import logging
import sys

import pytest
import torch
import yaml

from conftest import greedy_stage_config, run_spoken_reply
from pipeline.config import DEFAULT_STAGE_CONFIG, ConfigError, EngineConfig, parse_stage_config
from pipeline.observe.timeline import EngineTimeline
from tests.helpers.paths import REPO

sys.path.insert(0, str(REPO / "scripts"))
import engine_timeline  # noqa: E402


def make_core(tiny_model_dir, timeline_path):
    from dataclasses import replace

    from pipeline.core.engine_core import EngineCore
    from pipeline.models.qwen2_5_omni.checkpoint import load_checkpoint

    cfg = greedy_stage_config(
        thinker={"min_tokens": 6, "max_tokens": 6},
        talker={"min_tokens": 60, "max_tokens": 60},
        token2wav={"worker_thread": "off", "compile": "off"},
    )
    cfg = replace(cfg, engine=EngineConfig(process="off", timeline_path=timeline_path))
    return EngineCore(load_checkpoint(tiny_model_dir), cfg, seed=7)


@torch.inference_mode()
def test_a_reply_leaves_its_steps_jobs_chunks_and_milestones_in_the_timeline(tiny_model_dir, tmp_path) -> None:
    path = tmp_path / "sub" / "timeline.json"
    core = make_core(tiny_model_dir, str(path))
    codes, audio, _ = run_spoken_reply(core)
    assert not path.exists()  # written on close, not before
    core.close()
    timeline = json.loads(path.read_text())
    assert timeline["dropped"] == 0
    events = [e for _, rid, e in timeline["responses"] if rid == "r-a"]
    assert events == ["started", "first_code", "codes_done", "incomplete"]  # max_tokens ends the text: incomplete
    times = [t for t, rid, _ in timeline["responses"]]
    assert times == sorted(times)
    chunks = timeline["chunks"]
    assert [c[2] for c in chunks] == list(range(len(chunks))) and len(chunks) >= 2
    assert sum(c[3] for c in chunks) == pytest.approx(1000.0 * len(audio) / 24000, abs=0.01)
    assert {c[1] for c in chunks} == {"r-a"}
    # inline token2wav: one job per chunk here (one reply), the first one a job of first chunks
    jobs = timeline["jobs"]
    assert len(jobs) == len(chunks) and jobs[0][3] is True and not any(j[3] for j in jobs[1:])
    assert all(j[2] == 1 and j[1] >= 0 for j in jobs)
    steps = timeline["steps"]
    assert sum(s[5] for s in steps) == len(codes) == 60  # max_tokens ends the talker: no stop code
    assert any(s[6] for s in steps) and sum(s[4] for s in steps) < len(codes)  # chains: several codes per row-step
    assert sum(s[3] for s in steps) == 5 and sum(s[2] for s in steps) >= 1  # 6 text tokens, the first from the prefill
    starts = [s[0] for s in steps]
    assert starts == sorted(starts) and all(s[1] >= 0 for s in steps)


def test_the_timeline_keeps_at_most_max_events_and_counts_the_rest(tmp_path) -> None:
    timeline = EngineTimeline(tmp_path / "t.json", max_events=3)
    for i in range(5):
        timeline.response(timeline.origin + i / 1000, f"r{i}", "started")
    timeline.job(timeline.origin, timeline.origin + 0.05, streams=2, first=True)
    timeline.write()
    written = json.loads((tmp_path / "t.json").read_text())
    assert [r[1] for r in written["responses"]] == ["r0", "r1", "r2"]
    assert written["jobs"] == [] and written["dropped"] == 3
    assert written["responses"][1][0] == pytest.approx(1.0)  # ms from the timeline's origin


def test_a_timeline_that_cannot_be_written_is_logged_not_raised(tmp_path, caplog) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    timeline = EngineTimeline(blocker / "t.json")  # a folder where a file is
    with caplog.at_level(logging.ERROR, logger="pipeline.observe.timeline"):
        timeline.write()
    assert "engine timeline not written" in caplog.text


def test_timeline_path_is_an_engine_string_off_by_default() -> None:
    raw = yaml.safe_load(DEFAULT_STAGE_CONFIG.read_text())
    assert parse_stage_config(raw).engine.timeline_path is None
    raw.setdefault("engine", {})["timeline_path"] = "out/timeline.json"
    assert parse_stage_config(raw).engine.timeline_path == "out/timeline.json"
    for bad, message in ((3, "engine.timeline_path has the wrong type"), ("", "must not be empty")):
        raw["engine"]["timeline_path"] = bad
        with pytest.raises(ConfigError, match=message):
            parse_stage_config(raw)


def test_the_script_lists_each_reply_and_the_load_per_window(tmp_path, capsys) -> None:
    path = tmp_path / "t.json"
    path.write_text(
        json.dumps(
            {
                "steps": [[0.0, 10.0, 1, 1, 0, 0, 0], [10.0, 5.0, 0, 1, 2, 2, 0], [250.0, 5.0, 0, 0, 2, 16, 1]],
                "jobs": [[20.0, 50.0, 2, True], [300.0, 80.0, 2, False]],
                "chunks": [
                    [70.0, "r1", 0, 480.0, 0.0],
                    [380.0, "r1", 1, 480.0, 0.0],
                    [70.0, "r2", 0, 200.0, 0.0],
                    [380.0, "r2", 1, 480.0, 110.0],
                ],
                "responses": [
                    [0.0, "r1", "started"],
                    [1.0, "r2", "started"],
                    [12.0, "r1", "first_code"],
                    [900.0, "r1", "completed"],
                ],
                "dropped": 0,
            }
        )
    )
    assert engine_timeline.main([str(path), "--late"]) == 0
    out = capsys.readouterr().out
    assert "2 replies, 1 with a late chunk" in out
    assert "r2 start 1 code - | 70:200 380:480(-110) | codes done -" in out and "r1 start" not in out
    assert engine_timeline.main([str(path)]) == 0
    out = capsys.readouterr().out
    assert "r1 start 0 code 12 | 70:480 380:480(+170) | codes done - completed" in out
    lines = [line for line in out.splitlines() if "steps" in line and "|" in line and "jobs" in line]
    assert len(lines) == 2 and "2 steps" in lines[0] and "20+50/2F" in lines[0] and "300+80/2" in lines[1]
    assert "2 codes" in lines[0] and "16 codes, 1 chains" in lines[1]
    assert engine_timeline.main([str(tmp_path / "missing.json")]) == 2


def test_the_script_shows_when_a_replys_first_audio_was_held(tmp_path, capsys) -> None:
    path = tmp_path / "t.json"
    path.write_text(
        json.dumps(
            {
                "steps": [],
                "jobs": [],
                "chunks": [[400.0, "r1", 0, 480.0, 0.0], [400.0, "r1", 1, 480.0, 0.0]],
                "responses": [
                    [0.0, "r1", "started"],
                    [12.0, "r1", "first_code"],
                    [150.0, "r1", "held"],
                    [900.0, "r1", "completed"],
                ],
                "dropped": 0,
            }
        )
    )
    assert engine_timeline.main([str(path)]) == 0
    assert "r1 start 0 code 12 held 150 | 400:480 400:480(+480) | codes done - completed" in capsys.readouterr().out
