"""The turn-taking benchmark's measures on scripted client timelines (pure: no server, no audio)."""

from __future__ import annotations

import json
import math
import tempfile
from pathlib import Path

import numpy as np
import pytest

from realtime.bench.metrics import AudioArrival, BargeInLog, ResponseLog, ResponseOutcome, TurnLog
from realtime.bench.turn_bench import render_trials, trial_pairs, turn_settings
from realtime.bench.turn_fixtures import SENTENCES, VOICES, render, tools_missing, write_folder
from realtime.bench.turn_measures import interruption_stop, measure, pause_takeover_at, reply_latency_ms
from realtime.bench.turn_report import TurnRunInfo, markdown, write_report
from realtime.protocol.codes import StatusReason

RATE = 24_000


def reply(rid: str, created: float, first_audio: float, *, status="completed", reason=None, chunks=10, gap=0.0):
    """A reply whose audio arrives from ``first_audio`` on: ``chunks`` 100 ms deltas ``gap`` s apart, all sound but
    the first, which is sound from its 240th sample (10 ms in)."""
    audio = [AudioArrival(first_audio + i * gap, RATE // 10, 240 if i == 0 else 0) for i in range(chunks)]
    done = audio[-1].at + 0.01
    return ResponseLog(rid, created, audio=audio, done_at=done, status=ResponseOutcome(status), reason=reason)


def test_reply_latency_runs_from_the_real_end_of_speech_to_the_first_sound_playing():
    log = TurnLog(0, 0, "a", 0.3, 2.0, speech_stopped_at=2.55, responses=[reply("r", 2.56, 2.8)])
    assert reply_latency_ms(log) == pytest.approx(810.0)  # 2.8 + 10 ms into the chunk − 2.0
    assert reply_latency_ms(TurnLog(0, 0, "a", 0.3, 2.0, speech_stopped_at=2.55)) is None


def test_a_server_that_waits_through_the_pause_does_not_take_the_turn():
    # pause 1.0–1.8 s, speech ends at 3.0 s; the only speech_stopped and reply come after the end
    log = TurnLog(0, 0, "p", 0.3, 3.0, speech_stopped_at=3.5, first_speech_stopped_at=3.5)
    log.responses.append(reply("r", 3.51, 3.9))
    assert pause_takeover_at(log) is None


def test_a_speech_stopped_or_reply_inside_the_pause_takes_the_turn():
    stopped = TurnLog(0, 0, "p", 0.3, 3.0, speech_stopped_at=3.5, first_speech_stopped_at=1.55)
    assert pause_takeover_at(stopped) == pytest.approx(1.55)
    # no speech_stopped seen, but a reply created and sounding before the end (cancelled when the user went on)
    early = TurnLog(0, 0, "p", 0.3, 3.0)
    early.responses += [
        reply("r1", 1.7, 1.9, status="cancelled", reason=StatusReason.TURN_DETECTED),
        reply("r2", 3.5, 3.8),
    ]
    assert pause_takeover_at(early) == pytest.approx(1.7)


def test_interruption_stop_is_onset_to_cancellation_or_to_playback_stop():
    # still generating (deltas 100 ms apart) when the user speaks at 1.3 s: cancelled, done at 1.52 s
    cancelled = reply("r", 0.5, 0.6, status="cancelled", reason=StatusReason.TURN_DETECTED, chunks=5, gap=0.1)
    cancelled.done_at = 1.52
    log = TurnLog(0, 0, "a", 0.1, 0.4, speech_stopped_at=0.5, responses=[cancelled])
    log.barge_in = BargeInLog(onset_at=1.3, detected_at=1.5)
    kind, ms = interruption_stop(log, jitter_ms=60)
    assert kind.value == "cancelled" and ms == pytest.approx(220.0)
    # generated at once (1 s of audio), still playing at the client: the speech_started stops it
    played = TurnLog(0, 0, "a", 0.1, 0.4, speech_stopped_at=0.5, responses=[reply("r", 0.5, 0.6)])
    played.barge_in = BargeInLog(onset_at=0.9, detected_at=1.15)
    kind, ms = interruption_stop(played, jitter_ms=60)
    assert kind.value == "stopped_playback" and ms == pytest.approx(250.0)
    # the reply had finished playing (ends 0.6 + 0.06 + 1.0 s) before the user spoke: nothing to stop
    late = TurnLog(0, 0, "a", 0.1, 0.4, speech_stopped_at=0.5, responses=[reply("r", 0.5, 0.6)])
    late.barge_in = BargeInLog(onset_at=1.8, detected_at=2.0)
    kind, ms = interruption_stop(late, jitter_ms=60)
    assert kind.value == "played_out" and ms is None
    with pytest.raises(ValueError, match="not talked over"):
        interruption_stop(TurnLog(0, 1, "b", 0.1, 0.4))


def test_measure_summarizes_each_kind_of_trial():
    latency = [
        TurnLog(0, 0, f"c{i}", 0.3, 2.0, speech_stopped_at=2.5, responses=[reply("r", 2.5, 2.0 + s)])
        for i, s in enumerate((0.59, 0.69, 0.79))
    ]
    taken = TurnLog(0, 0, "p0", 0.3, 3.0, first_speech_stopped_at=1.6, speech_stopped_at=3.5)
    waited = TurnLog(0, 0, "p1", 0.3, 3.0, first_speech_stopped_at=3.5, speech_stopped_at=3.5)
    first = TurnLog(0, 0, "c0", 0.3, 0.4, speech_stopped_at=0.5, responses=[reply("r", 0.5, 0.6)])
    first.barge_in = BargeInLog(onset_at=0.9, detected_at=1.15)
    last = TurnLog(0, 1, "c1", 1.2, 2.0, speech_stopped_at=2.5, responses=[reply("r2", 2.5, 2.7)])
    result = measure("server_vad 500 ms", {"type": "server_vad"}, latency, [(taken, 1.0), (waited, 1.0)], [first, last])
    assert result.reply_latency_ms.n == 3 and result.reply_latency_ms.p50 == pytest.approx(700.0)
    assert (result.pause_trials, result.pause_takeovers, result.takeover_share) == (2, 1, 0.5)
    assert result.interruption_stop_ms.n == 1 and result.interruption_stop_ms.p50 == pytest.approx(250.0)
    assert result.interruptions["stopped_playback"] == 1 and sum(result.interruptions.values()) == 1
    pauses = [t for t in result.trials if t["measure"] == "pause"]
    assert pauses[0]["taken_ms"] == pytest.approx(600.0) and pauses[1]["taken_ms"] is None
    empty = measure("none", {}, [], [], [])
    assert math.isnan(empty.takeover_share) and empty.reply_latency_ms.n == 0


def test_the_report_has_one_row_per_setting_and_strict_json(tmp_path):
    info = TurnRunInfo("omni-realtime bench --turn-taking", "today", "m", "cpu", "ws", "in process", 2, "1 s", "f")
    taken = TurnLog(0, 0, "p0", 0.3, 3.0, first_speech_stopped_at=1.6)
    results = [measure("server_vad 500 ms", {"type": "server_vad"}, [], [(taken, 1.0)], [])]
    results.append(measure("x", {}, [], [], []))
    text = markdown(info, results)
    assert "| server_vad 500 ms | – / – (n=0) | 1.00 (1/1) | – / – (n=0) | 0 / 0 / 0 |" in text
    assert "| x | – / – (n=0) | – |" in text
    json_path, _ = write_report(tmp_path, info, results)
    data = json.loads(json_path.read_text())
    assert data["settings"][0]["takeover_share"] == 1.0 and data["settings"][1]["takeover_share"] is None


def test_settings_pass_the_turn_detection_through_and_refuse_nonsense():
    server, semantic = turn_settings(["server_vad", "semantic_vad"], silence_ms=500, eagerness="low")
    assert server.turn_detection == {"type": "server_vad", "silence_duration_ms": 500}
    assert semantic.turn_detection == {"type": "semantic_vad", "eagerness": "low"}
    for bad in (dict(types=["vad"]), dict(types=["server_vad", "server_vad"]), dict(eagerness="eager")):
        with pytest.raises(ValueError):
            turn_settings(**({"types": ["server_vad"], "silence_ms": 500, "eagerness": "auto"} | bad))


def test_trials_cover_every_sentence_before_repeating_and_every_voice():
    pairs = trial_pairs(len(SENTENCES) * 2)
    assert {s for s, _ in pairs[: len(SENTENCES)]} == set(SENTENCES)
    assert {v for _, v in pairs} == set(VOICES)
    assert pairs[0] != pairs[len(SENTENCES)]  # the second round shifts the voices
    with pytest.raises(ValueError):
        trial_pairs(0)


def test_turn_options_without_turn_taking_are_refused(capsys):
    from realtime.bench.cli import main

    assert main(["--silence-ms", "300"]) == 2
    assert "--turn-taking" in capsys.readouterr().err


@pytest.mark.skipif(bool(tools_missing()), reason="needs espeak-ng and sox (apt-get install espeak-ng sox)")
def test_trials_read_from_a_written_folder_equal_the_rendered_ones(tmp_path):
    """``--turn-fixtures``: clips rendered on one machine, played on another; 16-bit storage is the only loss."""
    rendered = render_trials(2)
    pairs = trial_pairs(2)
    with tempfile.TemporaryDirectory() as work:
        clips = [clip for sentence, voice in pairs for clip in render(sentence, voice, Path(work))]
    write_folder(clips, tmp_path / "clips")
    read = render_trials(2, fixtures=tmp_path / "clips")
    assert read.pause_start_ms == rendered.pause_start_ms
    for mine, theirs in zip(read.complete + read.paused, rendered.complete + rendered.paused, strict=True):
        assert mine.name == theirs.name and len(mine.pcm) == len(theirs.pcm)
        assert float(np.abs(mine.pcm - theirs.pcm).max()) < 2e-3  # int16 storage, then the same resampler
    with pytest.raises(ValueError, match="lacks the clips"):
        render_trials(3, fixtures=tmp_path / "clips")
