"""What a running server reports about itself: ``GET /healthz`` and ``GET /metrics`` (:func:`health_routes`), both
unauthenticated, neither showing content of any session.

``/healthz`` (:meth:`ServerHealth.probe`) answers JSON with status 200, or 503 once no engine serves and answers.
``/metrics`` (:meth:`ServerHealth.scrape`) answers Prometheus text; each scrape first asks every engine for its
stats (at once, each within the pool's probe timeout) and samples the hygiene gauges (:meth:`ServerHealth.hygiene`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Protocol

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from pipeline.response_events import EngineStats
from realtime.engines.placement import EngineState
from realtime.engines.pool import EnginePool, EngineProbe, closed, total_stats
from realtime.observe.metrics import CONTENT_TYPE as METRICS_CONTENT_TYPE
from realtime.observe.metrics import Hygiene, ServerMetrics, process_memory
from realtime.runner import live_session_tasks

__all__ = ["CallCounts", "ServerHealth", "health_routes", "kv_capacity"]


class CallCounts(Protocol):
    """What health and hygiene read of the WebRTC endpoint."""

    @property
    def live_calls(self) -> int:
        """Calls whose peer connection is open."""
        ...

    @property
    def open_peers(self) -> int:
        """Peer connections created and not closed (hygiene: zero without calls)."""
        ...

    @property
    def outbound_events(self) -> int:
        """Server events waiting to be sent, over all calls."""
        ...


class ServerHealth:
    """The reports of one started server: its ``pool`` of engines, ``metrics``, WebRTC endpoint (``webrtc``, None
    without one) and ``websocket_outbound``, the server events waiting to be sent over every WebSocket session."""

    def __init__(
        self,
        pool: EnginePool,
        metrics: ServerMetrics,
        webrtc: CallCounts | None,
        websocket_outbound: Callable[[], int],
    ) -> None:
        self.pool, self.metrics, self.webrtc = pool, metrics, webrtc
        self._websocket_outbound = websocket_outbound

    async def hygiene(self, probes: list[EngineProbe] | None = None) -> Hygiene:
        """What the server holds now (the ``/metrics`` hygiene gauges; tests check it after faults). ``engine``:
        the sum over the engines that reported (``probes``: reuse these instead of asking again)."""
        probes = probes if probes is not None else await self.pool.probe()
        webrtc = self.webrtc
        return Hygiene(
            sessions=self.pool.slots.active,
            session_tasks=live_session_tasks(),
            loop_tasks=len(asyncio.all_tasks()),
            webrtc_peers=webrtc.open_peers if webrtc is not None else 0,
            outbound_events=self._websocket_outbound() + (webrtc.outbound_events if webrtc is not None else 0),
            engine=total_stats([probe.stats for probe in probes if probe.stats is not None]),
            memory=process_memory(),
        )

    async def probe(self) -> dict:
        """:meth:`report` with each engine's ``responsive`` (it answered a stats request within
        ``engine_probe_timeout_s``: not stuck inside a step) and, from its answer, ``kv`` (:func:`kv_capacity`),
        ``engine_responsive`` (every serving engine is); ``ok``: at least one engine serves and is responsive."""
        probes = await self.pool.probe()
        health = self.report()
        for engine, probe in zip(health["engines"], probes, strict=True):
            engine["responsive"] = probe.responsive
            if probe.stats is not None and probe.stats.kv_slots:
                engine["kv"] = kv_capacity(probe.stats)
        serving = [probe for probe in probes if probe.state is EngineState.SERVING]
        health["engine_responsive"] = all(probe.responsive for probe in serving)
        health["ok"] = any(probe.responsive for probe in serving)
        return health

    def report(self) -> dict:
        """``ok`` is false while no engine serves: each is closed (stopped, or its child process died) or being
        restarted. The server stays up, refusing sessions, meanwhile. ``engines``: each engine's ``state``
        (``serving``, ``failed`` or ``restarting``), ``device``, live ``sessions`` and ``max_sessions``."""
        pool, slots, webrtc = self.pool, self.pool.slots, self.webrtc
        first = pool.engines[0]  # every engine serves the same model
        return {
            "ok": any(
                slots.state(index) is EngineState.SERVING and not closed(engine)
                for index, engine in enumerate(pool.engines)
            ),
            "model": first.model_name,
            "random_weights": first.random_weights,
            "sessions": slots.active,
            "max_sessions": slots.limit,
            "webrtc": webrtc is not None,
            "calls": webrtc.live_calls if webrtc is not None else 0,
            "engines": [
                {
                    "engine": index,
                    "device": pool.devices[index],
                    "state": str(slots.state(index)),
                    "sessions": slots.sessions(index),
                    "max_sessions": slots.capacity,
                }
                for index in range(len(pool.engines))
            ],
        }

    async def scrape(self) -> bytes:
        """The ``/metrics`` body: the engines' stats and the hygiene gauges sampled now, then rendered."""
        probes = await self.pool.probe()
        self.metrics.observe_hygiene(await self.hygiene(probes))
        self.metrics.observe_engines(self.pool.slots.loads(), self.pool.devices, [probe.stats for probe in probes])
        return self.metrics.render()


def kv_capacity(stats: EngineStats) -> dict:
    """What an engine's KV pools hold, as resolved at load: ``slots`` (conversations whose thinker cache stays on the
    device), ``talker_slots`` (spoken replies at once), ``positions_per_slot`` (a conversation's longest context)."""
    return {
        "slots": stats.kv_slots,
        "talker_slots": stats.talker_kv_slots,
        "positions_per_slot": stats.kv_capacity_tokens // stats.kv_slots,
    }


def health_routes(health: Callable[[], ServerHealth]) -> list[Route]:
    """``GET /healthz`` and ``GET /metrics`` over the started server's ``health()``."""

    async def healthz(request: Request) -> Response:
        report = await health().probe()
        return JSONResponse(report, status_code=200 if report["ok"] else 503)

    async def metrics(request: Request) -> Response:
        return Response(await health().scrape(), media_type=METRICS_CONTENT_TYPE)

    return [Route("/healthz", healthz, methods=["GET"]), Route("/metrics", metrics, methods=["GET"])]
