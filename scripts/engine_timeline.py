"""Read an engine timeline (``engine.timeline_path``, :mod:`pipeline.observe.timeline`): what the engine did while a
load ran.

    python scripts/engine_timeline.py TIMELINE.json                  # every reply, then the load per 200 ms
    python scripts/engine_timeline.py TIMELINE.json --late           # only the replies whose player ran dry
    python scripts/engine_timeline.py TIMELINE.json --from-ms 7000 --to-ms 9000 --window-ms 100

Prints, per reply (in the order they started): its start, when its first code came, each audio chunk as
``t:audio ms(audio ahead of the player before it, or -waited)``, and codes_done; then, per window: the steps
(count, mean and longest wall, prefill chunks, thinker rows, talker rows per step), the codes the talker made and the
token2wav jobs started in it (``start+ms/streams``, F for first chunks). All in ms on the timeline's clock (from the
engine's start).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path

from pipeline.output.playout import Playout


def replies(timeline: dict) -> dict[str, dict]:
    """Per response id: ``started``, ``first_code``, ``held``, ``codes_done``, ``ended`` (ms or None), ``status`` and
    ``chunks`` [(t, audio ms, ahead before it ms or -waited)]."""
    out: dict[str, dict] = defaultdict(
        lambda: {
            "chunks": [],
            "started": None,
            "first_code": None,
            "held": None,
            "codes_done": None,
            "ended": None,
            "status": None,
        }
    )
    for t, rid, event in timeline["responses"]:
        r = out[rid]
        if event in ("started", "first_code", "held", "codes_done"):
            r[event] = t
        else:
            r["ended"], r["status"] = t, event
    players: dict[str, Playout] = defaultdict(Playout)  # the engine's model of each reply's player, replayed
    for t, rid, _index, audio_ms, _waited in timeline["chunks"]:
        player = players[rid]
        ahead = 0.0 if player.ends_at is None else player.ahead_ms(t / 1000.0)
        player.deliver(t / 1000.0, audio_ms / 1000.0)
        out[rid]["chunks"].append((t, audio_ms, ahead))
    return dict(out)


def describe_reply(rid: str, r: dict) -> str:
    chunks = " ".join(
        f"{t:.0f}:{a:.0f}({ahead:+.0f})" if i else f"{t:.0f}:{a:.0f}" for i, (t, a, ahead) in enumerate(r["chunks"])
    )
    code = "-" if r["first_code"] is None else f"{r['first_code']:.0f}"
    done = "-" if r["codes_done"] is None else f"{r['codes_done']:.0f}"
    start = "-" if r["started"] is None else f"{r['started']:.0f}"
    held = "" if r.get("held") is None else f" held {r['held']:.0f}"
    return f"{rid} start {start} code {code}{held} | {chunks} | codes done {done} {r['status'] or ''}"


def windows(timeline: dict, window_ms: float, lo: float, hi: float) -> list[str]:
    steps, jobs = defaultdict(list), defaultdict(list)
    for start, wall, prefills, thinker, talker, codes, chains in timeline["steps"]:
        if lo <= start < hi:
            steps[int((start - lo) // window_ms)].append((wall, prefills, thinker, talker, codes, chains))
    for start, ms, streams, first in timeline["jobs"]:
        if lo <= start < hi:
            jobs[int((start - lo) // window_ms)].append(f"{start:.0f}+{ms:.0f}/{streams}{'F' if first else ''}")
    lines = []
    for k in sorted(set(steps) | set(jobs)):
        s = steps.get(k, [])
        if s:
            walls = [w for w, *_ in s]
            per = [sum(x[i] for x in s) / len(s) for i in (1, 2, 3)]
            codes = sum(x[4] for x in s)
            stat = (
                f"{len(s):3d} steps {sum(walls) / len(s):5.1f} ms mean {max(walls):5.1f} max | prefills "
                f"{per[0]:.1f} thinker {per[1]:.1f} talker {per[2]:.1f} rows/step, {codes} codes, "
                f"{sum(x[5] for x in s)} chains"
            )
        else:
            stat = "  no steps"
        lines.append(f"{lo + k * window_ms:8.0f} {stat} | jobs {' '.join(jobs.get(k, []))}")
    return lines


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("timeline", type=Path)
    p.add_argument(
        "--late", action="store_true", help="only the replies with a chunk that came after their player ran dry"
    )
    p.add_argument("--window-ms", type=float, default=200.0)
    p.add_argument("--from-ms", type=float, default=None, help="windows from here (default: the first reply's start)")
    p.add_argument("--to-ms", type=float, default=None, help="windows up to here (default: the last event)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.window_ms <= 0:
        print("--window-ms must be > 0", file=sys.stderr)
        return 2
    try:
        timeline = json.loads(args.timeline.read_text())
    except (OSError, ValueError) as exc:
        print(f"cannot read the timeline {args.timeline}: {exc}", file=sys.stderr)
        return 2
    by_id = replies(timeline)
    ordered = sorted(by_id.items(), key=lambda kv: (kv[1]["started"] is None, kv[1]["started"] or 0.0))
    late = {rid for rid, r in by_id.items() if any(ahead < 0 for *_, ahead in r["chunks"])}
    print(
        f"{len(by_id)} replies, {len(late)} with a late chunk; {len(timeline['steps'])} steps, "
        f"{len(timeline['jobs'])} token2wav jobs, {timeline.get('dropped', 0)} events dropped"
    )
    for rid, r in ordered:
        if not args.late or rid in late:
            print(describe_reply(rid, r))
    starts = [r["started"] for r in by_id.values() if r["started"] is not None]
    ends = [s[0] + s[1] for s in timeline["steps"]] + [j[0] + j[1] for j in timeline["jobs"]]
    lo = args.from_ms if args.from_ms is not None else min(starts, default=0.0)
    hi = args.to_ms if args.to_ms is not None else max(ends, default=lo)
    print(f"per {args.window_ms:.0f} ms from {lo:.0f}:")
    for line in windows(timeline, args.window_ms, lo, hi + 1e-9):
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
