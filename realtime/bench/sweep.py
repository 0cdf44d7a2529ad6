"""The concurrency sweep: at each level, N simulated users talk to one server at the same time.

The users of a level run in a child process (``spawn``), so the measuring clients never share an
event loop or an interpreter lock with an in-process server they measure; the parent only serves.
After each level the reference serves the same users' turns (:func:`realtime.bench.reference.
serve_one_worker`), so every level's result holds both, and is handed to ``on_level`` at once (the
report is rewritten after every level: an interrupted sweep keeps what it measured).

User *u* of *N* starts ``ramp_s · u / N`` seconds into the level (arrivals spread over the ramp, not
all in the same instant), speaks the files of the folder in turn starting at file *u* (users say
different things), and runs ``max(turns, ceil(min_samples / N))`` turns, so low levels still give
enough samples for percentiles.

Around each level's users (not the reference) the sweep snapshots the engine's cumulative
counters (``counters``: the in-process engine's, or a remote server's ``/metrics``) and keeps the
stage rates and device memory of the window (:mod:`realtime.bench.throughput`).

The child is started with ``spawn`` (no fork of a process holding CUDA and an engine thread), so a
script that calls :func:`run_sweep` needs the usual ``if __name__ == "__main__":`` guard.
"""

from __future__ import annotations

import asyncio
import importlib
import logging
import math
import time
from collections.abc import Awaitable, Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from multiprocessing import get_context

from realtime.bench.client import ClientOptions, ClientRun, UserPlan, run_users
from realtime.bench.metrics import TurnMetrics, turn_metrics
from realtime.bench.reference import QueuedTurn, Served, serve_one_worker
from realtime.bench.speech import Speech
from realtime.bench.throughput import (
    EngineCounters,
    LevelThroughput,
    ReferenceThroughput,
    level_throughput,
    reference_throughput,
    replying_seconds,
)

log = logging.getLogger(__name__)

DEFAULT_SILENCE_WINDOW_MS = 500.0
"""The API's default ``server_vad`` silence window, for the reference when the sessions did not say."""


@dataclass(frozen=True)
class SweepPlan:
    levels: tuple[int, ...]
    turns: int = 3
    min_samples: int = 0
    barge_in_every: int = 0
    """Every K-th turn of a user is a barge-in turn (0: none)."""
    ramp_s: float = 1.0
    warmup_turns: int = 1
    """Turns of one user (and reference runs) before the first level, not recorded."""

    def __post_init__(self) -> None:
        if not self.levels or any(level < 1 for level in self.levels):
            raise ValueError(f"concurrency levels must be positive integers, got {self.levels}")
        if self.turns < 1 or self.min_samples < 0 or self.barge_in_every < 0 or self.warmup_turns < 0:
            raise ValueError("turns must be >= 1; min_samples, barge_in_every and warmup_turns >= 0")
        if self.ramp_s < 0:
            raise ValueError(f"ramp_s must be >= 0, got {self.ramp_s}")

    def turns_per_user(self, level: int) -> int:
        return max(self.turns, math.ceil(self.min_samples / level))


def user_plans(speeches: Sequence[Speech], level: int, plan: SweepPlan, *, turns: int | None = None) -> list[UserPlan]:
    """The :class:`UserPlan` of each of ``level`` users (module docstring)."""
    count = plan.turns_per_user(level) if turns is None else turns
    every = plan.barge_in_every
    barge = frozenset(t for t in range(count) if every and (t + 1) % every == 0)
    return [
        UserPlan(
            user=u,
            speeches=tuple(speeches[(u + t) % len(speeches)] for t in range(count)),
            start_delay_s=plan.ramp_s * u / level,
            barge_in_turns=barge,
        )
        for u in range(level)
    ]


@dataclass
class LevelResult:
    concurrency: int
    turns_per_user: int
    wall_s: float
    turns: list[TurnMetrics]
    errors: list[dict] = field(default_factory=list)
    silence_window_ms: float | None = None
    reference: list[QueuedTurn] | None = None
    reference_wall_s: float | None = None
    replying_s: float | None = None
    """Seconds of the level with at least one reply in flight, as the clients saw it."""
    throughput: LevelThroughput | None = None
    """Our stage rates and device memory over the users' window; ``None`` when the server's
    counters could not be read."""
    event_counts: dict[str, int] = field(default_factory=dict)
    """Commits and input transcription events the users received (``realtime.bench.client.COUNTED_EVENTS``)."""

    def reference_metrics(self) -> list[TurnMetrics]:
        return [q.metrics() for q in self.reference or ()]

    def reference_throughput(self) -> ReferenceThroughput | None:
        return reference_throughput(self.reference) if self.reference else None


def _child_ready() -> None:
    """Child-process entry: import what :func:`run_clients` needs."""
    for module in ("tqdm", "realtime.bench.client"):
        importlib.import_module(module)


def run_clients(
    url: str, plans: list[UserPlan], options: ClientOptions, label: str
) -> tuple[list[TurnMetrics], list[dict], float | None, float, dict[str, int]]:
    """Child-process entry: run the users with a progress bar; returns their turns' metrics, the
    server errors, the sessions' silence window (ms), the seconds with a reply in flight and the counted events."""
    from tqdm import tqdm

    total = sum(len(p.speeches) for p in plans)
    with tqdm(total=total, desc=label, unit="turn", leave=True) as bar:
        run: ClientRun = asyncio.run(run_users(url, plans, options, on_turn=lambda _log: bar.update()))
    metrics = [turn_metrics(log, jitter_ms=options.jitter_ms) for log in run.logs]
    return metrics, run.errors, run.silence_window_ms, replying_seconds(run.logs), run.counts


async def run_sweep(
    url: str,
    speeches: Sequence[Speech],
    plan: SweepPlan,
    options: ClientOptions,
    *,
    reference: Callable[[Speech], Served] | None = None,
    on_level: Callable[[LevelResult], None] | None = None,
    counters: Callable[[], Awaitable[EngineCounters | None]] | None = None,
    counters_source: str = "engine",
) -> list[LevelResult]:
    """Run every level against the server at ``url`` (which this event loop may be serving), the
    reference after each. Levels run in order; ``on_level`` gets each result as soon as it is
    complete. ``counters`` snapshots the server's engine counters (``None``: no throughput), named
    ``counters_source`` in the results."""
    loop = asyncio.get_running_loop()
    results = []
    with ProcessPoolExecutor(1, mp_context=get_context("spawn")) as pool:
        # start the child (interpreter, imports) before any level's window opens
        await loop.run_in_executor(pool, _child_ready)
        if plan.warmup_turns:
            warm = user_plans(speeches, 1, plan, turns=plan.warmup_turns)
            await loop.run_in_executor(pool, run_clients, url, warm, options, "warm-up")
            if reference is not None:
                await asyncio.to_thread(reference, speeches[0])
        for level in plan.levels:
            plans = user_plans(speeches, level, plan)
            log.info("bench level %d: %d users start", level, level)  # scripts/first_audio_path.py splits here
            before = await counters() if counters is not None else None
            start = time.perf_counter()
            turns, errors, window, replying, counts = await loop.run_in_executor(
                pool, run_clients, url, plans, options, f"{level} user{'s' * (level > 1)}"
            )
            result = LevelResult(
                level,
                plan.turns_per_user(level),
                time.perf_counter() - start,
                turns,
                errors,
                window,
                replying_s=replying,
                event_counts=counts,
            )
            after = await counters() if before is not None else None
            if before is not None and after is not None:
                result.throughput = level_throughput(before, after, counters_source, replying_s=replying)
            if reference is not None:
                start = time.perf_counter()
                result.reference = await asyncio.to_thread(_reference_level, plans, reference, window, level)
                result.reference_wall_s = time.perf_counter() - start
            results.append(result)
            if on_level is not None:
                on_level(result)
    return results


def _reference_level(
    plans: list[UserPlan], reference: Callable[[Speech], Served], window_ms: float | None, level: int
) -> list[QueuedTurn]:
    from tqdm import tqdm

    window = (window_ms if window_ms is not None else DEFAULT_SILENCE_WINDOW_MS) / 1000.0
    total = sum(len(p.speeches) for p in plans)
    with tqdm(total=total, desc=f"reference, {level} user{'s' * (level > 1)}", unit="turn", leave=True) as bar:
        return serve_one_worker(plans, reference, silence_window_s=window, on_done=lambda _turn: bar.update())
