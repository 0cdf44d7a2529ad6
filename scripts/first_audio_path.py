"""Summarize the server's "first audio path" log lines (realtime/observe/first_audio.py): p50 / p95 / max of each hop
segment, in ms, over every response in the log.

    python scripts/first_audio_path.py server.log [--skip 1]

One table row per segment and bench level (the log of ``omni-realtime bench`` marks where each level starts;
the warm-up before the first level is left out). ``--skip N`` leaves out each session's first N responses.
Replies started on a pause (``--preemptive-response-ms``) are counted per level, shown or withdrawn; a withdrawn
reply's segments are left out (the client never waited for it)."""

from __future__ import annotations

import argparse
import re
import sys
from collections import defaultdict

import numpy as np

LINE = re.compile(r"session (\S+) response (\S+)(?: \((preemptive(?:, withdrawn)?)\))? first audio path \(ms\): (.*)$")
LEVEL = re.compile(r"bench level (\d+): ")
"""``omni-realtime bench`` logs this at the start of each level; the lines before the first are the warm-up."""
SEGMENT = re.compile(r"([a-z_]+->[a-z_]+|total) (-?[0-9.]+)")


def _entries(lines):
    """(bench level, session id, kind, segments) per first-audio line, kind "" or "preemptive" or "preemptive,
    withdrawn"; level "all" in a log without level markers, "warm-up" before the first one."""
    lines = list(lines)
    level = "warm-up" if any(LEVEL.search(line) for line in lines) else "all"
    for line in lines:
        if (marker := LEVEL.search(line)) is not None:
            level = f"{marker[1]} users"
        elif (match := LINE.search(line)) is not None:
            yield level, match[1], match[3] or "", {name: float(ms) for name, ms in SEGMENT.findall(match[4])}


def parse(lines) -> dict[str, dict[str, list[dict[str, float]]]]:
    """Bench level ("all" for a log without levels, "warm-up" before the first) -> session id -> its
    responses' segments, in log order (withdrawn preemptive replies left out)."""
    levels: dict[str, dict[str, list[dict[str, float]]]] = defaultdict(lambda: defaultdict(list))
    for level, session, kind, segments in _entries(lines):
        if not kind.endswith("withdrawn"):
            levels[level][session].append(segments)
    return levels


def preemptive_counts(lines) -> dict[str, dict[str, int]]:
    """Bench level -> {"shown": n, "withdrawn": n} for the levels with preemptive replies (warm-up left out)."""
    counts: dict[str, dict[str, int]] = defaultdict(lambda: {"shown": 0, "withdrawn": 0})
    for level, _, kind, _ in _entries(lines):
        if kind and level != "warm-up":
            counts[level]["withdrawn" if kind.endswith("withdrawn") else "shown"] += 1
    return dict(counts)


def summarize(sessions: dict[str, list[dict[str, float]]], skip: int) -> dict[str, np.ndarray]:
    values: dict[str, list[float]] = defaultdict(list)
    for responses in sessions.values():
        for segments in responses[skip:]:
            for name, ms in segments.items():
                values[name].append(ms)
    return {name: np.asarray(v) for name, v in values.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("log")
    parser.add_argument("--skip", type=int, default=0, help="responses left out at the start of each session")
    args = parser.parse_args(argv)
    with open(args.log, encoding="utf-8", errors="replace") as f:
        lines = f.readlines()
    levels = parse(lines)
    levels.pop("warm-up", None)
    if not any(levels.values()):
        print(f"{args.log}: no 'first audio path' lines", file=sys.stderr)
        return 1
    print("| level | segment | n | p50 ms | p95 ms | max ms |\n|---|---|---:|---:|---:|---:|")
    for level, sessions in levels.items():
        for name, v in summarize(sessions, args.skip).items():
            print(
                f"| {level} | {name} | {len(v)} | {np.percentile(v, 50):.1f} | {np.percentile(v, 95):.1f} "
                f"| {v.max():.1f} |"
            )
    if counts := preemptive_counts(lines):
        print("\n| level | preemptive replies shown | withdrawn |\n|---|---:|---:|")
        for level, n in counts.items():
            print(f"| {level} | {n['shown']} | {n['withdrawn']} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
