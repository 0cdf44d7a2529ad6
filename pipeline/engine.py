"""The async engine: the public API of :mod:`pipeline` (implements :mod:`pipeline.api`).

One engine thread owns the :class:`~pipeline.core.engine_core.EngineCore` and every model tensor. Coroutines
talk to it through a request queue; each request (:mod:`pipeline.core.commands`) runs between
two engine steps, in submission order, and its result or exception comes back through a future.
Response events travel back with ``loop.call_soon_threadsafe`` into the response's own queue.

The engine thread runs either in this process (:class:`pipeline.hosting.loop.EngineThread`) or in a child process that
owns
the GPU (:class:`pipeline.hosting.process.EngineProcess`, chosen by the stage config's
``engine.process``); both take the same requests and deliver the same events, so everything above
them (:class:`OmniEngine`, :class:`Conversation`, :class:`AudioInput`, :class:`Response`) is one code path.

Backpressure: a response whose consumer has more than ``max_pending_events`` undelivered events
is paused by the core (not stepped) until the consumer catches up, so output buffers stay bounded
and a slow reader slows only its own response.

Cancellation: ``Response.cancel`` marks the response in the core; the core ends it at the start of
its next step (within one step of every stage) with ``ResponseDone(status=CANCELLED)``. If the
consuming task itself is cancelled while iterating, the response is cancelled too.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import math
import threading
from collections.abc import AsyncIterator, Awaitable
from concurrent.futures import Future
from pathlib import Path

import numpy as np
import torch

from pipeline.api import INPUT_SAMPLE_RATE, ContentPart, ContextPolicy, Modality, Role, reply_token_limit
from pipeline.config import StageGraphConfig, stage_config_for
from pipeline.core import commands as rq
from pipeline.core.engine_core import EngineCore
from pipeline.core.response_state import ResponseSpec
from pipeline.errors import (
    ConfigError,
    EngineClosedError,
    InvalidAudioError,
    InvalidImageError,
    InvalidInputError,
    ResponseActiveError,
    UnknownVoiceError,
    UnsupportedInputError,
    no_audio_output,
)
from pipeline.hosting.loaders import CheckpointLoader, PretrainedCheckpoint
from pipeline.hosting.loop import CoreCall, EngineBackend, EngineFacts, EngineThread
from pipeline.models import family_of
from pipeline.models.family import Checkpoint
from pipeline.response_events import EngineStats, ResponseDone, ResponseEvent, ResponseStatus, Usage
from pipeline.tools import AUTO, Tool, ToolChoice

log = logging.getLogger(__name__)

_ids = itertools.count(1)


def validate_pcm(pcm: np.ndarray, *, sample_rate: int = INPUT_SAMPLE_RATE, allow_empty: bool = False) -> np.ndarray:
    """User audio must be a 1-D float32 array of finite samples at 16 kHz."""
    if sample_rate != INPUT_SAMPLE_RATE:
        raise InvalidAudioError(f"audio must be {INPUT_SAMPLE_RATE} Hz, got {sample_rate} Hz", param="sample_rate")
    if not isinstance(pcm, np.ndarray) or pcm.dtype != np.float32:
        kind = pcm.dtype if isinstance(pcm, np.ndarray) else type(pcm).__name__
        raise InvalidAudioError(f"audio must be a float32 numpy array, got {kind}", param="audio")
    if pcm.ndim != 1:
        raise InvalidAudioError(f"audio must be mono (1-D), got shape {pcm.shape}", param="audio")
    if not allow_empty and pcm.size == 0:
        raise InvalidAudioError("audio is empty", param="audio")
    if not np.isfinite(pcm).all():
        raise InvalidAudioError("audio contains NaN or infinite samples", param="audio")
    return pcm


def validate_frame(frame: np.ndarray) -> None:
    """Raise ``InvalidImageError`` unless ``frame`` is a non-empty uint8 RGB ``(H, W, 3)`` array."""
    if not isinstance(frame, np.ndarray) or frame.dtype != np.uint8 or frame.ndim != 3 or frame.shape[2] != 3:
        shape, dtype = getattr(frame, "shape", None), getattr(frame, "dtype", type(frame).__name__)
        raise InvalidImageError(f"a video frame must be uint8 RGB (H, W, 3), got {dtype} {shape}", param="video")
    if frame.shape[0] == 0 or frame.shape[1] == 0:
        raise InvalidImageError(f"video frame of {frame.shape[0]}x{frame.shape[1]} pixels is empty", param="video")


class Response:
    """Async iterator over one reply's events (see :class:`pipeline.api.ResponseHandle`)."""

    def __init__(self, engine: OmniEngine, conv: Conversation, item_id: str, *, max_pending: int) -> None:
        self.id = f"resp_{next(_ids)}"
        self.item_id = item_id
        self._engine = engine
        self._conv = conv
        self._loop = asyncio.get_running_loop()
        self._events: asyncio.Queue[ResponseEvent] = asyncio.Queue()
        self._pending = 0
        self._lock = threading.Lock()
        self._max_pending = max_pending
        self.done: ResponseDone | None = None

    # engine thread side
    def _sink(self, event: ResponseEvent) -> None:
        with self._lock:
            self._pending += 1
        try:
            self._loop.call_soon_threadsafe(self._events.put_nowait, event)
        except RuntimeError:  # the consumer's event loop is closed: nobody is listening any more
            log.debug("dropped %s for %s: event loop closed", type(event).__name__, self.id)

    def _can_accept(self) -> bool:
        with self._lock:
            return self._pending < self._max_pending

    # async side
    async def __aiter__(self) -> AsyncIterator[ResponseEvent]:
        if self.done is not None:
            return
        try:
            while True:
                event = await self._events.get()
                last = isinstance(event, ResponseDone)
                with self._lock:
                    self._pending -= 1
                self._engine._backend.consumed(self.id, done=last)
                if isinstance(event, ResponseDone):
                    self._on_done(event)
                    yield event
                    return
                yield event
        except asyncio.CancelledError:
            self.cancel("client_cancelled")
            raise

    def cancel(self, reason: str = "client_cancelled") -> None:
        if self.done is not None or self._engine.closed:
            return  # a closing engine ends every response itself (cancelled, or failed if its process died)
        try:
            self._engine._post(rq.CancelResponseCommand(self.id, reason))
        except EngineClosedError:  # closed since the check above: the same as a closed engine
            log.debug("cancel of %s after the engine closed: its shutdown ends the response", self.id)

    async def wait(self) -> ResponseDone:
        async for _ in self:
            pass
        assert self.done is not None
        return self.done

    def _on_done(self, event: ResponseDone) -> None:
        self.done = event
        if self._conv._active is self:
            self._conv._active = None

    def _fail_now(self, exc: Exception) -> None:
        """Deliver a failed ResponseDone without the engine (the start command itself was refused)."""
        self._sink(ResponseDone(status=ResponseStatus.FAILED, usage=Usage(), reason="error", error=exc))


class AudioInput:
    """A user audio message being streamed in (see :class:`pipeline.api.AudioInputHandle`).

    ``append`` hands the samples to the engine thread at once; there every complete 2 s block is
    encoded and, while the conversation is idle, prefilled — so at commit only the tail is left."""

    def __init__(self, conv: Conversation, item_id: str) -> None:
        self.item_id = item_id
        self._conv = conv
        self._closed = False

    def append(self, pcm: np.ndarray) -> None:
        if self._closed:
            raise InvalidInputError("this audio message is already committed or discarded", param="audio")
        pcm = validate_pcm(pcm, allow_empty=True).copy()
        if pcm.size:
            self._conv._engine._post(rq.AppendAudioCommand(self._conv.id, self.item_id, pcm))

    def commit(self) -> Awaitable[None]:
        """Sent to the engine now (ordered before any later command); await the result for its errors."""
        self._closed = True
        command = rq.CommitAudioCommand(self._conv.id, self.item_id)
        return asyncio.wrap_future(self._conv._engine._submit_nowait(command))

    async def discard(self) -> None:
        self._closed = True
        await self._conv._engine._call(rq.DiscardAudioCommand(self._conv.id, self.item_id))

    def add_video_frame(self, frame: np.ndarray, t: float) -> None:
        if self._conv._engine.vision is None:
            raise UnsupportedInputError("this model has no vision tower: it cannot take video", param="video")
        if self._closed:
            raise InvalidInputError("this audio message is already committed or discarded", param="video")
        validate_frame(frame)
        if not math.isfinite(t) or t < 0:
            raise InvalidInputError(f"a frame's time must be a finite number of seconds >= 0, got {t}", param="t")
        self._conv._engine._post(rq.AddVideoFrameCommand(self._conv.id, self.item_id, np.array(frame), float(t)))


class Conversation:
    """One conversation's history and KV state in the engine (see :class:`pipeline.api.ConversationHandle`)."""

    def __init__(self, engine: OmniEngine, instructions: str) -> None:
        self.id = f"conv_{next(_ids)}"
        self._engine = engine
        self._active: Response | None = None
        engine._post(rq.OpenConversationCommand(self.id, instructions))

    async def set_instructions(self, instructions: str) -> None:
        await self._engine._call(rq.SetInstructionsCommand(self.id, instructions))

    async def set_context_policy(self, policy: ContextPolicy | None) -> None:
        await self._engine._call(rq.SetContextPolicyCommand(self.id, policy))

    async def set_tools(self, tools: tuple[Tool, ...]) -> None:
        await self._engine._call(rq.SetToolsCommand(self.id, tuple(tools)))

    async def add_function_call(self, item_id: str, name: str, arguments: str) -> None:
        await self._engine._call(rq.AddFunctionCallCommand(self.id, item_id, name, arguments))

    async def add_function_output(self, item_id: str, output: str) -> None:
        await self._engine._call(rq.AddFunctionOutputCommand(self.id, item_id, output))

    async def add_text(
        self, item_id: str, text: str, role: Role = "user", *, previous_item_id: str | None = None
    ) -> None:
        if role not in ("system", "user", "assistant"):
            raise InvalidInputError(f"unknown role {role!r}", param="role")
        await self._engine._call(rq.AddTextCommand(self.id, item_id, role, text, previous_item_id))

    async def add_audio(self, item_id: str, pcm: np.ndarray, *, previous_item_id: str | None = None) -> None:
        validate_pcm(pcm)
        await self._engine._call(rq.AddAudioCommand(self.id, item_id, pcm, previous_item_id))

    async def add_content(
        self, item_id: str, parts: tuple[ContentPart, ...], *, previous_item_id: str | None = None
    ) -> None:
        if self._engine.vision is None and any(not isinstance(part, str) for part in parts):
            raise UnsupportedInputError("this model has no vision tower: it cannot take images", param="content")
        await self._engine._call(rq.AddContentCommand(self.id, item_id, tuple(parts), previous_item_id))

    def open_audio(self, item_id: str) -> AudioInput:
        return AudioInput(self, item_id)

    async def delete_item(self, item_id: str) -> None:
        await self._engine._call(rq.DeleteItemCommand(self.id, item_id))

    async def truncate_item(self, item_id: str, audio_end_ms: int) -> None:
        if audio_end_ms < 0:
            raise InvalidInputError("audio_end_ms must be >= 0", param="audio_end_ms")
        await self._engine._call(rq.TruncateItemCommand(self.id, item_id, audio_end_ms))

    def respond(
        self,
        *,
        item_id: str,
        modalities: frozenset[Modality] = frozenset({"text", "audio"}),
        voice: str | None = None,
        max_output_tokens: int | None = None,
        tool_choice: ToolChoice = AUTO,
        call_item_ids: tuple[str, ...] = (),
    ) -> Response:
        engine = self._engine
        if not modalities or not set(modalities) <= {"text", "audio"}:
            raise InvalidInputError(
                f"modalities must be a non-empty subset of text, audio: {modalities}", param="modalities"
            )
        if "audio" in modalities and not engine.audio_output:
            raise no_audio_output()
        voice = voice or engine.default_voice
        if voice is not None and voice not in engine.voices:  # None only where the engine has no audio output
            available = ", ".join(engine.voices) or "none (the model answers in text only)"
            raise UnknownVoiceError(f"unknown voice {voice!r}; available: {available}", param="voice")
        limit = reply_token_limit(max_output_tokens, engine.max_output_tokens)
        if self._active is not None:
            raise ResponseActiveError("a response is already in progress for this conversation", param="response")
        resp = Response(engine, self, item_id, max_pending=engine.max_pending_events)
        spec = ResponseSpec(
            id=resp.id,
            conv_id=self.id,
            item_id=item_id,
            audio="audio" in modalities,
            voice=voice,
            max_text_tokens=limit,
            sink=resp._sink,
            can_accept=resp._can_accept,
            tool_choice=tool_choice,
            call_item_ids=tuple(call_item_ids),
        )
        self._active = resp
        try:
            fut = engine._submit_nowait(rq.StartResponseCommand(spec))
        except BaseException:
            self._active = None
            raise

        def fail_if_refused(f: Future) -> None:
            exc = f.exception()
            if isinstance(exc, Exception):  # the engine fails a refused start with an Exception (its error trees)
                resp._fail_now(exc)

        fut.add_done_callback(fail_if_refused)
        return resp

    async def close(self) -> None:
        if self._engine.closed:
            return
        await self._engine._call(rq.CloseConversationCommand(self.id))


class OmniEngine:
    """Serves conversations from one checkpoint (implements :class:`pipeline.api.EngineHandle`).

    The engine core runs on a thread of this process, or in a child process that loads the checkpoint
    itself (the stage config's ``engine.process``; :meth:`from_pretrained` and :meth:`from_loader` choose).
    ``ckpt`` is the loaded checkpoint in the first case and None in the second."""

    def __init__(
        self, ckpt: Checkpoint, cfg: StageGraphConfig, *, seed: int | None = None, max_pending_events: int = 256
    ) -> None:
        """An engine on a thread of this process over ``ckpt``, already loaded here (tensors cannot be handed
        to a child process: use :meth:`from_loader` for ``engine.process``)."""
        if cfg.engine.process:
            raise ConfigError(
                "engine.process is on (auto: on with CUDA), but the checkpoint is already loaded in this "
                "process: use OmniEngine.from_pretrained or OmniEngine.from_loader, or engine.process: "
                "off",
                param="engine.process",
            )
        backend = EngineThread(EngineCore(ckpt, cfg, seed=seed))
        self._setup(cfg, EngineFacts.of(ckpt, cfg), backend, max_pending_events, ckpt)

    def _setup(
        self,
        cfg: StageGraphConfig,
        facts: EngineFacts,
        backend: EngineBackend,
        max_pending_events: int,
        ckpt: Checkpoint | None,
    ) -> None:
        self.ckpt = ckpt
        self.cfg = cfg
        self.facts = facts
        self.model_name = facts.model_name
        self.voices = facts.voices
        self.default_voice = facts.default_voice
        family = family_of(cfg.model_family)
        self.default_instructions = family.default_instructions
        self.transcription_prompt = family.transcription_prompt
        self.random_weights = facts.random_weights
        self.max_output_tokens = facts.max_output_tokens
        self.vision = facts.vision
        self.audio_output = facts.audio_output
        self.max_pending_events = max_pending_events
        self._backend = backend
        if self.random_weights:
            log.warning(
                "MODEL %s HAS RANDOM WEIGHTS: it is a test model, not an assistant; its speech and text are noise.",
                self.model_name,
            )

    @classmethod
    def from_pretrained(
        cls,
        model: str | Path,
        stage_config: str | Path | StageGraphConfig | None = None,
        *,
        seed: int | None = None,
        max_pending_events: int = 256,
        torch_threads: int | None = None,
    ) -> OmniEngine:
        """The checkpoint folder or cached hub id ``model`` served as ``stage_config`` says (a path: its family must be
        the checkpoint's; None: the packaged stage graph of the checkpoint's family), its engine core in a child
        process or not per ``engine.process``."""
        cfg = stage_config if isinstance(stage_config, StageGraphConfig) else stage_config_for(str(model), stage_config)
        return cls.from_loader(
            PretrainedCheckpoint(str(model)),
            cfg,
            seed=seed,
            max_pending_events=max_pending_events,
            torch_threads=torch_threads,
        )

    @classmethod
    def from_loader(
        cls,
        loader: CheckpointLoader,
        cfg: StageGraphConfig,
        *,
        seed: int | None = None,
        max_pending_events: int = 256,
        torch_threads: int | None = None,
    ) -> OmniEngine:
        """The checkpoint ``loader`` makes (:mod:`pipeline.hosting.loaders`). With ``engine.process`` on (or auto on
        CUDA) the loader is handed to a child process, which loads the weights and runs the engine core; this
        call returns once it is ready, and raises what loading raised there. ``torch_threads``: the child's
        torch CPU threads (default: this process's ``torch.get_num_threads()``); unused on a thread."""
        if not cfg.engine.process:
            return cls(loader.load(cfg), cfg, seed=seed, max_pending_events=max_pending_events)
        from pipeline.hosting.process import EngineProcess, ProcessSpec

        threads = torch_threads if torch_threads is not None else torch.get_num_threads()
        backend = EngineProcess(
            ProcessSpec(
                loader=loader,
                cfg=cfg,
                seed=seed,
                max_pending_events=max_pending_events,
                torch_threads=threads,
                log_level=logging.getLogger().getEffectiveLevel(),
            )
        )
        engine = cls.__new__(cls)
        engine._setup(cfg, backend.facts, backend, max_pending_events, None)
        return engine

    @property
    def closed(self) -> bool:
        return self._backend.closed

    @property
    def uses_process(self) -> bool:
        """Whether the engine core runs in a child process."""
        return not isinstance(self._backend, EngineThread)

    @property
    def core(self) -> EngineCore:
        """The engine core when it runs on a thread of this process (tools and tests read its state and step it through
        :meth:`EngineThread.submit <pipeline.hosting.loop.EngineThread.submit>`); AttributeError with an engine
        process."""
        return self._thread.core

    @property
    def _thread(self) -> EngineThread:
        """The engine thread of this process (tests reach its ``core``); only when the core runs here."""
        if not isinstance(self._backend, EngineThread):
            raise AttributeError("the engine core runs in a child process: its EngineCore is not reachable here")
        return self._backend

    def conversation(self, *, instructions: str | None = None) -> Conversation:
        return Conversation(self, instructions if instructions is not None else self.default_instructions)

    async def stats(self) -> EngineStats:
        """What the engine holds now (conversations, responses, KV positions, queued commands)."""
        queued = self._backend.pending()
        return await self._call(rq.GetStatsCommand(queued))

    async def wait_idle(self, poll_s: float = 0.001) -> None:
        """Wait until the engine has nothing to do: no response running and every conversation's
        background prefill caught up (benchmarks and tests use it)."""
        while await self._call(rq.HasWorkCommand()):
            await asyncio.sleep(poll_s)

    def close(self) -> None:
        """Stop the engine thread (or child process); running responses end cancelled."""
        self._backend.close()

    def _submit_nowait(self, command: CoreCall) -> Future:
        return self._backend.submit(command)

    def _post(self, command: CoreCall) -> None:
        self._backend.post(command)

    async def _call(self, command: CoreCall):
        """Run ``command`` and return its result. A bare callable (not an engine request) works only
        with the engine core in this process (tests)."""
        return await asyncio.wrap_future(self._backend.submit(command))
