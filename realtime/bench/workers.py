"""A level's simulated users spread over client worker processes, so the measuring side is never its own bottleneck.

A WebRTC user costs its process real CPU every 20 ms (Opus encode of the microphone, SRTP, RTP and jitter-buffer
handling, Opus decode of the reply, all driven by one event loop), so one process holding every user of a high level
lags behind real time and the lag shows up as server latency. :func:`split_plans` deals a level's users round-robin
over ``processes`` shares; :func:`run_share` (a worker-process entry) runs one share on its own event loop and returns
what it observed (:class:`ClientShare`: raw turn logs, its loop lag and CPU time); :func:`merge_shares` joins the
shares into one level's figures.

Every share starts its users at the same instant, ``start_at`` on ``time.monotonic`` (the system-wide monotonic clock
that ``asyncio``'s loop clock also reads), so the users' ramp is the one planned whatever the worker's start-up took;
every time a user writes down is on that clock too, so logs from different processes compare directly.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from realtime.bench.client import ClientOptions, ClientTransport, UserPlan, import_webrtc, run_users
from realtime.bench.metrics import TurnLog, TurnMetrics, turn_metrics
from realtime.bench.throughput import replying_seconds
from realtime.observe.loop_lag import LagSummary, LoopLagProbe


@dataclass
class ClientShare:
    """What one worker process observed: its users' turns (by user, then turn), the server's ``error`` events, the
    sessions' VAD silence window, the counted events, its event loop's lag over the run, and its CPU seconds (all
    threads) over the run."""

    logs: list[TurnLog]
    errors: list[dict]
    silence_window_ms: float | None
    counts: dict[str, int]
    loop_lag: LagSummary
    cpu_s: float
    wall_s: float
    users: int

    def stats(self) -> dict:
        """Its load figures (``results.json``: ``client_processes``)."""
        return {
            "users": self.users,
            "loop_lag_ms": self.loop_lag.to_dict(),
            "cpu_s": round(self.cpu_s, 3),
            "wall_s": round(self.wall_s, 3),
        }


@dataclass
class LevelClients:
    """A level's figures over every share (:func:`merge_shares`)."""

    turns: list[TurnMetrics]
    errors: list[dict]
    silence_window_ms: float | None
    replying_s: float
    counts: dict[str, int]
    processes: list[dict] = field(default_factory=list)
    """Each share's :meth:`ClientShare.stats`."""


def split_plans(plans: Sequence[UserPlan], processes: int) -> list[list[UserPlan]]:
    """Deal ``plans`` round-robin over at most ``processes`` non-empty shares (user *u* to share ``u % processes``,
    so each share's users are spread over the whole ramp)."""
    if processes < 1:
        raise ValueError(f"client processes must be at least 1, got {processes}")
    shares = [list(plans[i::processes]) for i in range(min(processes, len(plans)))]
    return [share for share in shares if share]


def run_share(
    url: str, plans: list[UserPlan], options: ClientOptions, start_at: float | None, label: str | None, position: int
) -> ClientShare:
    """Worker-process entry: wait until ``start_at`` (``time.monotonic``; ``None``: now), run ``plans`` on a fresh
    event loop with a loop-lag probe, and return what was observed. ``label``: show a progress bar (one per worker,
    at line ``position``)."""
    if options.transport is ClientTransport.WEBRTC:
        import_webrtc()
    if start_at is not None:
        time.sleep(max(0.0, start_at - time.monotonic()))
    return asyncio.run(_run_share(url, plans, options, label, position))


async def _run_share(
    url: str, plans: list[UserPlan], options: ClientOptions, label: str | None, position: int
) -> ClientShare:
    bar = None
    if label is not None:
        from tqdm import tqdm

        bar = tqdm(total=sum(len(p.speeches) for p in plans), desc=label, unit="turn", leave=True, position=position)
    probe = LoopLagProbe()
    probe.start()
    cpu0, wall0 = time.process_time(), time.monotonic()
    try:
        run = await run_users(url, plans, options, on_turn=(lambda _log: bar.update()) if bar is not None else None)
    finally:
        await probe.stop()
        if bar is not None:
            bar.close()
    return ClientShare(
        run.logs,
        run.errors,
        run.silence_window_ms,
        run.counts,
        probe.summary(),
        time.process_time() - cpu0,
        time.monotonic() - wall0,
        len(plans),
    )


def merge_shares(shares: Sequence[ClientShare], *, jitter_ms: float) -> LevelClients:
    """One level's figures from its shares: turns by user, errors, the silence window when every share saw the same
    one, the seconds with any reply in flight over all users, counts summed."""
    logs = sorted((log for share in shares for log in share.logs), key=lambda log: (log.user, log.turn))
    windows = {share.silence_window_ms for share in shares}
    counts: dict[str, int] = {}
    for share in shares:
        for name, value in share.counts.items():
            counts[name] = counts.get(name, 0) + value
    return LevelClients(
        [turn_metrics(log, jitter_ms=jitter_ms) for log in logs],
        [error for share in shares for error in share.errors],
        windows.pop() if len(windows) == 1 else None,
        replying_seconds(logs),
        counts,
        [share.stats() for share in shares],
    )
