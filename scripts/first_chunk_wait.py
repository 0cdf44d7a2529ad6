"""Where a reply's first chunk waits inside the engine: p50 / p95 per bench level of the engine milestones that each
finished spoken response logs ("milestones (ms) {...}", pipeline/output/processor.py), split into

- ``first code``: the talker's first code (ms from the engine taking the response);
- ``codes``: from the first code to the first chunk's last code (look-ahead included);
- ``wait``: from there to the start of the token2wav job holding the first chunk (the worker busy with another job,
  or the policy picking other streams first);
- ``job``: that job (DiT solve and vocoder, beside whatever else shares the GPU), to the first chunk made;
- ``held``: from there to its leaving the engine, the start buffer's hold under load (``token2wav.start_buffer_ms``;
  0 when not held, and for logs older than ``token2wav_first_made_ms``, whose ``job`` then ends at ``out``);
- ``out``: the first chunk leaving the engine (ms from the engine taking the response).

    python scripts/first_chunk_wait.py bench.log

Responses without the four milestones (text only, cancelled before their first audio, logs older than
``token2wav_first_job_ms``) are left out; so is the warm-up before the log's first level."""

from __future__ import annotations

import argparse
import ast
import re
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))  # first_audio_path, beside this script

from first_audio_path import LEVEL  # noqa: E402

MILESTONES = re.compile(r"milestones \(ms\) (\{.*\})\s*$")
NEEDED = ("talker_first_code_ms", "talker_first_chunk_ms", "token2wav_first_job_ms", "token2wav_first_chunk_ms")
PARTS = ("first code", "codes", "wait", "job", "held", "out")


def parse(lines) -> dict[str, list[dict[str, float]]]:
    """Bench level ("N users") -> the milestones of its responses that have all of :data:`NEEDED`, in log order."""
    levels: dict[str, list[dict[str, float]]] = {}
    level = None
    for line in lines:
        if (marker := LEVEL.search(line)) is not None:
            level = f"{marker[1]} users"
            levels.setdefault(level, [])
        elif level is not None and (match := MILESTONES.search(line)) is not None:
            milestones = ast.literal_eval(match[1])
            if all(milestones.get(name) is not None for name in NEEDED):
                levels[level].append(milestones)
    return levels


def split(m: dict[str, float]) -> dict[str, float]:
    """One response's first chunk path in the parts of :data:`PARTS` (ms)."""
    code, codes_in, job, out = (m[name] for name in NEEDED)
    made = m.get("token2wav_first_made_ms", out)
    return {
        "first code": code,
        "codes": codes_in - code,
        "wait": job - codes_in,
        "job": made - job,
        "held": out - made,
        "out": out,
    }


def table(levels: dict[str, list[dict[str, float]]]) -> str:
    rows = [
        "| level | n | " + " | ".join(f"{part} p50 / p95" for part in PARTS) + " |",
        "|---|---:|" + "---:|" * len(PARTS),
    ]
    for level, responses in levels.items():
        if not responses:
            continue
        parts = [split(m) for m in responses]
        cells = []
        for part in PARTS:
            values = np.array([p[part] for p in parts])
            cells.append(f"{np.percentile(values, 50):.0f} / {np.percentile(values, 95):.0f}")
        rows.append(f"| {level} | {len(parts)} | " + " | ".join(cells) + " |")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("log")
    args = parser.parse_args(argv)
    with open(args.log, encoding="utf-8", errors="replace") as f:
        levels = parse(f)
    if not any(levels.values()):
        print(f"{args.log}: no bench level with first-chunk milestones", file=sys.stderr)
        return 1
    print(table(levels))
    return 0


if __name__ == "__main__":
    sys.exit(main())
