"""The start buffer (``token2wav.start_buffer_ms``, pipeline/output/start_buffer.py): under load a reply's first
audio is held in the engine until that much is made, then sent at once; otherwise nothing changes."""

from __future__ import annotations

import logging
from dataclasses import replace
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from conftest import greedy_stage_config, start_spoken_reply
from pipeline.core.commands import AppendAudioCommand, CancelResponseCommand, OpenConversationCommand
from pipeline.errors import ConfigError
from pipeline.output.playout import Playout
from pipeline.output.start_buffer import StartBuffer, holds_start
from pipeline.response_events import AudioChunk, ResponseDone, ResponseStatus
from pipeline.step.phases import chunk_candidates

STEP_S = 0.05
"""The fake clock's advance per engine step."""


# -- the pure logic -------------------------------------------------------------------------------
def test_a_start_buffer_holds_chunks_until_the_target_then_hands_all_out_in_order():
    buf = StartBuffer(960)
    assert buf.add("c0", 480) == [] and buf.held_ms == 480
    assert buf.add("c1", 480) == ["c0", "c1"], "the call that reaches the target releases everything, in order"
    assert buf.spent and buf.held == []
    with pytest.raises(RuntimeError, match="already released"):
        buf.add("c2", 480)
    short = StartBuffer(960)
    short.add("only", 300)
    assert short.release() == ["only"] and short.spent, "a reply that ends short of the target gets what it made"
    with pytest.raises(ValueError):
        StartBuffer(0)
    with pytest.raises(ValueError):
        StartBuffer(960).add("c", -1)


def test_a_reply_holds_its_start_only_with_a_buffer_set_and_enough_other_conversations_busy():
    assert holds_start(960, busy_others=16, min_busy=16)
    assert not holds_start(960, busy_others=15, min_busy=16)
    assert not holds_start(None, busy_others=40, min_busy=16)
    with pytest.raises(ValueError):
        holds_start(960, busy_others=1, min_busy=0)


# -- the engine -----------------------------------------------------------------------------------
def make_core(tiny_model_dir, monkeypatch, *, start_buffer_ms, busy=1, codes=100, quick=None, timeline=None):
    import pipeline.core.engine_core
    from pipeline.config import load_stage_config
    from pipeline.core.engine_core import EngineCore
    from pipeline.models.qwen2_5_omni.checkpoint import load_checkpoint

    chunking = load_stage_config().token2wav.settings.chunking | {"quick_first_chunk_frames": quick}
    cfg = greedy_stage_config(
        thinker={"min_tokens": 4, "max_tokens": 4},
        talker={"min_tokens": codes, "max_tokens": codes},
        token2wav={"start_buffer_ms": start_buffer_ms, "start_buffer_busy": busy, "chunking": chunking},
    )
    if timeline is not None:
        cfg = replace(cfg, engine=replace(cfg.engine, timeline_path=str(timeline)))
    clock = [1000.0]
    monkeypatch.setattr(pipeline.core.engine_core.time, "perf_counter", lambda: clock[0])
    core = EngineCore(load_checkpoint(tiny_model_dir), cfg, seed=3)
    core.test_clock = clock
    return core


def user_speaking(core, name: str) -> None:
    """Conversation ``name`` with user audio being streamed in (busy, no response)."""
    core.handle(OpenConversationCommand(name, "You are a test."))
    core.handle(AppendAudioCommand(name, f"{name}-u", np.zeros(1600, np.float32)))


def run(core, events: list) -> list[list]:
    """Step until every response ended; the events each step added."""
    per_step = []
    while core.stats().responses:
        before = len(events)
        core.step()
        core.test_clock[0] += STEP_S
        per_step.append(events[before:])
    return per_step


def audio(events) -> list[AudioChunk]:
    return [e for e in events if isinstance(e, AudioChunk)]


def done(events) -> ResponseDone:
    return next(e for e in events if isinstance(e, ResponseDone))


@pytest.mark.slow
@torch.inference_mode()
def test_under_load_the_first_audio_leaves_with_the_buffer_full_and_is_the_same_audio(
    tiny_model_dir, monkeypatch, caplog, tmp_path
):
    plain = make_core(tiny_model_dir, monkeypatch, start_buffer_ms=None)
    user_speaking(plain, "b")
    expected = start_spoken_reply(plain, "a")
    run(plain, expected)
    assert plain.stats().audio_start_holds_total == 0
    first_plain = audio(expected)[0]
    assert first_plain.duration_ms == 480, "without a buffer the first chunk leaves alone"

    core = make_core(tiny_model_dir, monkeypatch, start_buffer_ms=960, timeline=tmp_path / "t.json")
    user_speaking(core, "b")
    events = start_spoken_reply(core, "a")
    with caplog.at_level(logging.INFO, logger="pipeline.core.engine_core"):
        steps = run(core, events)
    first_step = next(step for step in steps if audio(step))
    assert [c.duration_ms for c in audio(first_step)] == [480, 480], "the first two chunks, sent together"
    chunks = audio(events)
    assert [c.start_sample for c in chunks] == [c.start_sample for c in audio(expected)], "in order, none lost"
    np.testing.assert_array_equal(
        np.concatenate([c.pcm for c in chunks]), np.concatenate([c.pcm for c in audio(expected)])
    )
    timings = done(events).timings
    assert timings.token2wav_first_made_ms < timings.token2wav_first_chunk_ms, "made, then held"
    held_ms = timings.token2wav_first_chunk_ms - timings.token2wav_first_made_ms
    stats = core.stats()
    assert (stats.audio_start_holds_total, stats.audio_start_held_ms_total) == (1, round(held_ms))
    assert stats.audio_underruns_total == 0, "the player started when the audio left"
    line = next(r.getMessage() for r in caplog.records if "response r-a" in r.getMessage())
    assert f"first audio held {held_ms:.0f} ms" in line
    core.close()
    import json

    events_of_a = [e for _, rid, e in json.loads((tmp_path / "t.json").read_text())["responses"] if rid == "r-a"]
    assert events_of_a[:3] == ["started", "first_code", "held"]


@pytest.mark.slow
@torch.inference_mode()
def test_without_enough_busy_conversations_nothing_is_held(tiny_model_dir, monkeypatch):
    core = make_core(tiny_model_dir, monkeypatch, start_buffer_ms=960, busy=2)
    user_speaking(core, "b")  # one busy, two needed
    events = start_spoken_reply(core, "a")
    steps = run(core, events)
    assert [c.duration_ms for c in audio(next(step for step in steps if audio(step)))] == [480]
    timings = done(events).timings
    assert timings.token2wav_first_made_ms == timings.token2wav_first_chunk_ms
    assert core.stats().audio_start_holds_total == 0


@pytest.mark.slow
@torch.inference_mode()
def test_a_reply_shorter_than_the_buffer_gets_all_its_audio_before_its_end(tiny_model_dir, monkeypatch):
    core = make_core(tiny_model_dir, monkeypatch, start_buffer_ms=960, codes=30)  # 600 ms of audio
    user_speaking(core, "b")
    events = start_spoken_reply(core, "a")
    run(core, events)
    chunks = audio(events)
    assert sum(c.duration_ms for c in chunks) == 600
    assert isinstance(events[-1], ResponseDone), "every chunk before the end"
    assert done(events).audio_samples == 600 * 24
    assert core.stats().audio_start_holds_total == 1


@torch.inference_mode()
def test_a_reply_cancelled_while_held_sends_no_audio(tiny_model_dir, monkeypatch):
    core = make_core(tiny_model_dir, monkeypatch, start_buffer_ms=960)
    user_speaking(core, "b")
    events = start_spoken_reply(core, "a")
    r = core.response("r-a")
    while r.audio.start_buffer is None:
        core.step()
    core.handle(CancelResponseCommand("r-a", "turn_detected"))
    run(core, events)
    assert audio(events) == [] and done(events).status is ResponseStatus.CANCELLED
    assert done(events).audio_samples == 0 and r.item.audio_ms == 0
    assert core.stats().audio_start_holds_total == 0


@pytest.mark.slow
@torch.inference_mode()
def test_under_that_load_a_reply_gets_no_quick_first_chunk(tiny_model_dir, monkeypatch):
    core = make_core(tiny_model_dir, monkeypatch, start_buffer_ms=960, quick=24)
    events = start_spoken_reply(core, "a")  # alone: the quick 240-ms chunk, sent at once
    run(core, events)
    assert audio(events)[0].duration_ms == 240 and core.stats().audio_start_holds_total == 0
    user_speaking(core, "b")
    events = start_spoken_reply(core, "c")
    run(core, events)
    assert audio(events)[0].duration_ms == 480 and core.stats().audio_start_holds_total == 1


@torch.inference_mode()
def test_a_held_reply_counts_no_audio_ahead_and_goes_before_first_chunks(tiny_model_dir, monkeypatch):
    """Both have someone waiting; the held one's chunk releases audio now, a first chunk under load only its hold."""
    core = make_core(tiny_model_dir, monkeypatch, start_buffer_ms=960)
    first = SimpleNamespace(audio=SimpleNamespace(first_made_at=None, playout=Playout()))
    held = SimpleNamespace(audio=SimpleNamespace(first_made_at=1000.0, playout=Playout()))
    playing = SimpleNamespace(audio=SimpleNamespace(first_made_at=1000.0, playout=Playout(ends_at=1001.0)))  # 1 s ahead
    ready = [playing, first, held]
    job = core.scheduler.audio_rule().pick(chunk_candidates(ready, core.test_clock[0]))
    assert [ready[i] for i in job.keys] == [held, playing] and not job.urgent


def test_the_stage_config_takes_the_start_buffer_on_token2wav_only():
    from pipeline.config import DEFAULT_STAGE_CONFIG, load_stage_config, parse_stage_config

    cfg = load_stage_config()
    assert (cfg.token2wav.start_buffer_ms, cfg.token2wav.start_buffer_busy) == (960, None), (
        "packaged: 960 ms, max_batch"
    )
    assert cfg.token2wav.starving_margin_from_jobs, "packaged with the start buffer"
    bench = load_stage_config(DEFAULT_STAGE_CONFIG.parent / "bench_forced.yaml").token2wav
    assert (bench.start_buffer_ms, bench.starving_margin_from_jobs) == (960, True)
    raw = {
        "model_family": "qwen2_5_omni",
        "stages": {
            "thinker": {"input": "request"},
            "talker": {"input": "thinker", "connector": "thinker_to_talker"},
            "token2wav": {
                "input": "talker",
                "connector": "talker_to_token2wav",
                "start_buffer_ms": 960,
                "start_buffer_busy": 12,
            },
        },
    }
    assert (parse_stage_config(raw).token2wav.start_buffer_ms, parse_stage_config(raw).token2wav.start_buffer_busy) == (
        960,
        12,
    )
    for bad in (0, -5, True, 1.5):
        raw["stages"]["token2wav"]["start_buffer_ms"] = bad
        with pytest.raises(ConfigError, match="start_buffer_ms must be a positive integer"):
            parse_stage_config(raw)
    raw["stages"]["token2wav"]["start_buffer_ms"] = 960
    raw["stages"]["talker"]["start_buffer_busy"] = 3
    with pytest.raises(ConfigError, match="unknown field 'stages.talker.start_buffer_busy'"):
        parse_stage_config(raw)


def test_the_servers_metrics_export_the_start_holds():
    from pipeline.response_events import EngineStats
    from realtime.observe.metrics import Hygiene, ServerMetrics

    metrics = ServerMetrics()
    stats = EngineStats(1, 1, 0, 30, 10, 0, audio_start_holds_total=4, audio_start_held_ms_total=1500)
    metrics.observe_hygiene(Hygiene(1, 3, 9, 0, 0, stats, None))
    text = metrics.render().decode()
    assert "omni_realtime_engine_audio_start_holds_total 4.0" in text
    assert "omni_realtime_engine_audio_start_held_seconds_total 1.5" in text
