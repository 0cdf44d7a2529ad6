"""The server's engines: one, or one per GPU (data parallel, ``--data-parallel-size N``), with their admission
(:class:`realtime.engines.placement.EngineSlots`) and a watch that notices an engine's death.

Starting (:func:`replica_configs`, :func:`start_engines`): engine ``i`` of ``N`` gets the stage config with each
CUDA stage moved onto the GPUs of replica ``i`` (``cuda:k`` -> ``cuda:(i * W + k)``, ``W`` the GPUs one engine uses,
1 unless the stage config spreads the stages), CPU stages stay on the CPU, and its engine core in a child process
of its own (``engine.process`` forced on when N > 1). The engines load in parallel; if one fails to load, the
others are closed and its error is raised.

Watching (:meth:`EnginePool.watch`): every :data:`WATCH_INTERVAL_S` the pool looks at each serving engine's
``closed`` flag (no I/O: an engine process's reader thread sets it the moment the child dies). A closed engine is
marked failed: it takes no new session and each of its sessions is ended (an ``engine_failed`` error event, then a
close). With several engines the pool also reads each one's stats every :data:`STATS_INTERVAL_S`, for the
placement's tie-break (live responses). A failed engine may be replaced (:meth:`EnginePool.restarting`, then
:meth:`EnginePool.replace`); who loads the replacement decides when (``realtime/engines/loading.py``).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import Protocol, TypeVar

from pipeline.api import EngineHandle
from pipeline.config import StageGraphConfig, TalkerConfig, ThinkerConfig, Token2WavConfig
from pipeline.errors import ConfigError, PipelineError
from pipeline.response_events import EngineStats
from realtime.engines.placement import EngineFailed, EngineSlots, EngineState
from realtime.observe.metrics import EngineStatsSource
from realtime.runner import SessionEnd, SessionRunner

logger = logging.getLogger(__name__)

WATCH_INTERVAL_S = 0.1
"""How often the pool checks whether an engine has died (a flag read per engine)."""
STATS_INTERVAL_S = 1.0
"""How often, with several engines, the pool reads each engine's live responses for placement."""
STAGES = ("thinker", "talker", "token2wav")
T = TypeVar("T")
S = TypeVar("S", ThinkerConfig, TalkerConfig, Token2WavConfig)


class LoadedEngine(EngineHandle, Protocol):
    """An engine the server loaded itself (an ``OmniEngine``): its loader closes it. Sessions and the pool never
    close an engine, and engines a caller injects stay the caller's, so ``close`` is not part of ``EngineHandle``."""

    def close(self) -> None:
        """Stop the engine and join its thread or process; idempotent."""
        ...


E = TypeVar("E", bound=LoadedEngine)


def closed(engine: EngineHandle) -> bool:
    """Whether ``engine`` can serve no more (``OmniEngine.closed``: stopped, or its process died)."""
    return bool(getattr(engine, "closed", False))


def engine_device(engine: EngineHandle) -> str | None:
    """The thinker's device of an ``OmniEngine`` (``None`` for an engine that does not say)."""
    cfg = getattr(engine, "cfg", None)
    return getattr(getattr(cfg, "thinker", None), "device", None)


def _cuda_index(device: str) -> int | None:
    if not device.startswith("cuda"):
        return None
    _, _, index = device.partition(":")
    return int(index) if index else 0


def gpus_per_engine(cfg: StageGraphConfig) -> int:
    """How many GPUs one engine of ``cfg`` uses: the highest ``cuda:k`` of its stages plus one (0: CPU only)."""
    indexes = [_cuda_index(cfg.stage(name).device) for name in STAGES]
    used = [index for index in indexes if index is not None]
    return max(used) + 1 if used else 0


def replica_configs(cfg: StageGraphConfig, size: int) -> list[StageGraphConfig]:
    """The stage config of each of ``size`` engines (module docstring); ``[cfg]`` itself when ``size`` is 1."""
    if size < 1:
        raise ConfigError(f"the data parallel size must be >= 1, got {size}", param="data_parallel_size")
    if size == 1:
        return [cfg]
    width = gpus_per_engine(cfg)

    def moved(stage: S, replica: int) -> S:
        index = _cuda_index(stage.device)
        return stage if index is None else replace(stage, device=f"cuda:{replica * width + index}")

    return [
        replace(
            cfg,
            thinker=moved(cfg.thinker, replica),
            talker=moved(cfg.talker, replica),
            token2wav=moved(cfg.token2wav, replica),
            engine=replace(cfg.engine, process=True),
        )
        for replica in range(size)
    ]


def check_devices(configs: Sequence[StageGraphConfig], device_count: Callable[[], int]) -> None:
    """``ConfigError`` when the engines need more GPUs than ``device_count()`` reports."""
    needed = max(gpus_per_engine(cfg) for cfg in configs)  # the highest cuda:k in use, plus one
    if needed and needed > device_count():
        raise ConfigError(
            f"{len(configs)} engines need {needed} GPUs (cuda:0..cuda:{needed - 1}), this machine has "
            f"{device_count()}: lower --data-parallel-size",
            param="data_parallel_size",
        )


def start_engines(start: Callable[[T], E], configs: Sequence[T]) -> list[E]:
    """``start(c)`` for every ``c`` of ``configs`` (stage configs, or engine indexes), in parallel threads (a 7B
    engine takes a while to load); all or nothing: if one raises, the engines that started are closed and the first
    error is raised."""
    if len(configs) == 1:
        return [start(configs[0])]
    with ThreadPoolExecutor(max_workers=len(configs), thread_name_prefix="omni-engine-start") as pool:
        futures = [pool.submit(start, cfg) for cfg in configs]
        failures = [error for future in futures if (error := future.exception()) is not None]
        engines = [future.result() for future in futures if future.exception() is None]
    if failures:
        for engine in engines:
            engine.close()
        raise failures[0]
    return engines


@dataclass(frozen=True)
class EngineProbe:
    """One engine's answer to a stats request: ``responsive`` False when it gave none in time (stuck in a step);
    ``stats`` None when it reports none, is closed, or did not answer."""

    index: int
    state: EngineState
    responsive: bool
    stats: EngineStats | None


class EnginePool:
    """The engines one server serves from, their admission and their watch (module docstring).

    ``devices``: each engine's device, for ``/healthz`` and ``/metrics`` (default: the engines' own thinker
    device). ``on_failed(index, sessions)``: called once when engine ``index`` is marked failed."""

    def __init__(
        self,
        engines: Sequence[EngineHandle],
        *,
        max_sessions: int,
        sessions_per_engine: int,
        probe_timeout_s: float,
        on_failed: Callable[[int, int], None] | None = None,
    ) -> None:
        self.devices = tuple(engine_device(engine) for engine in engines)
        self.slots: EngineSlots[EngineHandle] = EngineSlots(
            engines, max_sessions=max_sessions, capacity=sessions_per_engine
        )
        self.probe_timeout_s = probe_timeout_s
        self._on_failed = on_failed

    @property
    def engines(self) -> tuple[EngineHandle, ...]:
        """The engine at each index now (a replaced one's successor)."""
        return self.slots.engines

    def restarting(self, index: int) -> None:
        """Failed engine ``index`` is being replaced (``/healthz`` shows it; it takes no session yet)."""
        self.slots.restarting(index)

    def replace(self, index: int, engine: EngineHandle) -> None:
        """``engine`` serves in place of failed engine ``index`` (same devices) from now on."""
        self.slots.replace(index, engine)
        logger.info("engine %d (%s) restarted: serving again", index, self.devices[index])

    def check(self) -> None:
        """Mark every engine that has closed (died) failed; cheap, no I/O."""
        for index, engine in enumerate(self.engines):
            if self.slots.state(index) is EngineState.SERVING and closed(engine):
                sessions = self.slots.fail(index)
                logger.error("engine %d (%s) failed: %d sessions ended", index, self.devices[index], sessions)
                if self._on_failed is not None:
                    self._on_failed(index, sessions)

    async def watch(self) -> None:
        """Run until cancelled: :meth:`check` every :data:`WATCH_INTERVAL_S`, and with several engines read their
        live responses every :data:`STATS_INTERVAL_S` (for placement)."""
        ticks_per_stats = round(STATS_INTERVAL_S / WATCH_INTERVAL_S)
        tick = 0
        while True:
            self.check()
            if len(self.engines) > 1 and tick % ticks_per_stats == 0:
                await self.probe()
            tick += 1
            await asyncio.sleep(WATCH_INTERVAL_S)

    async def probe(self) -> list[EngineProbe]:
        """Every engine's stats within ``probe_timeout_s``, asked at once (each answer also updates the placement's
        live responses)."""
        self.check()
        return list(await asyncio.gather(*(self._probe(i) for i in range(len(self.engines)))))

    async def _probe(self, index: int) -> EngineProbe:
        engine, state = self.engines[index], self.slots.state(index)
        if state is not EngineState.SERVING or not isinstance(engine, EngineStatsSource):
            return EngineProbe(index, state, True, None)
        try:
            stats = await asyncio.wait_for(engine.stats(), self.probe_timeout_s)
        except TimeoutError:
            logger.error(
                "engine %d answered no stats request within %.1f s: it is stuck inside a step",
                index,
                self.probe_timeout_s,
            )
            return EngineProbe(index, state, False, None)
        except PipelineError as exc:  # closed or died between the check and the call: the next check shows it
            logger.info("engine %d stats unavailable: %s", index, exc)
            return EngineProbe(index, state, True, None)
        self.slots.report_responses(index, stats.responses)
        return EngineProbe(index, state, True, stats)


def total_stats(stats: Sequence[EngineStats]) -> EngineStats | None:
    """The field-by-field sum of several engines' stats (``None`` for none): what the server holds in all."""
    if not stats:
        return None
    if len(stats) == 1:
        return stats[0]
    return EngineStats(**{f.name: sum(getattr(s, f.name) for s in stats) for f in dataclasses.fields(EngineStats)})


def end_on_engine_failure(runner: SessionRunner, index: int) -> None:
    """End ``runner``'s session because engine ``index`` failed: an ``engine_failed`` error event, then a close."""
    runner.end_for(
        SessionEnd.ENGINE_FAILED,
        EngineFailed(
            f"engine {index}, which served this session, failed; its conversation is lost: reconnect for a new "
            "session on another engine"
        ),
    )
