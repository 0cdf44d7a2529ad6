"""``omni-realtime bench --turn-taking --quick`` end to end: the tiny model served in process, the espeak-ng fixtures
spoken by a real WebSocket user, the report written."""

from __future__ import annotations

import json

import pytest

from realtime.bench.turn_fixtures import tools_missing

pytestmark = [
    pytest.mark.slow,  # ~35 s on 2 cores: three sessions and four replies of the tiny model
    pytest.mark.skipif(bool(tools_missing()), reason="needs espeak-ng and sox"),
]


def test_quick_turn_taking_run_measures_all_three_and_passes_turn_detection_through(tmp_path, capsys):
    from realtime.cli.main import main

    argv = ["bench", "--turn-taking", "--quick", "--turn-detection", "server_vad", "--silence-ms", "400"]
    assert main([*argv, "--out", str(tmp_path)]) == 0
    data = json.loads((tmp_path / "turn_taking.json").read_text())
    (setting,) = data["settings"]
    assert setting["label"] == "server_vad 400 ms"
    assert setting["session_turn_detection"][0]["silence_duration_ms"] == 400  # the server took the setting
    assert setting["errors"] == []
    # one complete utterance answered after its end, with the 400 ms wait inside the figure
    assert setting["reply_latency_ms"]["n"] == 1 and setting["reply_latency_ms"]["p50"] > 400
    # a 0.6–1.2 s pause is longer than 400 ms of silence: server VAD takes the turn in it
    assert (setting["pause_trials"], setting["pause_takeovers"]) == (1, 1)
    (pause,) = [t for t in setting["trials"] if t["measure"] == "pause"]
    assert 400 <= pause["taken_ms"] < 1200
    # the one reply talked over was stopped, with a figure
    assert sum(setting["interruptions"].values()) == 1
    assert setting["interruption_stop_ms"]["n"] == 1 and setting["interruption_stop_ms"]["p50"] > 0
    assert data["info"]["lighter_workload"].startswith("--quick")
    out = capsys.readouterr().out
    assert "| server_vad 400 ms |" in out and "turn_taking.json" in out
