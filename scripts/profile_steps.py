"""Where an engine step's time goes: host work against GPU work, per step, under torch.profiler.

Runs the engine in a thread of this process (so the profiler sees its CPU ops and its kernels), replies of forced
length to ``--users`` concurrent conversations (one burst per level), and prints per level:

- the step's wall time (host) and the time the GPU was busy inside it, split by the kind of step (thinker and
  talker decoding, thinker only, talker only, a chain of talker steps (``talker.chain_steps``), other), as medians;
- the median host time of each labelled part of a step (thinker decode launch, samplers, talker prefill, ...);
- the busiest GPU kernels.

    python scripts/profile_steps.py --model random:7b --device cuda --threads 4 --users 1,16
    python scripts/profile_steps.py --users 1 --codec-tokens 30          # tiny model, CPU (no GPU figures)

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
import time
from dataclasses import replace
from pathlib import Path

import torch

from pipeline.engine import OmniEngine
from pipeline.outputs import AudioChunk
from realtime.bench.models import ReplyLength, bench_stage_config, model_loader

LABELS = {
    "thinker.decode": ("thinker", "decode"),
    "talker.decode": ("talker", "decode"),
    "talker.decode_chain": ("talker", "decode_chain"),
    "talker.prefill": ("talker", "prefill"),
    "thinker.prefill": ("thinker", "prefill"),
    "text_sampler.sample": ("text_sampler", "sample"),
    "code_sampler.sample": ("code_sampler", "sample"),
}
"""Label -> (attribute of the engine core, method) wrapped in a ``record_function`` of that label."""


class StepClock:
    """Without the profiler (whose kernel tracing slows graph launches): each step's wall time by kind, from
    wrappers that note which decode ran in it. Each step ends by reading its sampled ids, so its wall time includes
    its device work."""

    def __init__(self, core) -> None:
        self.walls: dict[str, list[float]] = {}
        self.timeline: list[tuple[float, float, str, int, int]] = []
        """Every step: (start, ``time.perf_counter()`` in ms; wall ms; kind; thinker and talker tokens so far)."""
        self._ran: set[str] = set()
        for stage in ("thinker", "talker"):
            runner = getattr(core, stage)
            runner.decode = self._noting(stage, runner.decode)
        core.talker.decode_chain = self._noting("talker chain", core.talker.decode_chain)
        step = core.step

        def timed_step():
            self._ran = set()
            t0 = time.perf_counter()
            progressed = step()
            kind = _kind("thinker" in self._ran, "talker" in self._ran, "talker chain" in self._ran)
            wall = (time.perf_counter() - t0) * 1000
            self.walls.setdefault(kind, []).append(wall)
            counters = core.counters
            self.timeline.append((t0 * 1000, wall, kind, counters["thinker_tokens_total"],
                                  counters["talker_tokens_total"]))
            return progressed

        core.step = timed_step
        self.jobs: list[tuple[float, float, int, int]] = []
        """Every token2wav job the worker ran: (start, ``time.perf_counter()`` in ms; ms until its chunks were on
        the host; streams; first chunks among them). Appended on the worker's thread."""
        self.emits: list[tuple[float, str, int, float]] = []
        """Every audio chunk the engine emitted: (``time.perf_counter()`` in ms; response id; samples; ms a real-time
        player of the reply had been waiting for it, ``ResponseState.playout``)."""
        if core.t2w_worker is not None:
            self._watch_jobs(core, core.t2w_worker)
        emit = core._emit_audio

        def noted_emit(r, pcm):
            starved = r.playout.starved_ms
            emit(r, pcm)
            if len(pcm):
                self.emits.append((time.perf_counter() * 1000, r.id, len(pcm), r.playout.starved_ms - starved))

        core._emit_audio = noted_emit

    def _watch_jobs(self, core, worker) -> None:
        run, submit, firsts = worker._run, worker.submit, {}

        def submitted(streams, **kwargs):
            # the engine set its in-flight map just before: a stream of a reply without audio yet holds a first chunk
            firsts[id(streams[0])] = sum(core._t2w_jobs[id(s)].first_audio_at is None for s in streams)
            return submit(streams, **kwargs)

        def timed_run(streams, *args):
            t0 = time.perf_counter()
            result = run(streams, *args)
            self.jobs.append((t0 * 1000, (time.perf_counter() - t0) * 1000, len(streams),
                              firsts.pop(id(streams[0]), 0)))
            return result

        worker.submit, worker._run = submitted, timed_run

    def _noting(self, stage, fn):
        @functools.wraps(fn)
        def call(*args, **kwargs):
            self._ran.add(stage)
            return fn(*args, **kwargs)
        return call

    def summary(self) -> dict:
        return {kind: {"count": len(v), "wall_ms_p50": statistics.median(v), "wall_ms_sum": sum(v)}
                for kind, v in self.walls.items()}  # fmt: skip


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
    """Wrap ``core.step`` and the parts in :data:`LABELS` in profiler labels (instance attributes: the class and
    other engines are untouched)."""
    for label, (owner, method) in LABELS.items():
        obj = getattr(core, owner)
        setattr(obj, method, labelled(label, getattr(obj, method)))
    core.step = labelled("engine.step", core.step)


async def burst(engine: OmniEngine, users: int, asked: list[float] | None = None,
                spread_ms: float = 0.0) -> list[float]:
    """One spoken reply per user, user ``u`` asking ``spread_ms * u / users`` ms after the first (0: all at once, as
    ``omni-realtime bench --ramp-s`` spreads its users); returns the first-audio times (ms from each ask). ``asked``
    gets each ask's ``time.perf_counter()``."""
    convs = [engine.conversation() for _ in range(users)]
    for i, conv in enumerate(convs):
        await conv.add_text("u", f"Hello, this is user {i}. Please tell me something.")
    await engine.wait_idle()

    async def one(conv, delay_ms: float) -> float:
        await asyncio.sleep(delay_ms / 1000)
        t0, first = time.perf_counter(), None
        if asked is not None:
            asked.append(t0)
        async for event in conv.respond(item_id="a", modalities=frozenset({"text", "audio"})):
            if first is None and isinstance(event, AudioChunk) and len(event.pcm):
                first = (time.perf_counter() - t0) * 1000
        await conv.close()
        return first

    return await asyncio.gather(*(one(c, spread_ms * u / users) for u, c in enumerate(convs)))


def _union(intervals: list[tuple[float, float]]) -> float:
    total, end = 0.0, float("-inf")
    for a, b in sorted(intervals):
        if b <= end:
            continue
        total += b - max(a, end)
        end = b
    return total


def summarize(trace: dict) -> dict:
    """Per-step wall / GPU-busy medians by step kind, label medians and top kernels from a chrome trace (us)."""
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
        inside = [lab for lab in labels if a <= lab["ts"] < b]
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
        "steps": {kind: {"count": len(v), "wall_ms_p50": statistics.median(w for w, _ in v),
                         "gpu_busy_ms_p50": statistics.median(g for _, g in v),
                         "wall_ms_sum": sum(w for w, _ in v), "gpu_busy_ms_sum": sum(g for _, g in v)}
                  for kind, v in by_kind.items()},  # fmt: skip
        "labels_ms_p50": {k: round(statistics.median(v), 3) for k, v in sorted(label_ms.items())},
        "labels_count": {k: len(v) for k, v in sorted(label_ms.items())},
        "top_kernels_ms": [(name, round(sum(d), 2), len(d)) for name, d in top],
    }


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=None, help="random:7b, random:tiny, a checkpoint (default: the embedded tiny one)")
    p.add_argument("--device", default=None, help="every stage on this device (default: the stage config's)")
    p.add_argument("--users", default="1", help="comma-separated burst sizes, profiled one after the other")
    p.add_argument("--text-tokens", type=int, default=10)
    p.add_argument("--codec-tokens", type=int, default=50)
    p.add_argument("--stage-config", type=Path, default=None, help="default: bench_forced.yaml")
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    p.add_argument("--out", type=Path, default=None, help="write the summaries (JSON) and traces here")
    p.add_argument("--no-trace", action="store_true",
                   help="no profiler: only each kind of step's wall time (the profiler's kernel tracing slows launches)")
    p.add_argument("--timeline", action="store_true",
                   help="with --no-trace: also every step (start ms, wall ms, kind, text and codec tokens so far) and "
                        "every token2wav job (start ms, ms, streams, first chunks) and audio chunk (ms, response, "
                        "samples, ms a real-time player waited for it)")
    p.add_argument("--spread-ms", type=float, default=0.0,
                   help="the users of a level ask over this many ms (default 0: all at once)")
    return p


def clock_only(engine: OmniEngine, core, args) -> int:
    clock = StepClock(core)
    results = {}
    try:
        asyncio.run(burst(engine, 1))  # warm-up
        for users in (int(u) for u in args.users.split(",")):
            clock.walls.clear()
            clock.timeline.clear()
            clock.jobs.clear()
            clock.emits.clear()
            asked: list[float] = []
            first_audio = asyncio.run(burst(engine, users, asked, args.spread_ms))
            results[users] = {"steps": clock.summary(),
                              "first_audio_ms": sorted(round(x, 1) for x in first_audio if x is not None)}
            if args.timeline:
                # ms from the first ask; steps before it (the prompts' prefills) are left out
                origin = min(asked) * 1000
                results[users]["timeline"] = [(round(a - origin, 2), round(w, 2), kind, text, codes)
                                              for a, w, kind, text, codes in clock.timeline if a >= origin - 1]
                # with a spread, users ask in their order: the two lists pair up
                results[users]["asked_ms"] = [round(a * 1000 - origin, 2) for a in asked]
                results[users]["first_audio_by_user"] = [None if x is None else round(x, 1) for x in first_audio]
                results[users]["token2wav_jobs"] = [(round(a - origin, 2), round(w, 2), n, first)
                                                    for a, w, n, first in list(clock.jobs) if a >= origin - 1]
                results[users]["audio_chunks"] = [(round(a - origin, 2), rid, n, round(waited, 1))
                                                   for a, rid, n, waited in clock.emits if a >= origin - 1]
                results[users]["underruns"] = sum(waited > 0 for *_, waited in clock.emits)
            shown = {k: v for k, v in results[users].items() if k not in ("timeline", "audio_chunks")}
            print(f"== {users} users (no profiler)", json.dumps(shown, indent=1), flush=True)
            for step in results[users].get("timeline", ()):
                print("step", json.dumps(step), flush=True)
            for job in results[users].get("token2wav_jobs", ()):
                print("token2wav job", json.dumps(job), flush=True)
    finally:
        engine.close()
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "clock.json").write_text(json.dumps(results, indent=1))
    return 0


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    torch.set_num_threads(args.threads)
    cfg = bench_stage_config(args.stage_config, device=args.device,
                             length=ReplyLength(args.text_tokens, args.codec_tokens))  # fmt: skip
    cfg = replace(cfg, engine=replace(cfg.engine, process="off"))  # the profiler must see the engine's thread
    engine = OmniEngine.from_loader(model_loader(args.model), cfg, seed=0, torch_threads=args.threads)
    core = engine._backend.core
    if args.no_trace:
        return clock_only(engine, core, args)
    instrument(core)
    cuda = core.thinker.device.type == "cuda"
    activities = [torch.profiler.ProfilerActivity.CPU] + ([torch.profiler.ProfilerActivity.CUDA] if cuda else [])
    results = {}
    try:
        asyncio.run(burst(engine, 1))  # warm-up: first-use allocations, lazy inits
        for users in (int(u) for u in args.users.split(",")):
            path = Path(f"/tmp/profile_steps_{users}.json")
            # started and stopped on the engine's thread: the profiler records CPU ops of the thread that starts it
            prof = torch.profiler.profile(activities=activities)
            engine._backend.submit(lambda _core, prof=prof: prof.start()).result()
            first_audio = asyncio.run(burst(engine, users, spread_ms=args.spread_ms))
            engine._backend.submit(lambda _core, prof=prof: prof.stop()).result()
            prof.export_chrome_trace(str(path))
            summary = summarize(json.loads(path.read_text()))
            summary["first_audio_ms"] = sorted(round(x, 1) for x in first_audio if x is not None)
            results[users] = summary
            print(f"== {users} users", json.dumps(summary, indent=1), flush=True)
            if args.out:
                args.out.mkdir(parents=True, exist_ok=True)
                with gzip.open(args.out / f"trace_{users}.json.gz", "wb") as fh:
                    fh.write(path.read_bytes())
    finally:
        engine.close()
    if args.out:
        (args.out / "summary.json").write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
