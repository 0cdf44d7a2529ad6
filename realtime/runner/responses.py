"""The responses of one session: each started on the engine, its output pumped back into the session, cancels applied
even before it started, and the replies still waiting for their first output."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass

from pipeline.api import ConversationHandle, ResponseHandle
from pipeline.errors import EngineFailure
from pipeline.response_events import AudioChunk, ResponseDone, ResponseEvent, ResponseStatus, TextDelta, Usage
from realtime.observe.first_audio import FirstAudioTracer
from realtime.runner.contracts import Dispatch, Spawn
from realtime.runner.outbound import OutboundQueue
from realtime.session import CancelResponse, Session, StartResponse

logger = logging.getLogger("realtime.runner")


@dataclass
class _Running:
    """A started response; ``cancelled`` wakes its pump when it waits for a lagging client."""

    handle: ResponseHandle
    cancelled: asyncio.Event = dataclasses.field(default_factory=asyncio.Event)

    def cancel(self, reason: str) -> None:
        self.handle.cancel(reason)
        self.cancelled.set()


class ResponseDriver:
    """The session's responses on the engine. :meth:`start` starts one and spawns its *pump* (a task owned by the
    runner, through ``spawn``), which feeds the engine's output to the session and the resulting actions to
    ``dispatch``, pausing while ``outbound`` is above its high water (but not once cancelled: the session drops that
    output, so the engine is drained at once). All methods are called from the event loop's thread."""

    def __init__(
        self, session: Session, outbound: OutboundQueue, traces: FirstAudioTracer, *, spawn: Spawn, dispatch: Dispatch
    ) -> None:
        self._session = session
        self._outbound = outbound
        self._traces = traces
        self._spawn = spawn
        self._dispatch = dispatch
        self._running: dict[str, _Running] = {}
        self._early_cancels: dict[str, CancelResponse] = {}  # cancelled before StartResponse ran
        self._awaiting_output: dict[str, bool] = {}  # requested, before their first output -> audio?
        self._pump: asyncio.Task | None = None  # the latest response's pump

    @property
    def awaiting_output(self) -> bool:
        """Whether a requested reply has not yet made its first output (audio, or text for a text-only reply)."""
        return bool(self._awaiting_output)

    def requested(self, command: StartResponse) -> None:
        """``command`` was queued for the engine: its reply waits for its first output from now on."""
        self._awaiting_output[command.response_id] = "audio" in command.modalities

    def not_started(self, command: StartResponse) -> None:
        """``command`` failed: no output will come."""
        self._awaiting_output.pop(command.response_id, None)

    def start(self, conversation: ConversationHandle, command: StartResponse) -> None:
        """Ask the engine for the response and spawn its pump; a cancel that came first applies at once."""
        early = self._early_cancels.pop(command.response_id, None)
        handle = conversation.respond(
            item_id=command.item_id,
            modalities=command.modalities,
            voice=command.voice,
            max_output_tokens=command.max_output_tokens,
            tool_choice=command.tool_choice,
            call_item_ids=command.call_item_ids,
        )
        running = _Running(handle)
        self._running[command.response_id] = running
        self._traces.requested(command.response_id)
        if early is not None:
            running.cancel(early.reason.value)
        self._pump = self._spawn(self._pump_output(command.response_id, running), f"pump {command.response_id}")

    def cancel(self, action: CancelResponse) -> None:
        """Cancel the response now, or as it starts if its StartResponse has not run yet."""
        running = self._running.get(action.response_id)
        if running is None:
            self._early_cancels[action.response_id] = action
        else:
            running.cancel(action.reason.value)

    def cancel_all(self, reason: str) -> None:
        """Cancel every running response on the engine (the session is ending)."""
        for running in self._running.values():
            running.cancel(reason)

    async def wait_idle(self) -> None:
        """Wait for the latest response's pump to end (its response cancelled by the session, or, for a truncation or
        new tools, let run to its end)."""
        task = self._pump
        if task is not None and not task.done():
            await asyncio.wait({task})

    async def _pump_output(self, response_id: str, running: _Running) -> None:
        stream = aiter(running.handle)
        while True:
            await self._room_unless_cancelled(running.cancelled)
            event = await _next_event(stream)
            if isinstance(event, AudioChunk):
                self._traces.received_audio(response_id)
            first_output = self._first_output(response_id, event)
            if first_output:
                self._awaiting_output.pop(response_id, None)
            self._dispatch(self._session.response_event(response_id, event))  # wakes a waiting transcription
            if isinstance(event, ResponseDone):
                self._traces.done(response_id, event.timings)
                self._running.pop(response_id, None)
                return

    def _first_output(self, response_id: str, event: ResponseEvent) -> bool:
        """Whether ``event`` ends the wait for the response's first output: its first audio (its first text for a
        text-only response), or its end."""
        audio = self._awaiting_output.get(response_id)
        if audio is None:
            return False
        return isinstance(event, ResponseDone | (AudioChunk if audio else TextDelta))

    async def _room_unless_cancelled(self, cancelled: asyncio.Event) -> None:
        if cancelled.is_set():
            return
        waiters = {asyncio.ensure_future(self._outbound.wait_for_room()), asyncio.ensure_future(cancelled.wait())}
        try:
            await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for waiter in waiters:
                waiter.cancel()


async def _next_event(stream: AsyncIterator[ResponseEvent]) -> ResponseEvent:
    """The next engine event; a broken stream becomes the failed ``ResponseDone`` it should have sent."""
    try:
        return await anext(stream)
    except StopAsyncIteration:
        error: Exception = EngineFailure("the response stream ended without ResponseDone")
    except Exception as exc:
        logger.exception("response stream raised")
        error = exc
    return ResponseDone(ResponseStatus.FAILED, Usage(), reason="error", error=error)
