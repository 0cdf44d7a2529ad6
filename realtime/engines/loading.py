"""The server's engines: loaded (:func:`load_engines`, one per GPU with ``data_parallel_size`` > 1) unless the
caller injected them, pooled for admission and watched (:class:`realtime.engines.pool.EnginePool`), announced in the
log, restarted when one fails if they were loaded from the server's configuration
(:class:`realtime.engines.restarts.EngineRestarts`), and closed at shutdown if they were loaded here
(:class:`ServerEngines`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence

from pipeline.api import EngineHandle
from realtime.config import ServerConfig
from realtime.engines.pool import EnginePool, LoadedEngine, check_devices, replica_configs, start_engines
from realtime.engines.restarts import EngineRestarts
from realtime.observe.metrics import ServerMetrics
from realtime.voices import usable_aliases

__all__ = ["ServerEngines", "engine_loader", "load_engine", "load_engines"]

logger = logging.getLogger("realtime.server.app")
"""The server's own logger: these are the server's startup lines."""


def load_engine(config: ServerConfig) -> LoadedEngine:
    """Load ``config.model`` (building the embedded tiny model on first use), with torch set to
    ``config.torch_threads`` CPU threads first. The stage config's ``engine.process`` decides whether the
    engine core runs in a child process (the default on CUDA: it loads the weights there, with the same
    thread count) or on a thread of this one."""
    # Importing silero_vad sets torch's default thread count to 1; import it before our setting.
    import silero_vad  # noqa: F401
    import torch

    from pipeline.embedded import resolve_model
    from pipeline.engine import OmniEngine

    torch.set_num_threads(config.torch_threads)
    path = resolve_model(config.model, config.cache_dir)
    return OmniEngine.from_pretrained(path, config.stage_config, seed=config.seed, torch_threads=config.torch_threads)


def engine_loader(config: ServerConfig) -> Callable[[int], LoadedEngine]:
    """A loader of engine ``i`` of ``config.data_parallel_size`` (``realtime/engines/pool.py``: one per GPU, each in
    its own child process), the same each time it is called: :func:`load_engines` starts them all with it, a restart
    loads one again. Resolves the model and checks the GPUs now."""
    if config.data_parallel_size == 1:
        return lambda index: load_engine(config)
    import silero_vad  # noqa: F401  (as in load_engine: before torch's thread count is set)
    import torch

    from pipeline.config import stage_config_for
    from pipeline.embedded import resolve_model
    from pipeline.engine import OmniEngine

    torch.set_num_threads(config.torch_threads)
    path = resolve_model(config.model, config.cache_dir)
    configs = replica_configs(stage_config_for(path, config.stage_config), config.data_parallel_size)
    check_devices(configs, torch.cuda.device_count)

    def load(index: int) -> LoadedEngine:
        return OmniEngine.from_pretrained(path, configs[index], seed=config.seed, torch_threads=config.torch_threads)

    return load


def load_engines(config: ServerConfig) -> list[LoadedEngine]:
    """Every engine of ``config`` (:func:`engine_loader`), loaded in parallel; all or nothing."""
    return start_engines(engine_loader(config), range(config.data_parallel_size))


class ServerEngines:
    """The engines of one server, from :meth:`start` to :meth:`close`. ``engines``: serve these (the caller keeps
    ownership) instead of loading ``config.data_parallel_size`` engines at :meth:`start`. ``restart``: load a new
    engine from ``config`` in place of one that fails (:mod:`realtime.engines.restarts`); default: when the engines
    are loaded here. The caller that passes its own engines with ``restart`` must have loaded them from ``config``;
    the replacements are closed here, the engines passed in stay the caller's."""

    def __init__(
        self,
        config: ServerConfig,
        engines: Sequence[EngineHandle] | None,
        metrics: ServerMetrics,
        *,
        restart: bool | None = None,
    ) -> None:
        self.config = config
        self.metrics = metrics
        self._engines = tuple(engines) if engines else ()
        self._loaded: tuple[LoadedEngine, ...] = ()
        self._restart = not engines if restart is None else restart
        self._pool: EnginePool | None = None
        self._restarts: EngineRestarts | None = None
        self._loader: Callable[[int], LoadedEngine] | None = None
        self._watch: asyncio.Task | None = None

    @property
    def pool(self) -> EnginePool:
        if self._pool is None:
            raise RuntimeError("the server has not started (its lifespan loads the engines)")
        return self._pool

    async def start(self) -> EnginePool:
        """Load the engines (off the event loop) unless injected, pool them (a failed engine counts in the metrics)
        and announce them in the log; returns the pool."""
        if not self._engines:
            self._loaded = tuple(await asyncio.to_thread(load_engines, self.config))
            self._engines = self._loaded
        engines = self._engines
        config = self.config
        self._pool = EnginePool(
            engines,
            max_sessions=config.max_sessions,
            sessions_per_engine=config.sessions_per_engine,
            probe_timeout_s=config.engine_probe_timeout_s,
            on_failed=self._failed,
        )
        if self._restart:
            self._restarts = EngineRestarts(
                self._pool, self._load_again, on_restarted=lambda index: self.metrics.engine_restarted(str(index))
            )
        self.metrics.observe_engines(self._pool.slots.loads(), self._pool.devices)
        _announce(engines[0], config, self._pool)
        return self._pool

    @property
    def restarts(self) -> EngineRestarts | None:
        """The restarts of failed engines (``None`` when the engines are not restarted)."""
        return self._restarts

    def _failed(self, index: int, sessions: int) -> None:
        self.metrics.engine_failed(str(index))
        if self._restarts is not None:
            self._restarts.engine_failed(index)

    def _load_again(self, index: int) -> EngineHandle:
        """A new engine ``index`` (on a restart thread): the loader is made on first use, as at startup."""
        if self._loader is None:
            self._loader = engine_loader(self.config)
        return self._loader(index)

    def watch(self) -> None:
        """Start the pool's watch (a task, until :meth:`stop_watch`): a failed engine's sessions are ended."""
        self._watch = asyncio.create_task(self.pool.watch(), name="omni-engine-watch")

    async def stop_watch(self) -> None:
        if self._watch is not None:
            self._watch.cancel()
            await asyncio.gather(self._watch, return_exceptions=True)

    async def close(self) -> None:
        """Cancel the pending restarts, close the engines they loaded, and close the engines if :meth:`start`
        loaded them (each joins its thread or process); once."""
        if self._restarts is not None:
            await self._restarts.close()
        loaded, self._loaded, self._engines = self._loaded, (), ()
        await asyncio.gather(*(asyncio.to_thread(engine.close) for engine in loaded))


def _announce(engine: EngineHandle, config: ServerConfig, pool: EnginePool) -> None:
    if engine.random_weights:
        logger.warning(
            "\n%s\n  MODEL %s HAS RANDOM WEIGHTS: a test model, not an assistant.\n"
            "  Its replies are noise. Pass --model PATH_OR_ID for a real checkpoint.\n%s",
            "!" * 78,
            engine.model_name,
            "!" * 78,
        )
    _, unusable = usable_aliases(config.voice_aliases, tuple(engine.voices))
    if not engine.audio_output:
        logger.info("%s has no audio output: it answers in text only", engine.model_name)
    elif unusable:
        logger.warning(
            "voice aliases left out (this model has no such speaker; it has %s): %s",
            ", ".join(engine.voices),
            ", ".join(f"{name}={speaker}" for name, speaker in unusable),
        )
    auth = "API key required" if config.api_key is not None else "NO API KEY (anyone who can connect may use it)"
    scheme = f"{config.http_scheme}:// and {'wss' if config.tls else 'ws'}://"
    if config.tls:
        scheme += f" (TLS, certificate {config.ssl_certfile})"
    logger.info("serving %s over %s: %s, at most %d sessions", engine.model_name, scheme, auth, config.max_sessions)
    engines = len(pool.engines)
    if engines > 1 or config.max_sessions_per_engine is not None:
        logger.info(
            "%d engines (%s), at most %d sessions each",
            engines,
            ", ".join(str(device) for device in pool.devices),
            config.sessions_per_engine,
        )
    if engines > 1 and engines * config.sessions_per_engine > config.max_sessions:
        logger.warning(
            "%d engines share --max-sessions %d: set --max-sessions-per-engine from the calibration (docs/server.md) "
            "and --max-sessions to %d times it to use them all",
            engines,
            config.max_sessions,
            engines,
        )
