"""Where an engine step's time goes: host work against GPU work, per step, under torch.profiler.

Runs the engine on a thread of this process (so the profiler sees its CPU ops and its kernels), replies of forced
length to ``--users`` concurrent conversations (one burst per level), and prints per level:

- the step's wall time (host) and the time the GPU was busy inside it, split by the kind of step (thinker and
  talker decoding, thinker only, talker only, a chain of talker steps (``talker.chain_steps``), other), as medians;
- the median host time of each labelled part of a step (:data:`LABELS`: prefills, decodes, a reply's first sample);
- the busiest GPU kernels;
- each reply's first audio, and the engine's counters over the level (``EngineStats``: tokens, decode steps, talker
  chains, chunks a real-time player of the reply waited for).

    python scripts/profile_steps.py --model random:7b --device cuda --threads 4 --users 1,16
    python scripts/profile_steps.py --users 1 --codec-tokens 30          # tiny model, CPU (no GPU figures)
    python scripts/profile_steps.py --model random:7b --device cuda --users 4,16 --spread-ms 1000 --no-trace \\
        --timeline steps.json && python scripts/engine_timeline.py steps.json

``--no-trace`` times each kind of step without the profiler, whose kernel tracing slows graph launches. Every step,
token2wav job and audio chunk with its time is what the engine's own timeline records (``engine.timeline_path``,
:mod:`pipeline.observe.timeline`): ``--timeline FILE`` turns it on, and ``scripts/engine_timeline.py`` reads it.

Units: ms. "GPU busy" is the union of every kernel interval (any stream) that lies inside the step; a step whose
GPU busy time is far below its wall time waits on the host (launches, Python, host copies, syncs).
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import gzip
import json
import statistics
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import torch

from pipeline.engine import OmniEngine
from pipeline.response_events import AudioChunk
from realtime.bench.models import ReplyLength, bench_stage_config, model_loader

LABELS = {
    "thinker.prefill": ("thinker", "prefill_many"),
    "thinker.decode": ("thinker", "decode"),
    "thinker.sample_first": ("thinker.sampler", "sample"),
    "talker.prefill": ("talker", "prefill"),
    "talker.prefill_prompt": ("talker", "prefill_prompt"),
    "talker.decode": ("talker", "decode"),
    "talker.decode_chain": ("talker", "decode_chain"),
    "talker.sample_first": ("talker.sampler", "sample"),
    "audio_encodes.flush": ("audio_encodes", "flush"),
    "token2wav.step_many": ("token2wav", "step_many"),
}
"""Label -> (the object's attribute path from the engine core's ``runner``, its method), wrapped in a
``record_function`` of that label. A decode samples on the device inside ``decode``; a sampler's ``sample`` runs only
for a reply's first token (thinker) or first code (talker). ``token2wav.step_many`` is a step's part only without the
token2wav worker thread (``token2wav.worker_thread``)."""

COUNTERS = (
    "thinker_tokens_total",
    "talker_tokens_total",
    "decode_steps_total",
    "talker_chains_total",
    "audio_underruns_total",
    "audio_starved_ms_total",
    "audio_start_holds_total",
)
"""The ``EngineStats`` counters reported per level (how much each grew over the level)."""


def _resolve(root, path: str):
    for name in path.split("."):
        root = getattr(root, name)
    return root


class StepClock:
    """Without the profiler: each step's wall time by kind, from wrappers on the core's ``step`` and the runners'
    decodes that note which decode ran in it. A step ends by reading its sampled ids, so its wall time includes its
    device work. Installed, read and reset on the engine thread (:meth:`take`)."""

    def __init__(self, core) -> None:
        self.walls: dict[str, list[float]] = {}
        self._ran: set[str] = set()
        runner = core.runner
        for noted, obj, method in (
            ("thinker", runner.thinker, "decode"),
            ("talker", runner.talker, "decode"),
            ("talker chain", runner.talker, "decode_chain"),
        ):
            if not hasattr(obj, method):  # a frame talker offers no chains
                continue
            setattr(obj, method, self._noting(noted, getattr(obj, method)))
        step = core.step

        def timed_step():
            self._ran = set()
            t0 = time.perf_counter()
            progressed = step()
            wall = (time.perf_counter() - t0) * 1000
            kind = _kind("thinker" in self._ran, "talker" in self._ran, "talker chain" in self._ran)
            self.walls.setdefault(kind, []).append(wall)
            return progressed

        core.step = timed_step

    def _noting(self, noted: str, fn):
        @functools.wraps(fn)
        def call(*args, **kwargs):
            self._ran.add(noted)
            return fn(*args, **kwargs)

        return call

    def take(self) -> dict:
        """Each kind's step count, median and summed wall time since the last call."""
        walls, self.walls = self.walls, {}
        return {
            kind: {"count": len(v), "wall_ms_p50": statistics.median(v), "wall_ms_sum": sum(v)}
            for kind, v in walls.items()
        }


def _kind(thinker: bool, talker: bool, chain: bool) -> str:
    """A step's kind from the decodes it ran (a talker chain runs only in a step without the thinker)."""
    if chain:
        return "talker chain"
    if thinker:
        return "thinker+talker" if talker else "thinker only"
    return "talker only" if talker else "other"


def labelled(label: str, fn):
    """``fn`` wrapped in a profiler label of its own."""

    @functools.wraps(fn)
    def call(*args, **kwargs):
        with torch.profiler.record_function(label):
            return fn(*args, **kwargs)

    return call


def instrument(core) -> None:
    """Wrap ``core.step`` and the parts in :data:`LABELS` in profiler labels (instance attributes: the classes and
    other engines are untouched). Run it on the engine thread, between two steps."""
    for label, (owner, method) in LABELS.items():
        obj = _resolve(core.runner, owner)
        setattr(obj, method, labelled(label, getattr(obj, method)))
    core.step = labelled("engine.step", core.step)


async def burst(engine: OmniEngine, users: int, spread_ms: float = 0.0) -> dict:
    """One spoken reply per user, user ``u`` asking ``spread_ms * u / users`` ms after the first (0: all at once, as
    ``omni-realtime bench --ramp-s`` spreads its users). Returns ``first_audio_ms`` (ms from each ask, sorted) and
    ``counters`` (how much each of :data:`COUNTERS` grew while the replies ran, without the ``_total``)."""
    convs = [engine.conversation() for _ in range(users)]
    for i, conv in enumerate(convs):
        await conv.add_text("u", f"Hello, this is user {i}. Please tell me something.")
    await engine.wait_idle()

    async def one(conv, delay_ms: float) -> float | None:
        await asyncio.sleep(delay_ms / 1000)
        t0, first = time.perf_counter(), None
        async for event in conv.respond(item_id="a", modalities=frozenset({"text", "audio"})):
            if first is None and isinstance(event, AudioChunk) and len(event.pcm):
                first = (time.perf_counter() - t0) * 1000
        await conv.close()
        return first

    before = await engine.stats()
    first_audio = await asyncio.gather(*(one(c, spread_ms * u / users) for u, c in enumerate(convs)))
    after = await engine.stats()
    return {
        "first_audio_ms": sorted(round(x, 1) for x in first_audio if x is not None),
        "counters": {name.removesuffix("_total"): getattr(after, name) - getattr(before, name) for name in COUNTERS},
    }


def _union(intervals: list[tuple[float, float]]) -> float:
    total, end = 0.0, float("-inf")
    for a, b in sorted(intervals):
        if b <= end:
            continue
        total += b - max(a, end)
        end = b
    return total


def summarize(trace: dict) -> dict:
    """Per-step wall / GPU-busy medians by step kind, label medians and top kernels from a chrome trace (us). A step's
    labels are those of its thread that start inside it."""
    events = [e for e in trace.get("traceEvents", []) if e.get("ph") == "X"]
    # the host's labels only: each also appears as a "gpu_user_annotation" spanning its kernels
    annotations = [e for e in events if e.get("cat") == "user_annotation"]
    steps = sorted((e for e in annotations if e["name"] == "engine.step"), key=lambda e: e["ts"])
    kernels = sorted((e["ts"], e["ts"] + e["dur"]) for e in events if e.get("cat") == "kernel")
    labels = [e for e in annotations if e["name"] in LABELS]
    by_kind: dict[str, list[tuple[float, float]]] = {}
    label_ms: dict[str, list[float]] = {}
    for step in steps:
        a, b = step["ts"], step["ts"] + step["dur"]
        inside = [lab for lab in labels if lab.get("tid") == step.get("tid") and a <= lab["ts"] < b]
        names = {lab["name"] for lab in inside}
        kind = _kind("thinker.decode" in names, "talker.decode" in names, "talker.decode_chain" in names)
        busy = _union([(max(x, a), min(y, b)) for x, y in kernels if y > a and x < b])
        by_kind.setdefault(kind, []).append((step["dur"] / 1000, busy / 1000))
        for lab in inside:
            label_ms.setdefault(lab["name"], []).append(lab["dur"] / 1000)
    kernel_totals: dict[str, list[float]] = {}
    for e in events:
        if e.get("cat") == "kernel":
            kernel_totals.setdefault(e["name"][:80], []).append(e["dur"] / 1000)
    top = sorted(kernel_totals.items(), key=lambda kv: -sum(kv[1]))[:12]
    return {
        "steps": {
            kind: {
                "count": len(v),
                "wall_ms_p50": statistics.median(w for w, _ in v),
                "gpu_busy_ms_p50": statistics.median(g for _, g in v),
                "wall_ms_sum": sum(w for w, _ in v),
                "gpu_busy_ms_sum": sum(g for _, g in v),
            }
            for kind, v in by_kind.items()
        },
        "labels_ms_p50": {k: round(statistics.median(v), 3) for k, v in sorted(label_ms.items())},
        "labels_count": {k: len(v) for k, v in sorted(label_ms.items())},
        "top_kernels_ms": [(name, round(sum(d), 2), len(d)) for name, d in top],
    }


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--model", default=None, help="random:7b, random:tiny, a checkpoint (default: the embedded tiny one)"
    )
    p.add_argument("--device", default=None, help="every stage on this device (default: the stage config's)")
    p.add_argument("--users", default="1", help="comma-separated burst sizes, profiled one after the other")
    p.add_argument("--text-tokens", type=int, default=10)
    p.add_argument("--codec-tokens", type=int, default=50)
    p.add_argument("--stage-config", type=Path, default=None, help="default: bench_forced.yaml")
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    p.add_argument("--out", type=Path, default=None, help="write the summaries (JSON) and traces here")
    p.add_argument(
        "--no-trace",
        action="store_true",
        help="no profiler: only each kind of step's wall time (the profiler's kernel tracing slows launches)",
    )
    p.add_argument(
        "--timeline",
        type=Path,
        default=None,
        metavar="FILE",
        help="keep the engine's timeline (engine.timeline_path: every step, token2wav job, audio chunk and "
        "response, warm-up included) and write it to FILE when the engine closes; read it with "
        "scripts/engine_timeline.py",
    )
    p.add_argument(
        "--spread-ms",
        type=float,
        default=0.0,
        help="the users of a level ask over this many ms (default 0: all at once)",
    )
    return p


def _levels(users: str) -> list[int]:
    return [int(u) for u in users.split(",")]


def clock_only(engine: OmniEngine, args) -> dict:
    """Each level's step walls by kind, without the profiler."""
    thread = engine._thread
    clock = thread.submit(StepClock).result()
    asyncio.run(burst(engine, 1))  # warm-up: first-use allocations, lazy inits
    thread.submit(lambda _core: clock.take()).result()
    results = {}
    for users in _levels(args.users):
        level = asyncio.run(burst(engine, users, args.spread_ms))
        results[users] = {"steps": thread.submit(lambda _core: clock.take()).result(), **level}
        print(f"== {users} users (no profiler)", json.dumps(results[users], indent=1), flush=True)
    return results


def traced(engine: OmniEngine, args) -> dict:
    """Each level under the profiler: :func:`summarize` of its trace; with ``--out`` the trace too."""
    thread = engine._thread
    thread.submit(instrument).result()
    cuda = thread.core.device.type == "cuda"
    activities = [torch.profiler.ProfilerActivity.CPU] + ([torch.profiler.ProfilerActivity.CUDA] if cuda else [])
    asyncio.run(burst(engine, 1))  # warm-up: first-use allocations, lazy inits
    results = {}
    with tempfile.TemporaryDirectory(prefix="profile_steps_") as tmp:
        for users in _levels(args.users):
            path = Path(tmp) / f"trace_{users}.json"
            # started and stopped on the engine's thread: the profiler records CPU ops of the thread that starts it
            prof = torch.profiler.profile(activities=activities)
            thread.submit(lambda _core, prof=prof: prof.start()).result()
            level = asyncio.run(burst(engine, users, args.spread_ms))
            thread.submit(lambda _core, prof=prof: prof.stop()).result()
            prof.export_chrome_trace(str(path))
            results[users] = {**summarize(json.loads(path.read_text())), **level}
            print(f"== {users} users", json.dumps(results[users], indent=1), flush=True)
            if args.out:
                args.out.mkdir(parents=True, exist_ok=True)
                with gzip.open(args.out / f"trace_{users}.json.gz", "wb") as fh:
                    fh.write(path.read_bytes())
    return results


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    torch.set_num_threads(args.threads)
    cfg = bench_stage_config(
        args.stage_config, device=args.device, length=ReplyLength(args.text_tokens, args.codec_tokens)
    )
    timeline = {} if args.timeline is None else {"timeline_path": str(args.timeline)}
    # the profiler and the clock need the engine core on a thread of this process
    cfg = replace(cfg, engine=replace(cfg.engine, process="off", **timeline))
    engine = OmniEngine.from_loader(
        model_loader(args.model, family=cfg.model_family), cfg, seed=0, torch_threads=args.threads
    )
    try:
        results = clock_only(engine, args) if args.no_trace else traced(engine, args)
    finally:
        engine.close()  # writes the engine's timeline, if kept
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / ("clock.json" if args.no_trace else "summary.json")).write_text(json.dumps(results, indent=1))
    if args.timeline is not None:
        print(f"engine timeline: {args.timeline} (python scripts/engine_timeline.py {args.timeline})", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
