"""The runner's parts on their own: the command executor's bounded queue."""

from __future__ import annotations

import asyncio
import time

from realtime.media.audio import InputDecoder
from realtime.observe.first_audio import FirstAudioTracer
from realtime.runner import OutboundQueue
from realtime.runner.executor import CommandExecutor
from realtime.runner.responses import ResponseDriver
from realtime.runner.transcripts import TranscriptionDriver
from realtime.session import Session, SessionSettings, SetInstructions
from tests.fakes import FakeEngine
from tests.helpers.session_harness import TIMEOUT, until


def _executor(engine: FakeEngine, high_water: int) -> CommandExecutor:
    session = Session(SessionSettings.for_engine(engine))
    traces = FirstAudioTracer(time.monotonic, lambda trace: None)

    def spawn(coro, role):
        return asyncio.create_task(coro, name=role)

    def dispatch(actions):
        raise AssertionError(f"nothing to report here: {actions}")

    responses = ResponseDriver(session, OutboundQueue(), traces, spawn=spawn, dispatch=dispatch)
    transcription = TranscriptionDriver(engine, session, may_start=lambda: True, spawn=spawn, dispatch=dispatch)
    return CommandExecutor(
        session,
        responses,
        transcription,
        traces,
        decoder_factory=InputDecoder,
        heard_at=lambda clock_ms: 0.0,
        spawn=spawn,
        dispatch=dispatch,
        high_water=high_water,
    )


async def test_the_command_queue_has_room_again_once_the_worker_drains_it_below_high_water():
    engine = FakeEngine()
    executor = _executor(engine, high_water=2)
    executor.submit(SetInstructions("a"))
    await asyncio.wait_for(executor.wait_for_room(), TIMEOUT)  # one waits: room
    executor.submit(SetInstructions("b"))
    executor.submit(SetInstructions("c"))  # submit never blocks, even past high water
    waiter = asyncio.ensure_future(executor.wait_for_room())
    await asyncio.sleep(0.01)
    assert len(executor) == 3 and not waiter.done()
    conversation = engine.conversation()
    worker = asyncio.create_task(executor.run(conversation))
    try:
        await asyncio.wait_for(waiter, TIMEOUT)
        await until(lambda: len([c for c in conversation.calls if c[0] == "set_instructions"]) == 3)
    finally:
        worker.cancel()
        await asyncio.gather(worker, return_exceptions=True)
    assert [c[1] for c in conversation.calls if c[0] == "set_instructions"] == ["a", "b", "c"]
