"""The concurrency sweep: at each level, N simulated users talk to one server at the same time.

The users of a level run in child processes (``spawn``; ``client_processes`` of them, users dealt round-robin:
:mod:`realtime.bench.workers`), so the measuring clients never share an event loop or an interpreter lock with an
in-process server they measure, nor, with enough processes, fall behind real time themselves; the parent only
serves.
After each level (or each of ``SweepPlan.reference_levels``) the reference serves the same users' turns
(:func:`realtime.bench.reference.serve_one_worker`), so the level's result holds both, and is handed to ``on_level``
at once (the report is rewritten after every level: an interrupted sweep keeps what it measured).

User *u* of *N* starts ``ramp_s · u / N`` seconds into the level (arrivals spread over the ramp, not
all in the same instant), speaks the files of the folder in turn starting at file *u* (users say
different things), and runs ``max(turns, ceil(min_samples / N))`` turns, so low levels still give
enough samples for percentiles.

Around each level's users (not the reference) the sweep snapshots the engine's cumulative
counters (``counters``: the in-process engine's, or a remote server's ``/metrics``) and keeps the
stage rates and device memory of the window (:mod:`realtime.bench.throughput`); with ``camera_frames``, likewise
the server's count of received camera frames by outcome (:func:`realtime.bench.camera.scrape_camera_frames`).

The children are started with ``spawn`` (no fork of a process holding CUDA and an engine thread), so a
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

from realtime.bench.client import ClientOptions, ClientTransport, UserPlan
from realtime.bench.metrics import TurnMetrics
from realtime.bench.reference import QueuedTurn, Served, serve_one_worker
from realtime.bench.speech import Speech
from realtime.bench.throughput import (
    EngineCounters,
    LevelThroughput,
    ReferenceThroughput,
    level_throughput,
    reference_throughput,
)
from realtime.bench.workers import LevelClients, merge_shares, run_share, split_plans

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
    """Turns of the warm-up users (and reference runs) before the first level, not recorded."""
    warmup_users: int = 1
    """Users warming up at once: one per engine of the server, so that placement by headroom gives every engine its
    first replies (cold paths: first kernel launches, allocator growth) before any level is measured."""
    reference_levels: frozenset[int] | None = None
    """The levels after which the reference (when there is one) serves the users' turns; None: every level."""

    def __post_init__(self) -> None:
        if not self.levels or any(level < 1 for level in self.levels):
            raise ValueError(f"concurrency levels must be positive integers, got {self.levels}")
        if self.turns < 1 or self.min_samples < 0 or self.barge_in_every < 0 or self.warmup_turns < 0:
            raise ValueError("turns must be >= 1; min_samples, barge_in_every and warmup_turns >= 0")
        if self.ramp_s < 0:
            raise ValueError(f"ramp_s must be >= 0, got {self.ramp_s}")
        if self.warmup_users < 1:
            raise ValueError(f"warmup_users must be >= 1, got {self.warmup_users}")
        if self.reference_levels is not None and not self.reference_levels <= set(self.levels):
            raise ValueError(f"reference levels {sorted(self.reference_levels)} must be among {self.levels}")

    def turns_per_user(self, level: int) -> int:
        return max(self.turns, math.ceil(self.min_samples / level))

    def references(self, level: int) -> bool:
        """Whether the reference (when the run has one) serves ``level``'s turns."""
        return self.reference_levels is None or level in self.reference_levels


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
    client_processes: list[dict] = field(default_factory=list)
    """Each client worker's users, event-loop lag and CPU time (:meth:`realtime.bench.workers.ClientShare.stats`):
    a lagging worker means the measurement itself fell behind."""
    camera_frames: dict[str, int] | None = None
    """WebRTC camera frames the server received during the level, by outcome
    (:data:`realtime.media.video_settings.CAMERA_OUTCOMES`); None: not measured (no ``--camera``, or no
    ``/metrics``)."""

    def reference_metrics(self) -> list[TurnMetrics]:
        return [q.metrics() for q in self.reference or ()]

    def reference_throughput(self) -> ReferenceThroughput | None:
        return reference_throughput(self.reference) if self.reference else None


_CLIENT_MODULES = ("tqdm", "realtime.bench.client", "realtime.bench.workers")
_WEBRTC_MODULES = ("aiortc", "realtime.transports.media")


def _child_ready(modules: tuple[str, ...]) -> None:
    """Worker-process entry: import what :func:`realtime.bench.workers.run_share` needs."""
    for module in modules:
        importlib.import_module(module)


STARTUP_MARGIN_S = 0.5
"""A level's client workers start their users this long after the level is dispatched, all at the same instant."""


async def _run_level_clients(
    pool: ProcessPoolExecutor, url: str, plans: list[UserPlan], options: ClientOptions, label: str, processes: int
) -> LevelClients:
    """The level's users, spread over ``processes`` workers of ``pool`` (:mod:`realtime.bench.workers`)."""
    loop = asyncio.get_running_loop()
    shares = split_plans(plans, processes)
    start_at = time.monotonic() + STARTUP_MARGIN_S if len(shares) > 1 else None
    runs = [
        loop.run_in_executor(
            pool,
            run_share,
            url,
            share,
            options,
            start_at,
            f"{label} [{i + 1}/{len(shares)}]" if len(shares) > 1 else label,
            i,
        )
        for i, share in enumerate(shares)
    ]
    return merge_shares(await asyncio.gather(*runs), jitter_ms=options.jitter_ms)


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
    client_processes: int = 1,
    camera_frames: Callable[[], Awaitable[dict[str, int] | None]] | None = None,
) -> list[LevelResult]:
    """Run every level against the server at ``url`` (which this event loop may be serving), the
    reference after each. Levels run in order; ``on_level`` gets each result as soon as it is
    complete. ``counters`` snapshots the server's engine counters (``None``: no throughput), named
    ``counters_source`` in the results. Each level's users are spread over ``client_processes`` worker processes
    (fewer when the level has fewer users). ``camera_frames`` snapshots the server's cumulative camera frame counts
    (``None``: not measured)."""
    loop = asyncio.get_running_loop()
    results = []
    if client_processes < 1:
        raise ValueError(f"client_processes must be at least 1, got {client_processes}")
    with ProcessPoolExecutor(client_processes, mp_context=get_context("spawn")) as pool:
        # start the children (interpreter, imports) before any level's window opens
        modules = _CLIENT_MODULES + (_WEBRTC_MODULES if options.transport is ClientTransport.WEBRTC else ())
        await asyncio.gather(*(loop.run_in_executor(pool, _child_ready, modules) for _ in range(client_processes)))
        if plan.warmup_turns:
            warm = user_plans(speeches, plan.warmup_users, plan, turns=plan.warmup_turns)
            await _run_level_clients(pool, url, warm, options, "warm-up", min(client_processes, plan.warmup_users))
            if reference is not None:
                await asyncio.to_thread(reference, speeches[0])
        for level in plan.levels:
            plans = user_plans(speeches, level, plan)
            log.info("bench level %d: %d users start", level, level)  # scripts/first_audio_path.py splits here
            before = await counters() if counters is not None else None
            frames_before = await camera_frames() if camera_frames is not None else None
            start = time.perf_counter()
            clients = await _run_level_clients(
                pool, url, plans, options, f"{level} user{'s' * (level > 1)}", client_processes
            )
            result = LevelResult(
                level,
                plan.turns_per_user(level),
                time.perf_counter() - start,
                clients.turns,
                clients.errors,
                clients.silence_window_ms,
                replying_s=clients.replying_s,
                event_counts=clients.counts,
                client_processes=clients.processes,
            )
            after = await counters() if counters is not None and before is not None else None
            if before is not None and after is not None:
                result.throughput = level_throughput(before, after, counters_source, replying_s=clients.replying_s)
            frames_after = await camera_frames() if camera_frames is not None and frames_before is not None else None
            if frames_before is not None and frames_after is not None:
                result.camera_frames = {k: frames_after.get(k, 0) - v for k, v in frames_before.items()}
            if reference is not None and plan.references(level):
                start = time.perf_counter()
                result.reference = await asyncio.to_thread(
                    _reference_level, plans, reference, clients.silence_window_ms, level
                )
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
