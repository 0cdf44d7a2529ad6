"""Restarting failed engines (``realtime/engines/restarts.py``) over an engine pool of stand-in engines: no model."""

from __future__ import annotations

import asyncio
import logging
import threading

import pytest

from realtime.engines.placement import EngineState
from realtime.engines.pool import EnginePool
from realtime.engines.restarts import STABLE_S, EngineRestarts


class Engine:
    """An engine as the pool sees it: ``closed`` once its process died or it was closed."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.closed = False
        self.close_calls = 0

    def close(self) -> None:
        self.close_calls += 1
        self.closed = True


def pool_of(*engines: Engine, restarts: list) -> EnginePool:
    return EnginePool(
        engines,
        max_sessions=8,
        sessions_per_engine=4,
        probe_timeout_s=1.0,
        on_failed=lambda index, sessions: restarts[0].engine_failed(index),
    )


async def until(predicate, timeout: float = 5.0) -> None:
    async with asyncio.timeout(timeout):
        while not predicate():
            await asyncio.sleep(0.01)


def die(pool: EnginePool, index: int) -> None:
    """Engine ``index``'s process dies; the pool's watch notices."""
    pool.engines[index].closed = True
    pool.check()


async def test_a_failed_engine_is_closed_and_a_new_one_serves_in_its_place():
    a, b, loaded, restarted, holder = Engine("a"), Engine("b"), [], [], []
    pool = pool_of(a, b, restarts=holder)

    def load(index: int) -> Engine:
        loaded.append(Engine(f"new {index}"))
        return loaded[-1]

    holder.append(EngineRestarts(pool, load, on_restarted=restarted.append, delays_s=(0.0,)))
    session, ended = pool.slots.admit(), []
    session.on_engine_failure(lambda: ended.append("session"))
    assert session.engine is a
    die(pool, 0)
    assert ended == ["session"] and holder[0].pending == (0,)
    await until(lambda: restarted == [0])
    assert a.close_calls == 1 and pool.engines == (loaded[0], b) and pool.slots.state(0) is EngineState.SERVING
    assert pool.slots.admit().engine is loaded[0]  # new sessions go to the new engine
    assert holder[0].pending == ()
    session.release()
    await holder[0].close()
    assert loaded[0].close_calls == 1 and b.close_calls == 0  # what was loaded here is closed here, only that


async def test_a_load_that_fails_is_retried_after_the_next_delay(caplog):
    a, attempts, restarted, holder = Engine("a"), [], [], []
    pool = pool_of(a, restarts=holder)
    loop = asyncio.get_running_loop()

    def load(index: int) -> Engine:
        attempts.append(loop.time())
        if len(attempts) == 1:
            raise RuntimeError("out of memory")
        return Engine("new")

    holder.append(EngineRestarts(pool, load, on_restarted=restarted.append, delays_s=(0.0, 0.2)))
    die(pool, 0)
    assert pool.slots.admit().code == "no_engine_available"
    await until(lambda: restarted == [0])
    assert len(attempts) == 2 and attempts[1] - attempts[0] >= 0.2
    assert "engine 0: loading a new one failed" in caplog.text and "out of memory" in caplog.text
    await holder[0].close()


async def test_failures_in_a_row_wait_longer_until_the_engine_has_served_a_while(caplog):
    now, restarted, holder = [0.0], [], []
    pool = pool_of(Engine("a"), restarts=holder)
    holder.append(
        EngineRestarts(
            pool, lambda index: Engine("new"), on_restarted=restarted.append, delays_s=(0.0, 0.0), clock=lambda: now[0]
        )
    )
    caplog.set_level(logging.WARNING, logger="realtime.engines.restarts")
    for expected in (1, 2, 3):
        die(pool, 0)
        await until(lambda n=expected: len(restarted) == n)
        assert f"(failure {expected} in a row)" in caplog.records[-1].getMessage()
    now[0] += STABLE_S + 1  # the last one served long enough
    die(pool, 0)
    await until(lambda: len(restarted) == 4)
    assert "(failure 1 in a row)" in caplog.records[-1].getMessage()
    await holder[0].close()


async def test_stopping_while_an_engine_loads_closes_it_once_loaded():
    gate, made, holder = threading.Event(), [], []
    pool = pool_of(Engine("a"), restarts=holder)

    def load(index: int) -> Engine:
        assert gate.wait(5.0)
        made.append(Engine("late"))
        return made[-1]

    holder.append(EngineRestarts(pool, load, delays_s=(0.0,)))
    die(pool, 0)
    await until(lambda: pool.slots.state(0) is EngineState.RESTARTING)
    await holder[0].close()
    assert holder[0].pending == ()
    gate.set()
    await until(lambda: made and made[0].close_calls == 1)
    assert pool.slots.state(0) is EngineState.RESTARTING  # never placed
    holder[0].engine_failed(0)  # nothing restarts after close
    assert holder[0].pending == ()


def test_restart_delays_must_be_seconds():
    for bad in ((), (1.0, -1.0)):
        with pytest.raises(ValueError, match="restart delays"):
            EngineRestarts(pool_of(Engine("a"), restarts=[]), lambda index: Engine("x"), delays_s=bad)
