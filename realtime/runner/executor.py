"""The engine commands of one session, executed one at a time in the order the session emitted them (the engine seam
requires it), with the input audio streams they open: :class:`CommandExecutor`."""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from pipeline.api import AudioInputHandle, ConversationHandle
from pipeline.errors import PipelineError
from realtime.errors import RealtimeError
from realtime.media.audio import AudioDecoder, DecoderFactory
from realtime.observe.first_audio import FirstAudioTracer
from realtime.protocol.audio_format import AudioFormat
from realtime.runner.contracts import Dispatch, OpenMessage, Spawn
from realtime.runner.responses import ResponseDriver
from realtime.session import (
    AddAudio,
    AddContent,
    AddFunctionCall,
    AddFunctionOutput,
    AddText,
    AppendAudio,
    ClearAudio,
    CommitAudio,
    DeleteItem,
    EngineCommand,
    Session,
    SetContextPolicy,
    SetInstructions,
    SetTools,
    StartResponse,
    Transcribe,
    TruncateItem,
)

logger = logging.getLogger("realtime.runner")

COMMANDS_HIGH_WATER = 1024
"""Engine commands that may wait before the session's reader stops reading client messages
(:meth:`CommandExecutor.wait_for_room`). Commands pile up only while the worker waits for the running response to end
(an insertion, deletion, truncation or new tools behind it); 1024 audio appends are 20 s of 20 ms chunks. While the
reader waits, the client's next messages (a ``response.cancel`` included) wait in the transport; the response still
ends on its own, so the reader always resumes."""


class TranscriptionSink(Protocol):
    """Where committed audio goes for its transcription (:class:`~realtime.runner.transcripts.TranscriptionDriver`)."""

    def kept(self, item_id: str, pcm: list[np.ndarray] | None) -> None: ...

    def transcribe(self, command: Transcribe) -> None: ...

    def drop(self, item_id: str) -> None: ...


@dataclass
class _InputStream:
    """An input audio message being streamed to the engine, with its own resampler. ``pcm`` keeps what went to the
    engine (16 kHz), for a transcription of the message (at most the session's ``max_buffer_ms``); None: not kept
    (input transcription was off when the message began)."""

    handle: AudioInputHandle
    decoder: AudioDecoder
    format: AudioFormat
    pcm: list[np.ndarray] | None
    message: OpenMessage
    """What a camera sees of it (WebRTC): the handle and when its first sample reached the server."""

    def send(self, pcm: np.ndarray) -> None:
        if self.pcm is not None:
            self.pcm.append(pcm)
        self.handle.append(pcm)


class CommandExecutor:
    """Executes a session's engine commands in order (:meth:`run`, the session's *worker*). :meth:`submit` never
    blocks, so commands keep the session's order whoever submits them; the session's reader calls
    :meth:`wait_for_room` before each client message, so at most :data:`COMMANDS_HIGH_WATER` commands plus one
    message's wait. A failed command is reported to the session (an ``error`` event) and the session goes on.

    An audio commit is sent and not waited for, so the response that follows it reaches the engine with it; its
    outcome is awaited by a *commit* task (spawned through ``spawn``, owned by the runner). Cancels do not pass here
    (:meth:`ResponseDriver.cancel` runs at once). Commands that must not overtake the running response (an insertion,
    a deletion, a truncation, new tools) wait for it to end first (:meth:`ResponseDriver.wait_idle`)."""

    def __init__(
        self,
        session: Session,
        responses: ResponseDriver,
        transcription: TranscriptionSink,
        traces: FirstAudioTracer,
        *,
        decoder_factory: DecoderFactory,
        heard_at: Callable[[float], float],
        spawn: Spawn,
        dispatch: Dispatch,
        high_water: int = COMMANDS_HIGH_WATER,
    ) -> None:
        self._session = session
        self._responses = responses
        self._transcription = transcription
        self._traces = traces
        self._decoder_factory = decoder_factory
        self._heard_at = heard_at
        self._spawn = spawn
        self._dispatch = dispatch
        self._high_water = high_water
        self._queue: deque[EngineCommand] = deque()
        self._readable = asyncio.Event()
        self._room = asyncio.Event()
        self._room.set()
        self._inputs: dict[str, _InputStream] = {}

    def __len__(self) -> int:
        """Commands waiting for the worker."""
        return len(self._queue)

    def submit(self, command: EngineCommand) -> None:
        """Queue ``command`` behind those already waiting."""
        if isinstance(command, StartResponse):
            self._responses.requested(command)
        self._queue.append(command)
        self._update()

    async def wait_for_room(self) -> None:
        """Return once fewer than ``high_water`` commands wait."""
        await self._room.wait()

    def open_message(self) -> OpenMessage | None:
        """The spoken message being recorded, for a camera; None when none is open."""
        stream = next(reversed(self._inputs.values()), None)
        return stream.message if stream is not None else None

    async def run(self, conversation: ConversationHandle) -> None:
        """Execute commands on ``conversation`` until cancelled."""
        while True:
            while not self._queue:
                await self._readable.wait()
            command = self._queue.popleft()
            self._update()
            try:
                await self._execute(conversation, command)
            except Exception as exc:  # reported to the client; the session carries on
                if not expected(exc):
                    logger.exception("session %s: %s failed", self._session.session_id, type(command).__name__)
                if isinstance(command, StartResponse):
                    self._responses.not_started(command)
                self._dispatch(self._session.command_failed(command, exc))

    def _update(self) -> None:
        if self._queue:
            self._readable.set()
        else:
            self._readable.clear()
        if len(self._queue) < self._high_water:
            self._room.set()
        else:
            self._room.clear()

    async def _execute(self, conversation: ConversationHandle, command: EngineCommand) -> None:
        if isinstance(command, SetInstructions):
            await conversation.set_instructions(command.instructions)
        elif isinstance(command, SetContextPolicy):
            await conversation.set_context_policy(command.policy)
        elif isinstance(command, AddText):
            if command.previous_item_id is not None:  # an insertion: after the cancelled response ends
                await self._responses.wait_idle()
            await conversation.add_text(
                command.item_id, command.text, command.role.value, previous_item_id=command.previous_item_id
            )
        elif isinstance(command, AddContent):
            if command.previous_item_id is not None:
                await self._responses.wait_idle()
            await conversation.add_content(command.item_id, command.parts, previous_item_id=command.previous_item_id)
        elif isinstance(command, SetTools):
            await self._responses.wait_idle()  # the tools are part of the prompt: they change between responses
            await conversation.set_tools(command.tools)
        elif isinstance(command, AddFunctionCall):
            await conversation.add_function_call(command.item_id, command.name, command.arguments)
        elif isinstance(command, AddFunctionOutput):
            await conversation.add_function_output(command.item_id, command.output)
        elif isinstance(command, AddAudio):
            decoder = self._decoder_factory(command.format)
            pcm = np.concatenate([decoder.decode(command.audio), decoder.flush()])
            if command.previous_item_id is not None:
                await self._responses.wait_idle()
            await conversation.add_audio(command.item_id, pcm, previous_item_id=command.previous_item_id)
        else:
            await self._execute_more(conversation, command)

    async def _execute_more(self, conversation: ConversationHandle, command: EngineCommand) -> None:
        if isinstance(command, AppendAudio):
            self._append(conversation, command)
        elif isinstance(command, CommitAudio):
            self._commit(command)
        elif isinstance(command, ClearAudio):
            await self._inputs.pop(command.item_id).handle.discard()
        elif isinstance(command, StartResponse):
            self._responses.start(conversation, command)
        elif isinstance(command, DeleteItem):
            self._transcription.drop(command.item_id)
            await self._responses.wait_idle()
            await conversation.delete_item(command.item_id)
        elif isinstance(command, TruncateItem):
            await self._responses.wait_idle()
            await conversation.truncate_item(command.item_id, command.audio_end_ms)
        elif isinstance(command, Transcribe):
            self._transcription.transcribe(command)
        else:
            raise TypeError(f"not an engine command: {command!r}")

    def _append(self, conversation: ConversationHandle, command: AppendAudio) -> None:
        stream = self._inputs.get(command.item_id)
        if stream is None:
            handle = conversation.open_audio(command.item_id)
            keep: list[np.ndarray] | None = [] if self._session.config.transcription is not None else None
            message = OpenMessage(command.item_id, handle, self._heard_at(command.start_ms))
            stream = _InputStream(handle, self._decoder_factory(command.format), command.format, keep, message)
            self._inputs[command.item_id] = stream
        elif stream.format is not command.format:  # the client switched formats mid-message
            stream.send(stream.decoder.flush())
            stream.decoder, stream.format = self._decoder_factory(command.format), command.format
        stream.send(stream.decoder.decode(command.audio))

    def _commit(self, command: CommitAudio) -> None:
        stream = self._inputs.pop(command.item_id)
        stream.send(stream.decoder.flush())
        self._transcription.kept(command.item_id, stream.pcm)
        # Sent now; not awaited here, so the response the turn asks for (next in the queue) reaches the engine with
        # the commit instead of one engine step (or round trip to its process) later.
        committed = stream.handle.commit()
        self._spawn(self._await_commit(command, committed), f"commit {command.item_id}")

    async def _await_commit(self, command: CommitAudio, committed: Awaitable[None]) -> None:
        """The outcome of a commit already sent: a failure is reported as the command's (an ``error`` event), as if
        the worker had waited for it."""
        try:
            await committed
        except Exception as exc:
            if not expected(exc):
                logger.exception("session %s: CommitAudio failed", self._session.session_id)
            self._dispatch(self._session.command_failed(command, exc))
        else:
            self._traces.committed()


def expected(exc: Exception) -> bool:
    """Errors with a wire code are the client's or the engine's documented failures, not bugs."""
    return isinstance(exc, (PipelineError, RealtimeError))
