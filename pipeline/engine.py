"""The async engine: the public API of :mod:`pipeline` (implements :mod:`pipeline.api`).

One engine thread owns the :class:`~pipeline.core.EngineCore` and every model tensor. Coroutines
talk to it through a command queue; each command (:class:`~pipeline.commands.Command`) runs between
two engine steps, in submission order, and its result or exception comes back through a future.
Response events travel back with ``loop.call_soon_threadsafe`` into the response's own queue.

The engine thread runs either in this process (:class:`EngineThread`) or in a child process that owns
the GPU (:class:`pipeline.engine_process.EngineProcess`, chosen by the stage config's
``engine.process``); both take the same commands and deliver the same events, so everything above
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
import contextlib
import itertools
import logging
import os
import platform
import queue
import sys
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch

from pipeline.api import INPUT_SAMPLE_RATE, Modality, Role
from pipeline.commands import Command
from pipeline.config import StageGraphConfig, load_stage_config
from pipeline.core import EngineCore
from pipeline.errors import (
    ConfigError,
    EngineClosedError,
    InvalidAudioError,
    InvalidInputError,
    PipelineError,
    ResponseActiveError,
    UnknownVoiceError,
)
from pipeline.loaders import CheckpointLoader, PretrainedCheckpoint
from pipeline.models.qwen2_5_omni.checkpoint import LoadedCheckpoint
from pipeline.models.qwen2_5_omni.prompt import DEFAULT_SYSTEM_PROMPT
from pipeline.outputs import EngineStats, ResponseDone, ResponseEvent, ResponseStatus, Usage
from pipeline.request import ResponseSpec

log = logging.getLogger(__name__)

_STOP = object()
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


DECODE_STREAM_PRIORITY = -1
"""CUDA stream priority of the engine thread (lower is more urgent; torch's streams default to 0)."""

SLOW_COMMAND_MS = 50.0
"""An engine command (a commit's tail encode, an audio block) running longer than this is logged: it delays
every response's next step and the command behind it."""

ENGINE_SWITCH_INTERVAL_S = 0.0005
"""The interpreter's thread switch interval while an engine runs (process-wide; Python's default is 5 ms)."""


def _noop(core: EngineCore) -> None:
    return None


CoreCall = Callable[[EngineCore], object]
"""What an engine thread runs between two steps: a :class:`~pipeline.commands.Command`, or (in this
process only: tests, and the child side of an engine process) any callable taking the core."""


class EngineBackend(Protocol):
    """Where the engine core runs: :class:`EngineThread` (this process) or
    :class:`pipeline.engine_process.EngineProcess` (a child process). Commands run in submission order,
    ``submit``'s and ``post``'s together; both raise :class:`EngineClosedError` once the backend is closed
    (:class:`~pipeline.errors.EngineDeadError` once a child process died)."""

    @property
    def closed(self) -> bool: ...

    def submit(self, command: CoreCall) -> Future:
        """Run ``command`` between two steps; its result or exception comes back through the future."""
        ...

    def post(self, command: CoreCall) -> None:
        """Run ``command`` between two steps; nobody waits for it (a failure is logged)."""
        ...

    def consumed(self, response_id: str, *, done: bool) -> None:
        """The consumer took one event of ``response_id`` (``done``: its last): backpressure credit."""
        ...

    def pending(self) -> int:
        """Commands submitted and not run yet."""
        ...

    def close(self, timeout: float = 10.0) -> None: ...


@dataclass(frozen=True)
class EngineFacts:
    """What the async API needs to know of the loaded checkpoint (an engine process sends it once, after
    loading, so the caller's process never loads the weights)."""

    model_name: str
    voices: tuple[str, ...]
    default_voice: str
    random_weights: bool
    device_name: str
    """The thinker's device in words (the GPU's name on CUDA), for reports."""

    @classmethod
    def of(cls, ckpt: LoadedCheckpoint, cfg: StageGraphConfig) -> EngineFacts:
        device = torch.device(cfg.thinker.torch_device())
        if device.type == "cuda":
            name = torch.cuda.get_device_name(device)
        else:
            name = f"{device.type.upper()} ({os.cpu_count()} cores, {platform.machine()})"
        return cls(model_name=ckpt.source, voices=tuple(ckpt.speakers), default_voice=ckpt.default_speaker,
                   random_weights=ckpt.random_weights, device_name=name)


class EngineThread:
    """Runs commands and engine steps on one thread (the only one that touches model tensors)."""

    def __init__(self, core: EngineCore) -> None:
        self.core = core
        # Every torch call releases and re-takes the GIL; while the server's event loop runs Python (VAD,
        # JSON, base64), each re-take can wait a whole switch interval (5 ms by default), and an eager prefill
        # makes hundreds of calls per step. A short interval bounds each wait. (Its effect was not measured on
        # its own: the 1 s prefills first suspected of this convoy turned out to be cuDNN, BENCHMARKS.md §6.3.)
        if sys.getswitchinterval() > ENGINE_SWITCH_INTERVAL_S:
            sys.setswitchinterval(ENGINE_SWITCH_INTERVAL_S)
        self._commands: queue.SimpleQueue = queue.SimpleQueue()
        core.commands_waiting = lambda: not self._commands.empty()
        if core.t2w_worker is not None:  # a finished chunk wakes the loop at once instead of at its next poll
            core.t2w_worker.on_done = lambda: self._commands.put((_noop, None))
        self._thread = threading.Thread(target=self._loop, name="omni-engine", daemon=True)
        self._closed = False
        self._thread.start()

    @property
    def closed(self) -> bool:
        return self._closed

    def submit(self, fn: CoreCall) -> Future:
        if self._closed:
            raise EngineClosedError("the engine is shut down")
        fut: Future = Future()
        self._commands.put((fn, fut))
        return fut

    def post(self, fn: CoreCall) -> None:
        if self._closed:
            raise EngineClosedError("the engine is shut down")
        self._commands.put((fn, None))

    def consumed(self, response_id: str, *, done: bool) -> None:
        """Nothing to do: the core polls the response's own ``can_accept`` in this process."""

    def pending(self) -> int:
        return self._commands.qsize()

    def close(self, timeout: float = 10.0) -> None:
        if not self._closed:
            self._closed = True
            self._commands.put(_STOP)
            self._thread.join(timeout)

    def _loop(self) -> None:
        # Everything on this thread is inference: no autograd bookkeeping, in-place edits allowed.
        with torch.inference_mode(), self._decode_stream():
            self._serve()

    def _decode_stream(self):
        """On CUDA the engine thread's GPU work goes to a high-priority stream: its decode steps are hundreds of
        small kernels, and at equal priority each one queued behind the token2wav worker's large DiT kernels
        (a 4 ms step took ~290 ms while a chunk was being made)."""
        device = self.core.thinker.device
        if device.type != "cuda":
            return contextlib.nullcontext()
        torch.cuda.synchronize(device)  # what start-up queued on the default stream (pools, graphs) is done
        return torch.cuda.stream(torch.cuda.Stream(device, priority=DECODE_STREAM_PRIORITY))

    def _serve(self) -> None:
        progressed = True
        while True:
            idle = not self.core.has_work()
            timeout = None if idle else (0 if progressed else 0.005)
            if not self._run_commands(block=idle or not progressed, timeout=timeout):
                return
            # The audio encodes the commands queued run here, before the step, and what arrived meanwhile joins
            # that step: a response asked right behind its commit starts with it instead of one step later.
            if self.core.encode_audio() and not self._run_commands(block=False, timeout=None):
                return
            if self.core.has_work():
                progressed = self.core.step()

    def _run_commands(self, *, block: bool, timeout: float | None) -> bool:
        try:
            first = self._commands.get(block=block, timeout=timeout) if block else self._commands.get_nowait()
        except queue.Empty:
            return True
        pending = [first]
        while True:
            try:
                pending.append(self._commands.get_nowait())
            except queue.Empty:
                break
        for cmd in pending:
            if cmd is _STOP:
                self._shutdown()
                return False
            fn, fut = cmd
            if fut is None:
                self._timed(fn, self._run_posted)
            elif fut.set_running_or_notify_cancel():
                try:
                    result = self._timed(fn, lambda f: f(self.core))
                except BaseException as exc:  # noqa: BLE001 - delivered to the caller through its future
                    fut.set_exception(exc)
                else:
                    fut.set_result(result)
        return True

    @staticmethod
    def _timed(fn: CoreCall, run: Callable[[CoreCall], Any]) -> Any:
        """Run one command and log it if slow; the log line comes before the caller's future is resolved,
        so whoever awaits the command sees it already written."""
        started = time.perf_counter()
        try:
            return run(fn)
        finally:
            elapsed_ms = (time.perf_counter() - started) * 1000
            if elapsed_ms > SLOW_COMMAND_MS:
                log.info("slow engine command: %s took %.0f ms", _describe(fn), elapsed_ms)

    def _run_posted(self, fn: CoreCall) -> None:
        try:
            fn(self.core)
        except PipelineError as exc:  # e.g. audio appended to a conversation closed meanwhile
            log.info("engine command %s failed (nobody waits for it): %s", _describe(fn), exc)
        except Exception:  # noqa: BLE001 - a bug, but the engine thread must go on serving everyone else
            log.exception("engine command %s failed (nobody waits for it)", _describe(fn))

    def _shutdown(self) -> None:
        for conv_id in list(self.core.conversations):
            self.core.close_conversation(conv_id)
        self.core.close()


def _describe(fn: CoreCall) -> str:
    return fn.method if isinstance(fn, Command) else getattr(fn, "__qualname__", type(fn).__name__)


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
                if last:
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
            self._engine._post(Command("cancel_response", (self.id, reason)))
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
            self._conv._engine._post(Command("append_audio", (self._conv.id, self.item_id, pcm)))

    def commit(self) -> Awaitable[None]:
        """Sent to the engine now (ordered before any later command); await the result for its errors."""
        self._closed = True
        command = Command("commit_audio", (self._conv.id, self.item_id))
        return asyncio.wrap_future(self._conv._engine._submit_nowait(command))

    async def discard(self) -> None:
        self._closed = True
        await self._conv._engine._call(Command("discard_audio", (self._conv.id, self.item_id)))


class Conversation:
    """One conversation's history and KV state in the engine (see :class:`pipeline.api.ConversationHandle`)."""

    def __init__(self, engine: OmniEngine, instructions: str) -> None:
        self.id = f"conv_{next(_ids)}"
        self._engine = engine
        self._active: Response | None = None
        engine._post(Command("open_conversation", (self.id, instructions)))

    async def set_instructions(self, instructions: str) -> None:
        await self._engine._call(Command("set_instructions", (self.id, instructions)))

    async def add_text(self, item_id: str, text: str, role: Role = "user") -> None:
        if role not in ("system", "user", "assistant"):
            raise InvalidInputError(f"unknown role {role!r}", param="role")
        await self._engine._call(Command("add_text", (self.id, item_id, role, text)))

    async def add_audio(self, item_id: str, pcm: np.ndarray) -> None:
        validate_pcm(pcm)
        await self._engine._call(Command("add_audio", (self.id, item_id, pcm)))

    def open_audio(self, item_id: str) -> AudioInput:
        return AudioInput(self, item_id)

    async def delete_item(self, item_id: str) -> None:
        await self._engine._call(Command("delete_item", (self.id, item_id)))

    async def truncate_item(self, item_id: str, audio_end_ms: int) -> None:
        if audio_end_ms < 0:
            raise InvalidInputError("audio_end_ms must be >= 0", param="audio_end_ms")
        await self._engine._call(Command("truncate_item", (self.id, item_id, audio_end_ms)))

    def respond(
        self,
        *,
        item_id: str,
        modalities: frozenset[Modality] = frozenset({"text", "audio"}),
        voice: str | None = None,
        max_output_tokens: int | None = None,
    ) -> Response:
        engine = self._engine
        voice = voice or engine.default_voice
        if voice not in engine.voices:
            raise UnknownVoiceError(f"unknown voice {voice!r}; available: {', '.join(engine.voices)}", param="voice")
        if not modalities or not set(modalities) <= {"text", "audio"}:
            raise InvalidInputError(f"modalities must be a non-empty subset of text, audio: {modalities}", param="modalities")
        if max_output_tokens is not None and max_output_tokens <= 0:
            raise InvalidInputError("max_output_tokens must be positive", param="max_output_tokens")
        if self._active is not None:
            raise ResponseActiveError("a response is already in progress for this conversation", param="response")
        resp = Response(engine, self, item_id, max_pending=engine.max_pending_events)
        limit = engine.max_text_tokens if max_output_tokens is None else min(max_output_tokens, engine.max_text_tokens)
        spec = ResponseSpec(
            id=resp.id, conv_id=self.id, item_id=item_id, audio="audio" in modalities, voice=voice,
            max_text_tokens=limit, sink=resp._sink, can_accept=resp._can_accept,
        )
        self._active = resp
        try:
            fut = engine._submit_nowait(Command("start_response", (spec,)))
        except BaseException:
            self._active = None
            raise
        fut.add_done_callback(lambda f: f.exception() and resp._fail_now(f.exception()))
        return resp

    async def close(self) -> None:
        if self._engine.closed:
            return
        await self._engine._call(Command("close_conversation", (self.id,)))


class OmniEngine:
    """Serves conversations from one checkpoint (implements :class:`pipeline.api.EngineHandle`).

    The engine core runs on a thread of this process, or in a child process that loads the checkpoint
    itself (the stage config's ``engine.process``; :meth:`from_pretrained` and :meth:`from_loader` choose).
    ``ckpt`` is the loaded checkpoint in the first case and None in the second."""

    def __init__(
        self, ckpt: LoadedCheckpoint, cfg: StageGraphConfig, *, seed: int | None = None, max_pending_events: int = 256
    ) -> None:
        """An engine on a thread of this process over ``ckpt``, already loaded here (tensors cannot be handed
        to a child process: use :meth:`from_loader` for ``engine.process``)."""
        if cfg.engine.process == "on":
            raise ConfigError("engine.process is 'on', but the checkpoint is already loaded in this process: "
                              "use OmniEngine.from_pretrained or OmniEngine.from_loader", param="engine.process")
        if cfg.engine_in_process():
            log.warning("engine.process is auto on CUDA, but the checkpoint was loaded in this process: the engine "
                        "core runs on a thread here (OmniEngine.from_loader runs it in a child process)")
        backend = EngineThread(EngineCore(ckpt, cfg, seed=seed))
        self._setup(cfg, EngineFacts.of(ckpt, cfg), backend, max_pending_events, ckpt)

    def _setup(
        self, cfg: StageGraphConfig, facts: EngineFacts, backend: EngineBackend, max_pending_events: int,
        ckpt: LoadedCheckpoint | None,
    ) -> None:
        self.ckpt = ckpt
        self.cfg = cfg
        self.facts = facts
        self.model_name = facts.model_name
        self.voices = facts.voices
        self.default_voice = facts.default_voice
        self.default_instructions = DEFAULT_SYSTEM_PROMPT
        self.random_weights = facts.random_weights
        self.max_text_tokens = cfg.thinker.max_tokens or 1024
        self.max_pending_events = max_pending_events
        self._backend = backend
        if self.random_weights:
            log.warning(
                "MODEL %s HAS RANDOM WEIGHTS: it is a test model, not an assistant; its speech and text are noise.",
                self.model_name,
            )

    @classmethod
    def from_pretrained(
        cls, model: str | Path, stage_config: str | Path | StageGraphConfig | None = None, *, seed: int | None = None,
        max_pending_events: int = 256, torch_threads: int | None = None,
    ) -> OmniEngine:
        """The checkpoint folder or cached hub id ``model`` served as ``stage_config`` says (the packaged
        stage graph when None), its engine core in a child process or not per ``engine.process``."""
        cfg = stage_config if isinstance(stage_config, StageGraphConfig) else load_stage_config(stage_config)
        return cls.from_loader(PretrainedCheckpoint(str(model)), cfg, seed=seed, max_pending_events=max_pending_events,
                               torch_threads=torch_threads)

    @classmethod
    def from_loader(
        cls, loader: CheckpointLoader, cfg: StageGraphConfig, *, seed: int | None = None,
        max_pending_events: int = 256, torch_threads: int | None = None,
    ) -> OmniEngine:
        """The checkpoint ``loader`` makes (:mod:`pipeline.loaders`). With ``engine.process`` on (or auto on
        CUDA) the loader is handed to a child process, which loads the weights and runs the engine core; this
        call returns once it is ready, and raises what loading raised there. ``torch_threads``: the child's
        torch CPU threads (default: this process's ``torch.get_num_threads()``); unused on a thread."""
        if not cfg.engine_in_process():
            return cls(loader.load(cfg), cfg, seed=seed, max_pending_events=max_pending_events)
        from pipeline.engine_process import EngineProcess, ProcessSpec

        threads = torch_threads if torch_threads is not None else torch.get_num_threads()
        backend = EngineProcess(ProcessSpec(loader=loader, cfg=cfg, seed=seed, max_pending_events=max_pending_events,
                                            torch_threads=threads, log_level=logging.getLogger().getEffectiveLevel()))
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
        return await self._call(Command("stats", (queued,)))

    async def wait_idle(self, poll_s: float = 0.001) -> None:
        """Wait until the engine has nothing to do: no response running and every conversation's
        background prefill caught up (benchmarks and tests use it)."""
        while await self._call(Command("has_work")):
            await asyncio.sleep(poll_s)

    def close(self) -> None:
        """Stop the engine thread (or child process); running responses end cancelled."""
        self._backend.close()

    def _submit_nowait(self, command: CoreCall) -> Future:
        return self._backend.submit(command)

    def _post(self, command: CoreCall) -> None:
        self._backend.post(command)

    async def _call(self, command: CoreCall):
        """Run ``command`` and return its result. A bare callable (not a :class:`Command`) works only
        with the engine core in this process (tests)."""
        return await asyncio.wrap_future(self._backend.submit(command))
