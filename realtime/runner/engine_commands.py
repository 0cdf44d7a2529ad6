"""Engine commands of one session, executed one at a time in the order the session emitted them (a cancel at once),
and the pump of each response's engine output back into the session: the :class:`EngineCommands` part of
:class:`~realtime.runner.SessionRunner`."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import AsyncIterator, Awaitable
from dataclasses import dataclass

import numpy as np

from pipeline.api import AudioInputHandle, ConversationHandle, ResponseHandle
from pipeline.errors import EngineFailure, PipelineError
from pipeline.response_events import AudioChunk, ResponseDone, ResponseEvent, ResponseStatus, TextDelta, Usage
from realtime.errors import RealtimeError
from realtime.protocol.audio_format import AudioFormat
from realtime.runner.contracts import (
    AudioDecoder,
    OpenMessage,
)
from realtime.session import (
    AddAudio,
    AddContent,
    AddText,
    AppendAudio,
    CancelResponse,
    ClearAudio,
    CommitAudio,
    DeleteItem,
    EngineCommand,
    SetContextPolicy,
    SetInstructions,
    StartResponse,
    Transcribe,
    TruncateItem,
)
from realtime.tool_calls import AddFunctionCall, AddFunctionOutput, SetTools

logger = logging.getLogger("realtime.runner")
"""The runner's one logger (its name is what log readers match), shared by its modules."""


@dataclass
class _InputStream:
    """An input audio message being streamed to the engine, with its own resampler. ``pcm`` keeps what went to the
    engine (16 kHz), for a transcription of the message (at most the session's ``max_buffer_ms``); None: not kept
    (input transcription was off when the message began)."""

    handle: AudioInputHandle
    decoder: AudioDecoder
    format: AudioFormat
    pcm: list[np.ndarray] | None = None
    message: OpenMessage | None = None
    """What a camera sees of it (WebRTC): the handle and when its first sample reached the server."""

    def send(self, pcm: np.ndarray) -> None:
        if self.pcm is not None:
            self.pcm.append(pcm)
        self.handle.append(pcm)


@dataclass
class _Running:
    """A started response; ``cancelled`` wakes its pump when it waits for a lagging client."""

    handle: ResponseHandle
    cancelled: asyncio.Event = dataclasses.field(default_factory=asyncio.Event)

    def cancel(self, reason: str) -> None:
        self.handle.cancel(reason)
        self.cancelled.set()


class EngineCommands:
    """The engine side of :class:`~realtime.runner.SessionRunner`: its commands, its responses' pumps. The state is
    the runner's (made in its ``__init__``): the conversation, the open input streams, the running responses, cancels
    that came before their response started, the responses awaiting their first output, the first-audio traces."""

    async def _pump(self, response_id: str, running: _Running) -> None:
        """Feed one response's engine output to the session, pausing while the client lags
        (but not once cancelled: the session drops that output, so the engine is drained at once)."""
        stream = aiter(running.handle)
        while True:
            await self._room_unless_cancelled(running.cancelled)
            event = await _next_event(stream)
            if isinstance(event, AudioChunk):
                self._traces.received_audio(response_id)
            self._dispatch(self.session.response_event(response_id, event))
            if self._first_output(response_id, event):
                self._awaiting_output.pop(response_id, None)
                if self._transcriber is not None:
                    self._transcriber.wake()
            if isinstance(event, ResponseDone):
                self._traces.done(response_id, event.timings)
                self._responses.pop(response_id, None)
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
        waiters = {asyncio.ensure_future(self.outbound.wait_for_room()), asyncio.ensure_future(cancelled.wait())}
        try:
            await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for waiter in waiters:
                waiter.cancel()

    def _cancel(self, action: CancelResponse) -> None:
        running = self._responses.get(action.response_id)
        if running is None:
            self._early_cancels[action.response_id] = action
        else:
            running.cancel(action.reason.value)

    async def _execute(self, command: EngineCommand) -> None:
        conversation = self._conversation
        assert conversation is not None, "run() creates the conversation before any command"
        if isinstance(command, SetInstructions):
            await conversation.set_instructions(command.instructions)
        elif isinstance(command, SetContextPolicy):
            await conversation.set_context_policy(command.policy)
        elif isinstance(command, AddText):
            if command.previous_item_id is not None:  # an insertion: after the cancelled response ends
                await self._wait_idle()
            await conversation.add_text(
                command.item_id, command.text, command.role.value, previous_item_id=command.previous_item_id
            )
        elif isinstance(command, AddContent):
            if command.previous_item_id is not None:
                await self._wait_idle()
            await conversation.add_content(command.item_id, command.parts, previous_item_id=command.previous_item_id)
        elif isinstance(command, SetTools):
            await self._wait_idle()  # the tools are part of the prompt: they change between responses
            await conversation.set_tools(command.tools)
        elif isinstance(command, AddFunctionCall):
            await conversation.add_function_call(command.item_id, command.name, command.arguments)
        elif isinstance(command, AddFunctionOutput):
            await conversation.add_function_output(command.item_id, command.output)
        elif isinstance(command, AddAudio):
            decoder = self._decoder_factory(command.format)
            pcm = np.concatenate([decoder.decode(command.audio), decoder.flush()])
            if command.previous_item_id is not None:
                await self._wait_idle()
            await conversation.add_audio(command.item_id, pcm, previous_item_id=command.previous_item_id)
        elif isinstance(command, AppendAudio):
            self._append(conversation, command)
        elif isinstance(command, CommitAudio):
            stream = self._inputs.pop(command.item_id)
            stream.send(stream.decoder.flush())
            self._committed_audio = (command.item_id, stream.pcm)
            # Sent now; not awaited here, so the response the turn asks for (next in the queue) reaches the
            # engine with the commit instead of one engine step (or round trip to its process) later.
            committed = stream.handle.commit()
            self._spawn(self._await_commit(command, committed), f"commit {command.item_id}")
        elif isinstance(command, ClearAudio):
            await self._inputs.pop(command.item_id).handle.discard()
        elif isinstance(command, StartResponse):
            self._start_response(conversation, command)
        elif isinstance(command, DeleteItem):
            if self._transcriber is not None:
                self._transcriber.drop(command.item_id)
            await self._wait_idle()
            await conversation.delete_item(command.item_id)
        elif isinstance(command, TruncateItem):
            await self._wait_idle()
            await conversation.truncate_item(command.item_id, command.audio_end_ms)
        elif isinstance(command, Transcribe):
            self._transcribe(command)
        else:
            raise TypeError(f"not an engine command: {command!r}")

    async def _await_commit(self, command: CommitAudio, committed: Awaitable[None]) -> None:
        """The outcome of a commit already sent: a failure is reported as the command's (an ``error``
        event), as if the worker had waited for it."""
        try:
            await committed
        except Exception as exc:
            if not _expected(exc):
                logger.exception("session %s: CommitAudio failed", self.session.session_id)
            self._dispatch(self.session.command_failed(command, exc))
        else:
            self._traces.committed()

    def _append(self, conversation: ConversationHandle, command: AppendAudio) -> None:
        stream = self._inputs.get(command.item_id)
        if stream is None:
            handle = conversation.open_audio(command.item_id)
            keep = [] if self.session.config.transcription is not None else None
            stream = _InputStream(handle, self._decoder_factory(command.format), command.format, keep)
            stream.message = OpenMessage(command.item_id, handle, self._heard_at(command.start_ms))
            self._inputs[command.item_id] = stream
        elif stream.format is not command.format:  # the client switched formats mid-message
            stream.send(stream.decoder.flush())
            stream.decoder, stream.format = self._decoder_factory(command.format), command.format
        stream.send(stream.decoder.decode(command.audio))

    def _start_response(self, conversation: ConversationHandle, command: StartResponse) -> None:
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
        self._responses[command.response_id] = running
        self._traces.requested(command.response_id)
        if early is not None:
            running.cancel(early.reason.value)
        self._pump_task = self._spawn(self._pump(command.response_id, running), f"pump {command.response_id}")

    async def _wait_idle(self) -> None:
        """Wait for the running response to end (cancelled by the session, or, for a truncation or new tools, let
        run to its end)."""
        task = self._pump_task
        if task is not None and not task.done():
            await asyncio.wait({task})


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


def _expected(exc: Exception) -> bool:
    """Errors with a wire code are the client's or the engine's documented failures, not bugs."""
    return isinstance(exc, (PipelineError, RealtimeError))
