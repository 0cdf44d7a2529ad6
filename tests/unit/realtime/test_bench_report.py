"""The bench's report: a figure no turn has reads "n/a" (with the reason) where results.json has null, never
0 or 0.00; the text shows the numbers results.json holds; barge-ins by kind; the run names its output folder,
which git ignores by default."""

from __future__ import annotations

import json
import re
from dataclasses import replace

import pytest

from realtime.bench.metrics import TurnMetrics
from realtime.bench.report import RunInfo, markdown, where_written, write_report
from realtime.bench.sweep import LevelResult
from tests.helpers.paths import REPO


def info(transport: str = "ws") -> RunInfo:
    return RunInfo(
        command="omni-realtime bench --quick",
        date="today",
        model="tiny",
        device="CPU",
        transport=transport,
        server="in process",
        text_tokens=4,
        codec_tokens=40,
        wavs="fixtures",
        torch_threads=1,
        turns_per_user=2,
        workload="2 turns per user",
        lighter_workload=None,
    )


def delivery_row(table: str) -> list[str]:
    """The cells of the delivery table's only row."""
    lines = table.splitlines()
    start = lines.index("Delivery (replies played to their end)")
    return [cell.strip() for cell in lines[start + 4].strip("|").split("|")]


def test_figures_no_turn_has_read_na_with_the_reason_not_zero(tmp_path):
    # every turn was talked over or cancelled: no RTF, no underruns (null in results.json)
    turns = [
        TurnMetrics(0, 0, "a", "cancelled", ttfa_ms=100.0, barge_in_kind="cancelled", barge_in_ms=250.0),
        TurnMetrics(0, 1, "b", "cancelled", ttfa_ms=120.0),
    ]
    levels = [LevelResult(1, 2, 3.0, turns)]
    write_report(tmp_path, info(), levels, plots=False)
    data = json.loads((tmp_path / "results.json").read_text())
    summary = data["levels"][0]["summary"]
    assert summary["rtf"]["p50"] is None and summary["underruns"]["n"] == 0 and summary["starved_ms"]["p95"] is None
    table = markdown(info(), levels)
    # counts of turns read as counts (2 turns, 0 played to their end); figures of no turn read n/a
    assert delivery_row(table) == ["1", "n/a", "2", "0", "n/a", "n/a", "n/a", "cancelled 2"]
    delivery = table[table.index("Delivery") : table.index("Barge-in")]
    assert "0.00" not in delivery and "0 / 0" not in delivery and "| 0 | n/a | n/a | n/a |" in delivery
    assert "RTF n/a: no reply played to its end over the WebSocket" in table
    assert "underruns n/a: no reply played to its end" in table
    webrtc = markdown(info("webrtc"), levels)
    assert "RTF n/a: WebRTC audio is paced by the server in real time" in webrtc


def test_the_text_shows_the_numbers_results_json_holds(tmp_path):
    turns = [
        TurnMetrics(0, 0, "a", "completed", rtf=0.004, underruns=0, starved_ms=0.0),
        TurnMetrics(0, 1, "b", "completed", rtf=0.5, underruns=2, starved_ms=30.0),
        TurnMetrics(0, 2, "c", "cancelled"),  # no delivery figures: left out of both
    ]
    levels = [LevelResult(1, 3, 3.0, turns)]
    write_report(tmp_path, info(), levels, plots=False)
    summary = json.loads((tmp_path / "results.json").read_text())["levels"][0]["summary"]
    assert summary["rtf"]["n"] == 2 and summary["underruns"]["n"] == 2
    row = delivery_row(markdown(info(), levels))
    p50, p90 = (float(x) for x in row[1].split(" / "))
    assert p50 == pytest.approx(summary["rtf"]["p50"], abs=0.005) and p90 == pytest.approx(
        summary["rtf"]["p90"], abs=0.005
    )
    # turns, played to their end, with underruns, underruns, starved: all over the level's 3 turns
    assert row[2:8] == ["3", "2", "1", "2", f"{summary['starved_ms']['p95']:.0f}", "completed 2, cancelled 1"]
    assert "n/a" not in row
    # a small RTF never reads as zero
    only_fast = markdown(info(), [LevelResult(1, 1, 1.0, turns[:1])])
    assert delivery_row(only_fast)[1] == "0.004 / 0.004"


def test_forced_lengths_read_as_what_they_are_and_every_count_is_of_the_same_turns():
    """``bench --quick``: two turns, the first talked over during playback, both ended at their forced length
    (``incomplete``): the delivery row counts 2 turns, 1 played to its end, 0 with underruns, and names the
    ``incomplete`` status for what it is; without an incomplete reply no such note."""
    turns = [
        TurnMetrics(0, 0, "a", "incomplete", barge_in_kind="stopped_playback", barge_in_ms=110.0),
        TurnMetrics(0, 1, "b", "incomplete", rtf=0.5, underruns=0, starved_ms=0.0),
    ]
    levels = [LevelResult(1, 2, 3.0, turns)]
    table = markdown(info(), levels)
    assert delivery_row(table)[2:] == ["2", "1", "0", "0", "0", "incomplete (forced length) 2"]
    assert "| 1 | 2 |" in table, "the latency table's turns: the same 2"
    assert "`response.done` status `incomplete` by design; not a failure" in table
    completed = [replace(t, status="completed") for t in turns]
    assert "not a failure" not in markdown(info(), [LevelResult(1, 2, 3.0, completed)])


def test_barge_ins_are_reported_by_kind_in_the_text_and_in_results_json(tmp_path):
    turns = [
        TurnMetrics(0, 0, "a", "cancelled", barge_in_kind="cancelled", barge_in_ms=250.0, barge_in_stop_ms=120.0),
        TurnMetrics(0, 1, "b", "completed", barge_in_kind="stopped_playback", barge_in_ms=110.0),
        TurnMetrics(0, 2, "c", "completed", barge_in_kind="played_out"),
        TurnMetrics(0, 3, "d", "completed", rtf=0.5, underruns=0, starved_ms=0.0),
    ]
    levels = [LevelResult(1, 4, 3.0, turns)]
    write_report(tmp_path, info(), levels, plots=False)
    barge = json.loads((tmp_path / "results.json").read_text())["levels"][0]["barge_in"]
    assert barge["cancelled"]["count"] == 1 and barge["cancelled"]["ms"]["p50"] == 250.0
    assert barge["stopped_playback"]["count"] == 1 and barge["stopped_playback"]["ms"]["p50"] == 110.0
    assert (barge["played_out"]["count"], barge["not_stopped"]["count"], barge["no_reply"]["count"]) == (1, 0, 0)
    table = markdown(info(), levels)
    assert "| 1 | 3 | 1, 250 / 250 | 1, 110 / 110 | 1 / 0 / 0 | 120 / 120 | n/a |" in table
    assert "cancelled while generating" in table and "stopped during playback" in table
    none = markdown(info(), [LevelResult(1, 1, 1.0, turns[3:])])
    assert "Barge-in: no turn talked over a reply" in none and "cancelled while generating" not in none


def test_the_run_names_the_folder_and_files_it_wrote(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    levels = [LevelResult(1, 1, 1.0, [TurnMetrics(0, 0, "a", "completed", ttfa_ms=100.0)])]
    paths = write_report(tmp_path / "out", info(), levels, plots=False)
    line = where_written(tmp_path / "out", paths)
    assert line == f"Wrote results.json, report.md to {tmp_path / 'out'} (the log above is not saved)."
    relative = where_written(type(tmp_path)("out"), paths)
    assert str(tmp_path / "out") in relative  # a relative --out is named in full


def test_the_default_output_folder_is_git_ignored():
    from realtime.bench.cli import DEFAULT_OUT, build_parser

    assert build_parser().parse_args([]).out == DEFAULT_OUT
    ignored = [line.strip() for line in (REPO / ".gitignore").read_text().splitlines()]
    assert not DEFAULT_OUT.is_absolute() and len(DEFAULT_OUT.parts) == 1  # under the directory of the run
    assert any(re.fullmatch(rf"/?{re.escape(DEFAULT_OUT.name)}/?", line) for line in ignored)


def test_the_users_at_the_goal_are_in_the_text_and_in_results_json(tmp_path):
    def level(users: int, ttfa_ms: float, underruns: int = 0) -> LevelResult:
        turns = [TurnMetrics(u, 0, "a", "completed", ttfa_ms=ttfa_ms, underruns=underruns) for u in range(users)]
        return LevelResult(users, 1, 3.0, turns)

    levels = [level(4, 200.0), level(8, 500.0), level(12, 550.0, underruns=1), level(16, 900.0)]
    write_report(tmp_path, info(), levels, plots=False)
    data = json.loads((tmp_path / "results.json").read_text())
    assert data["users_at_goal"] == 8
    assert [lv["meets_goal"] for lv in data["levels"]] == [True, True, False, False]
    assert (
        "**Users at the goal** (p95 first audio ≤ 600 ms after speech_stopped, no turn with underruns): 8; "
        "levels meeting it: 4, 8." in markdown(info(), levels)
    )


def latency_rows(table: str) -> dict[str, list[str]]:
    """The latency table's rows by their first cell (the header's included, under ``users``)."""
    lines = table.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("Latency, ms")) + 2
    rows = {}
    for line in lines[start:]:
        if not line.startswith("|"):
            break
        cells = [cell.strip() for cell in line.strip("|").split("|")]
        rows[cells[0]] = cells[1:]
    return rows


def queued(ttfa_s: float, audio_s: float, users: int = 1) -> list:
    from realtime.bench.reference import QueuedTurn

    return [QueuedTurn(u, 0, "a", 1.0, 1.0, 1.0 + ttfa_s, audio_s, 0.5) for u in range(users)]


def test_the_reference_at_one_user_is_a_row_and_at_more_users_columns():
    from realtime.bench.report import REFERENCE_ROW

    ours = [TurnMetrics(0, t, "a", "incomplete", ttfa_ms=100.0 + t, audio_ms=8000.0) for t in range(2)]
    one = LevelResult(1, 2, 3.0, ours, reference=queued(15.0, 7.9))
    rows = latency_rows(markdown(info(), [one]))
    assert rows["users"] == ["turns", "TTFA", "voice-to-voice", "first transcript", "reply audio s"]
    assert rows["1"][0] == "2" and rows["1"][-1] == "8.0"
    # request -> its only audio: 15 s, its audio 7.9 s; its transcript comes with the audio
    assert rows[REFERENCE_ROW] == [
        "1",
        "15000 / 15000 / 15000",
        "15500 / 15500 / 15500",
        "15000 / 15000 / 15000",
        "7.9",
    ]
    four = LevelResult(4, 1, 3.0, ours, reference=queued(15.0, 7.9, users=4))
    both = markdown(info(), [one, four])
    rows = latency_rows(both)
    assert rows["users"][-2:] == ["TTFA (reference)", "voice-to-voice (reference)"]
    assert rows[REFERENCE_ROW][-2:] == ["–", "–"] and rows["4"][-2] == "15000 / 15000 / 15000"
    assert "request → its only audio" in both
    # the reference only at more users: columns, no row
    assert REFERENCE_ROW not in markdown(info(), [LevelResult(1, 2, 3.0, ours), four])
    assert REFERENCE_ROW not in markdown(info(), [LevelResult(1, 2, 3.0, ours)])


def test_each_level_shows_the_figures_the_issues_must_show():
    """Per level: first audio after speech_stopped p50 / p95, voice-to-voice p50 / p95, turns with underruns, audio
    seconds per second, decode steps per second; and the users at the goal; each once."""
    from realtime.bench.throughput import EngineCounters, level_throughput

    turns = [
        TurnMetrics(u, 0, "a", "incomplete", ttfa_ms=100.0 * (u + 1), voice_to_voice_ms=700.0, underruns=u % 2)
        for u in range(4)
    ]
    level = LevelResult(4, 1, 10.0, turns)
    level.throughput = level_throughput(
        EngineCounters(0.0, 0, 0, 0, 0, 0, 0),
        EngineCounters(10.0, 120, 4000, 24_000 * 30, 700, 0, 0),
        "engine",
        replying_s=5.0,
    )
    table = markdown(info(), [level])
    assert latency_rows(table)["4"][1] == "250 / 370 / 385"  # TTFA p50 / p90 / p95
    assert latency_rows(table)["4"][2] == "700 / 700 / 700"
    assert delivery_row(table)[2:5] == ["4", "4", "2"]  # turns, played to their end, with underruns
    lines = table.splitlines()
    throughput = next(line for line in lines if line.startswith("| 4 | 12.0 / 24.0 |"))
    cells = [cell.strip() for cell in throughput.strip("|").split("|")]
    assert cells[3] == "3.00 / 6.00" and cells[5] == "70.0"  # audio s/s (wall / replying), decode steps/s
    assert "**Users at the goal**" in table and table.count("Users at the goal") == 1
