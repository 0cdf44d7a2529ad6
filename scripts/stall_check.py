"""Does the engine keep answering under overlapping replies? A quick check, without the server, VAD or WebSocket
clients of ``omni-realtime bench``, for the kind of stall where a 32-user run stopped completing replies (the token2wav
worker's graphs and the decode graphs had shared one capture stream).

``--users`` workers each run ``--replies`` turns back to back: open a conversation, add a short text message,
ask for a spoken reply of forced length, read it to the end, close the conversation. Replies therefore finish and
start at different moments, so KV slots are released and reused while other replies decode and synthesize (what
the 32-user bench did when it stalled). A watchdog ends the run as stalled when no reply completes for
``--stall-s`` seconds. Exit status 0 when every reply completed, 1 on a stall, 2 on a failed reply.

    python scripts/stall_check.py --model random:7b --device cuda --users 32 --replies 3 --t2w-worker on
    python scripts/stall_check.py --users 4 --replies 2          # the embedded tiny model on the CPU
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from dataclasses import asdict, dataclass, field, replace

import torch

from pipeline.engine import OmniEngine
from pipeline.response_events import AudioChunk, ResponseStatus
from realtime.bench.models import ReplyLength, bench_stage_config, model_loader


@dataclass
class LoadResult:
    """What a run of :func:`run_load` saw; times in ms."""

    replies_wanted: int
    completed: int = 0
    failed: list[str] = field(default_factory=list)
    first_audio_ms: list[float] = field(default_factory=list)
    stalled_after_s: float | None = None
    """Seconds from the start when the watchdog gave up (no reply completed for ``stall_s``), else None."""


async def run_load(engine: OmniEngine, *, users: int, replies: int, stall_s: float) -> LoadResult:
    """``users`` concurrent workers, ``replies`` sequential turns each (see the module docstring). Returns when
    every turn ended, or when none completed for ``stall_s`` seconds (then every worker is cancelled)."""
    result = LoadResult(replies_wanted=users * replies)
    last_done = time.monotonic()
    started = last_done

    async def turn(user: int, index: int) -> None:
        nonlocal last_done
        conv = engine.conversation()
        # no close on cancellation: a stalled engine would never answer it (closing the engine ends everything)
        await conv.add_text("u", f"Hello, this is user {user}, turn {index}. Please tell me something.")
        t0, first_audio = time.perf_counter(), None
        response = conv.respond(item_id="a", modalities=frozenset({"text", "audio"}))
        async for event in response:
            if first_audio is None and isinstance(event, AudioChunk) and len(event.pcm):
                first_audio = (time.perf_counter() - t0) * 1000
        done = response.done
        if done is None or done.status in (ResponseStatus.FAILED, ResponseStatus.CANCELLED):
            result.failed.append(f"user {user} turn {index}: {None if done is None else done.status.value}")
        else:
            result.completed += 1
            last_done = time.monotonic()
            if first_audio is not None:
                result.first_audio_ms.append(first_audio)
        await conv.close()

    async def worker(user: int) -> None:
        for index in range(replies):
            await turn(user, index)

    tasks = [asyncio.create_task(worker(user)) for user in range(users)]
    try:
        while not all(task.done() for task in tasks):
            await asyncio.wait(tasks, timeout=0.5)
            if time.monotonic() - last_done > stall_s:
                result.stalled_after_s = time.monotonic() - started
                break
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    for task in tasks:
        if task.done() and not task.cancelled() and task.exception() is not None:
            result.failed.append(repr(task.exception()))
    return result


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--model", default=None, help="random:7b, random:tiny, a checkpoint (default: the embedded tiny one)"
    )
    p.add_argument("--device", default=None, help="every stage on this device (default: the stage config's)")
    p.add_argument("--users", type=int, default=4)
    p.add_argument("--replies", type=int, default=2, help="turns per user, one after the other")
    p.add_argument("--text-tokens", type=int, default=10)
    p.add_argument("--codec-tokens", type=int, default=50)
    p.add_argument(
        "--t2w-worker",
        choices=("auto", "on", "off"),
        default=None,
        help="token2wav.worker_thread (default: the stage config's)",
    )
    p.add_argument(
        "--engine-process",
        choices=("auto", "on", "off"),
        default=None,
        help="engine.process (default: the stage config's)",
    )
    p.add_argument("--stall-s", type=float, default=60.0, help="no reply completed for this long = stalled")
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    p.add_argument("--json", default=None, help="write the result here")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    torch.set_num_threads(args.threads)
    cfg = bench_stage_config(None, device=args.device, length=ReplyLength(args.text_tokens, args.codec_tokens))
    if args.t2w_worker is not None:
        cfg = replace(cfg, token2wav=replace(cfg.token2wav, worker_thread=args.t2w_worker))
    if args.engine_process is not None:
        cfg = replace(cfg, engine=replace(cfg.engine, process=args.engine_process))
    engine = OmniEngine.from_loader(model_loader(args.model), cfg, seed=0, torch_threads=args.threads)
    try:
        result = asyncio.run(run_load(engine, users=args.users, replies=args.replies, stall_s=args.stall_s))
    finally:
        engine.close()
    summary = asdict(result)
    ttfa = sorted(result.first_audio_ms)
    summary["first_audio_ms_p50"] = ttfa[len(ttfa) // 2] if ttfa else None
    print(json.dumps({k: v for k, v in summary.items() if k != "first_audio_ms"}))
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(summary, fh, indent=1)
    if result.stalled_after_s is not None:
        return 1
    return 2 if result.failed or result.completed < result.replies_wanted else 0


if __name__ == "__main__":
    sys.exit(main())
