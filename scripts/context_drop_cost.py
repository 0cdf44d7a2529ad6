"""What a long conversation's context drop costs: one conversation of long text turns on the packaged stage config.

Each turn adds a user message of ``--words`` words, lets the engine prefill it in the background (as it does while a
user speaks), then asks for a short reply and prints its input, cached and newly prefilled tokens and the time from
the engine taking the response to its first reply token (``prefill_done_ms``). Once the conversation no longer fits
the context, a turn drops the oldest turns (the packaged ``drop_oldest`` policy): its cached tokens fall to the
instructions and it prefills the kept history again; the other turns prefill a few tokens. Prints a line per turn
and a Markdown summary of the drop turns against the others.

    python scripts/context_drop_cost.py --model random:7b --device cuda --turns 22
    python scripts/context_drop_cost.py --turns 14          # the embedded tiny model on the CPU
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics

from pipeline.config import DEFAULT_STAGE_CONFIG
from pipeline.engine import OmniEngine
from realtime.bench.models import ReplyLength, bench_stage_config, model_loader

WORDS = "the sea sky cat dog house river mountain story light night day long short green blue red small big".split()


async def run(args: argparse.Namespace) -> list[tuple[int, int, float]]:
    """(input tokens, newly prefilled tokens, prefill_done_ms) of every turn."""
    cfg = bench_stage_config(DEFAULT_STAGE_CONFIG, device=args.device, length=ReplyLength(args.reply_tokens, 50))
    engine = OmniEngine.from_loader(model_loader(args.model), cfg, seed=0, torch_threads=args.threads)
    rng = random.Random(0)
    rows = []
    try:
        conv = engine.conversation()
        for turn in range(args.turns):
            await conv.add_text(f"u{turn}", " ".join(rng.choice(WORDS) for _ in range(args.words)))
            await engine.wait_idle()
            done = await conv.respond(item_id=f"a{turn}", max_output_tokens=args.reply_tokens).wait()
            u, ms = done.usage, done.timings.prefill_done_ms
            if ms is None:
                raise SystemExit(f"turn {turn} ended {done.status.value} without a reply token: {done.error}")
            rows.append((u.input_tokens, u.input_tokens - u.cached_tokens, ms))
            print(f"turn {turn:2d}: input {u.input_tokens:5d}, prefilled {rows[-1][1]:5d}, first token {ms:7.1f} ms")
    finally:
        engine.close()
    return rows


def summary(rows: list[tuple[int, int, float]]) -> str:
    drops = [r for r in rows if r[1] > 100]
    others = [r for r in rows if r[1] <= 100]
    lines = ["| turns | count | prefilled tokens (median) | first token ms (median, max) |", "|---|---:|---:|---:|"]
    for name, group in (("with a drop", drops), ("without", others)):
        if group:
            lines.append(
                f"| {name} | {len(group)} | {statistics.median(r[1] for r in group):.0f} | "
                f"{statistics.median(r[2] for r in group):.1f}, {max(r[2] for r in group):.1f} |"
            )
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=None, help="random:7b, random:tiny or a checkpoint (default: the embedded tiny)")
    p.add_argument("--device", default=None, help="every stage on this device (default: the stage config's)")
    p.add_argument("--turns", type=int, default=14, help="turns of the conversation (default: 14)")
    p.add_argument("--words", type=int, default=280, help="words per user message (default: 280, ~600 tokens)")
    p.add_argument("--reply-tokens", type=int, default=4, help="text tokens per reply (default: 4)")
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads (default: 1)")
    args = p.parse_args()
    print(summary(asyncio.run(run(args))))


if __name__ == "__main__":
    main()
