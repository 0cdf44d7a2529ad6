"""A session runner over an in-memory transport and the fake engine, for the session's unit tests."""

from __future__ import annotations

import asyncio
import base64
from collections.abc import Callable

import numpy as np

from realtime.ids import SequentialIds
from realtime.runner import SessionRunner
from tests.fakes import FakeEngine, FakeTurnDetector, MemoryTransport

RATE = 24_000
TIMEOUT = 5.0


def pcm16(ms: int, amplitude: float = 0.0) -> bytes:
    n = RATE * ms // 1000
    tone = amplitude * np.sin(2 * np.pi * 300 * np.arange(n) / RATE)
    return (tone * 32767).astype("<i2").tobytes()


def append(ms: int, amplitude: float = 0.0) -> dict:
    return {"type": "input_audio_buffer.append", "audio": base64.b64encode(pcm16(ms, amplitude)).decode()}


MANUAL = {"type": "session.update", "session": {"type": "realtime", "audio": {"input": {"turn_detection": None}}}}
TEXT_ITEM = {
    "type": "conversation.item.create",
    "item": {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Hi!"}]},
}


async def until(condition: Callable[[], bool], timeout: float = TIMEOUT) -> None:
    async def poll() -> None:
        while not condition():
            await asyncio.sleep(0.001)

    await asyncio.wait_for(poll(), timeout)


class Harness:
    """A runner on a MemoryTransport and a FakeEngine, started on entry, disconnected on exit."""

    def __init__(self, engine: FakeEngine | None = None, transport: MemoryTransport | None = None, **kwargs):
        self.engine = engine or FakeEngine()
        self.transport = transport or MemoryTransport()
        self.detectors: list[FakeTurnDetector] = []
        kwargs.setdefault("turn_detector_factory", self._detector)
        self.runner = SessionRunner(self.transport, self.engine, ids=SequentialIds(), **kwargs)
        self.task: asyncio.Task | None = None

    def _detector(self, params) -> FakeTurnDetector:
        detector = FakeTurnDetector(params)
        self.detectors.append(detector)
        return detector

    async def __aenter__(self) -> Harness:
        self.task = asyncio.create_task(self.runner.run())
        await self.transport.wait_for("session.created")
        return self

    async def __aexit__(self, *exc_info) -> None:
        self.transport.disconnect()
        await asyncio.wait_for(self.task, TIMEOUT)

    @property
    def conversation(self):
        return self.engine.conversations[0]

    def send(self, *events: dict) -> None:
        for event in events:
            self.transport.client_send(event)

    def calls(self, name: str) -> list[tuple]:
        return [c for c in self.conversation.calls if c[0] == name]
