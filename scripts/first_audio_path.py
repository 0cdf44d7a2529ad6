"""Summarize the server's "first audio path" log lines (realtime/first_audio.py): p50 / p95 / max of each hop
segment, in ms, over every response in the log.

    python scripts/first_audio_path.py server.log [--skip 1]

One table row per segment and bench level (the log of ``omni-realtime bench`` marks where each level starts;
the warm-up before the first level is left out). ``--skip N`` leaves out each session's first N responses."""

from __future__ import annotations

import argparse
import re
import sys
from collections import defaultdict

import numpy as np

LINE = re.compile(r"session (\S+) response (\S+) first audio path \(ms\): (.*)$")
LEVEL = re.compile(r"bench level (\d+): ")
"""``omni-realtime bench`` logs this at the start of each level; the lines before the first are the warm-up."""
SEGMENT = re.compile(r"([a-z_]+->[a-z_]+|total) (-?[0-9.]+)")


def parse(lines) -> dict[str, dict[str, list[dict[str, float]]]]:
    """Bench level ("all" for a log without levels, "warm-up" before the first) -> session id -> its
    responses' segments, in log order."""
    levels: dict[str, dict[str, list[dict[str, float]]]] = defaultdict(lambda: defaultdict(list))
    level = "all"
    for line in lines:
        if (marker := LEVEL.search(line)) is not None:
            if level == "all":
                levels["warm-up"] = levels.pop("all", defaultdict(list))
            level = f"{marker[1]} users"
        elif (match := LINE.search(line)) is not None:
            levels[level][match[1]].append({name: float(ms) for name, ms in SEGMENT.findall(match[3])})
    return levels


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
        levels = parse(f)
    levels.pop("warm-up", None)
    if not any(levels.values()):
        print(f"{args.log}: no 'first audio path' lines", file=sys.stderr)
        return 1
    print("| level | segment | n | p50 ms | p95 ms | max ms |\n|---|---|---:|---:|---:|---:|")
    for level, sessions in levels.items():
        for name, v in summarize(sessions, args.skip).items():
            print(f"| {level} | {name} | {len(v)} | {np.percentile(v, 50):.1f} | {np.percentile(v, 95):.1f} "
                  f"| {v.max():.1f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
