"""Replay engine timelines with each reply's player started only once B ms of its audio had been made (BENCHMARKS.md
§26.1): how many players would still run dry, and what the hold adds to the first audio. The chunks keep the times
they had (no feedback on the schedule), so this estimates, it does not measure.

    python replay_hold.py ../gpu-7b-h100-s21/*/l-*.json
"""

import json
import statistics
import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))  # the repository root: pipeline.playout
from pipeline.playout import Playout  # noqa: E402


def replay(path: str, hold_ms: float) -> tuple[int, float, float]:
    """(replies that ran dry, hold p50 ms, first audio p50 ms after the response started)."""
    timeline = json.load(open(path))
    chunks = defaultdict(list)
    for t, rid, _index, audio_ms, _waited in timeline["chunks"]:
        chunks[rid].append((t, audio_ms))
    started = {rid: t for t, rid, event in timeline["responses"] if event == "started"}
    dry, holds, firsts = 0, [], []
    for rid, made in chunks.items():
        total, release = 0.0, made[-1][0]
        for t, audio_ms in made:
            total += audio_ms
            if total >= hold_ms:
                release = t
                break
        player = Playout()
        for t, audio_ms in made:
            player.deliver(max(t, release) / 1000.0, audio_ms / 1000.0)
        dry += player.underruns > 0
        holds.append(release - made[0][0])
        firsts.append(release - started[rid])
    return dry, statistics.median(holds), statistics.median(firsts)


if __name__ == "__main__":
    for path in sys.argv[1:]:
        cells = [f"B={b}: {d} dry, hold p50 {h:.0f}, first audio p50 {f:.0f}"
                 for b in (0, 720, 960) for d, h, f in [replay(path, b)]]
        print(path, " | ".join(cells))
