"""Restarting a failed engine that the server loaded from its own configuration.

When the pool marks engine ``i`` failed (its process died: its sessions are being ended), :class:`EngineRestarts`
closes it (joining its threads, reaping its process) and, after a delay, loads a new engine ``i`` with the same
stage config and devices (``load(i)``, on a thread); while that loads the engine is ``restarting`` and takes no
session, then the new one serves new sessions (``EnginePool.replace``). The delay grows with the failures in a row of
that engine, :data:`RESTART_DELAYS_S` (the last one repeats); a failure more than :data:`STABLE_S` after the engine's
last start begins a new row. A load that raises counts as a failure and is retried the same way.

Ownership and cancellation: one task per engine being restarted, owned here; :meth:`EngineRestarts.close` cancels
them. A load cannot be interrupted: one still running on its thread when its task is cancelled has its engine closed
as soon as it is loaded. Every engine loaded here is closed by :meth:`EngineRestarts.close` (the server's shutdown).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence

from pipeline.api import EngineHandle
from realtime.engines.pool import EnginePool

logger = logging.getLogger(__name__)

RESTART_DELAYS_S = (1.0, 10.0, 60.0, 300.0)
"""Seconds before loading a failed engine again, by its failures in a row (the first, the second, ...)."""
STABLE_S = 600.0
"""An engine that served this long since it started has its failures in a row forgotten."""


class EngineRestarts:
    """Replaces the pool's failed engines with newly loaded ones (module docstring). Used from the event loop.

    ``load(index)``: a new engine ``index`` (blocking; runs on a thread). ``on_restarted(index)``: called once the
    new engine serves."""

    def __init__(
        self,
        pool: EnginePool,
        load: Callable[[int], EngineHandle],
        *,
        on_restarted: Callable[[int], None] = lambda index: None,
        delays_s: Sequence[float] = RESTART_DELAYS_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not delays_s or min(delays_s) < 0:
            raise ValueError(f"restart delays must be a non-empty list of seconds >= 0, got {delays_s!r}")
        self._pool = pool
        self._load = load
        self._on_restarted = on_restarted
        self._delays_s = tuple(delays_s)
        self._clock = clock
        count = len(pool.engines)
        self._in_row = [0] * count
        self._started_at = [clock()] * count
        self._tasks: dict[int, asyncio.Task] = {}
        self._loaded: list[EngineHandle] = []
        self._closed = False

    @property
    def pending(self) -> tuple[int, ...]:
        """The engines being restarted now."""
        return tuple(sorted(self._tasks))

    def engine_failed(self, index: int) -> None:
        """Engine ``index`` was marked failed: restart it (once per failure; nothing after :meth:`close`)."""
        if self._closed or index in self._tasks:
            return
        if self._clock() - self._started_at[index] > STABLE_S:
            self._in_row[index] = 0
        self._tasks[index] = asyncio.create_task(self._restart(index), name=f"omni-engine-restart-{index}")

    async def _restart(self, index: int) -> None:
        try:
            await asyncio.to_thread(_close, self._pool.engines[index], index)
            while True:
                delay = self._delays_s[min(self._in_row[index], len(self._delays_s) - 1)]
                self._in_row[index] += 1
                logger.warning(
                    "engine %d: loading a new one in %.0f s (failure %d in a row)", index, delay, self._in_row[index]
                )
                await asyncio.sleep(delay)
                self._pool.restarting(index)
                try:
                    engine = await self._load_owned(index)
                except Exception:  # noqa: BLE001 - logged; the next attempt comes after the next delay
                    logger.exception("engine %d: loading a new one failed", index)
                    continue
                self._started_at[index] = self._clock()
                self._pool.replace(index, engine)
                self._on_restarted(index)
                return
        finally:
            self._tasks.pop(index, None)

    async def _load_owned(self, index: int) -> EngineHandle:
        """``load(index)`` on a thread; the engine is recorded for :meth:`close`, also when the wait is cancelled."""
        future = asyncio.get_running_loop().run_in_executor(None, self._load, index)
        future.add_done_callback(self._record_loaded)
        return await asyncio.shield(future)

    def _record_loaded(self, future: asyncio.Future) -> None:
        if future.cancelled() or future.exception() is not None:
            return
        engine = future.result()
        if self._closed:  # the server stopped while it loaded
            _close(engine, None)
        else:
            self._loaded.append(engine)

    async def close(self) -> None:
        """Cancel the pending restarts and close every engine loaded here (the server's shutdown); once."""
        self._closed = True
        tasks = list(self._tasks.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        loaded, self._loaded = self._loaded, []
        await asyncio.gather(*(asyncio.to_thread(_close, engine, None) for engine in loaded))


def _close(engine: EngineHandle, index: int | None) -> None:
    """Close ``engine`` (idempotent for ``OmniEngine``), logging rather than raising: a failed engine's close may
    find its process already gone."""
    close = getattr(engine, "close", None)
    if close is None:
        return
    try:
        close()
    except Exception:  # noqa: BLE001 - logged; the engine is discarded either way
        logger.exception("closing engine %s failed", "(loading when the server stopped)" if index is None else index)
