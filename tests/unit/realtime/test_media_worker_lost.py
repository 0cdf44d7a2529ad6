"""A call whose media worker dies ends FAILED, whichever side of the server notices first (without processes).

Two things see a worker die: the pool's reader, when the wire reaches its end, and the call's session, when its writer
drains the broken wire. Both orders are forced here on a real :class:`WorkerCalls`, :class:`MediaWorkerPool` and
session runner, over a fake worker link."""

from __future__ import annotations

import asyncio
import json

import pytest

from realtime.runner import SessionEnd
from realtime.transports.media_workers import messages as m
from realtime.transports.media_workers import pool as pool_module
from realtime.transports.media_workers.pool import WorkerLink
from realtime.transports.webrtc import WebRTCCalls
from realtime.transports.webrtc.worker_media import RemoteCall, WorkerCalls
from tests.fakes import FakeEngine, FakeTurnDetector

pytestmark = pytest.mark.timeout(20)


class _Wire:
    """The server's end of a worker's wire. After :meth:`die` (the worker's process is gone) draining raises, as
    asyncio's stream does once the socket broke; ``end_at_close``: the call's end when the pool closed this end."""

    def __init__(self) -> None:
        self.sent: list[object] = []
        self.closing = False
        self.dead = False
        self.call: RemoteCall | None = None
        self.end_at_close: SessionEnd | None = None

    def die(self) -> None:
        self.dead = True

    def send(self, message: object) -> None:
        if not self.closing:
            self.sent.append(message)

    async def drain(self) -> None:
        if self.dead:
            raise ConnectionResetError("Connection lost")

    async def close(self) -> None:
        self.closing = True
        self.end_at_close = self.call.runner.end if self.call is not None else None


class _Process:
    pid = 4242
    exitcode = -9

    def join(self, timeout: float | None = None) -> None:
        pass


async def _until(predicate, timeout: float = 5.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not predicate():
        assert loop.time() < deadline, "condition not met in time"
        await asyncio.sleep(0.005)


async def _answered_call(monkeypatch) -> tuple[WorkerCalls, WorkerLink, _Wire, RemoteCall]:
    """A connected call on one fake worker, its data channel not open yet (the session's writer waits for it)."""
    monkeypatch.setattr(pool_module, "RESTART_DELAY_S", 3600.0)  # no real worker is started in these tests
    calls = WorkerCalls(WebRTCCalls(FakeEngine(), turn_detector_factory=lambda: FakeTurnDetector), 1)
    wire = _Wire()
    link = WorkerLink(0, _Process(), wire)
    link.ready.set()
    calls.pool.workers[0] = link
    answering = asyncio.ensure_future(calls.create_call("v=0\r\n"))
    await _until(lambda: any(isinstance(message, m.Answer) for message in wire.sent))
    (call,) = calls.calls()
    wire.call = call
    calls.pool._on_message(m.Answered(call.id, "v=0 answer"))
    await answering
    calls.pool._on_message(m.Connected(call.id))
    return calls, link, wire, call


async def test_the_session_finding_the_wire_broken_first_still_ends_failed(monkeypatch):
    calls, link, wire, call = await _answered_call(monkeypatch)
    try:
        wire.die()
        calls.pool._on_message(m.ChannelOpen(call.id))  # the writer sends session.created: its drain breaks
        await _until(lambda: call.runner.end is not None)
        assert call.runner.end is SessionEnd.FAILED
        await calls.pool._lost(link)  # the pool's reader sees the wire's end only now
        await _until(lambda: calls.live_calls == 0)
        assert call.runner.end is SessionEnd.FAILED and calls.pool.deaths == 1
        assert not any(isinstance(message, m.Hangup) for message in wire.sent)  # no hang-up waits on a dead worker
    finally:
        await calls.close()


async def test_the_pools_notice_first_ends_the_call_failed_before_the_wire_is_closed(monkeypatch):
    calls, link, wire, call = await _answered_call(monkeypatch)
    try:
        calls.pool._on_message(m.ChannelOpen(call.id))
        await _until(lambda: any(isinstance(message, m.ChannelSend) for message in wire.sent))
        created = json.loads(next(message.text for message in wire.sent if isinstance(message, m.ChannelSend)))
        assert created["type"] == "session.created"
        wire.die()
        await calls.pool._lost(link)
        # decided before the pool's first await: no send of the session can find the wire broken before that
        assert wire.end_at_close is SessionEnd.FAILED
        calls.pool._on_message(m.ChannelMessage(call.id, json.dumps({"type": "session.update", "session": {}})))
        await _until(lambda: calls.live_calls == 0)
        assert call.runner.end is SessionEnd.FAILED and calls.pool.deaths == 1
    finally:
        await calls.close()
