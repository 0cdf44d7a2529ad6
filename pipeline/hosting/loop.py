"""The engine loop: one thread that runs commands and engine steps (the only one that touches model tensors).

:class:`EngineThread` runs in the caller's process, or in the child process of
:class:`pipeline.hosting.process.EngineProcess`;
both implement :class:`EngineBackend`, the interface :mod:`pipeline.engine`'s async API talks to. Commands run
between two steps, in submission order; results and errors come back through futures.
"""

from __future__ import annotations

import contextlib
import logging
import os
import platform
import queue
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, Protocol

import torch
from typing_extensions import TypeIs  # typing's own from Python 3.13; a dependency of torch

from pipeline.api import VisionInfo
from pipeline.config import StageGraphConfig
from pipeline.core.commands import CoreCommand
from pipeline.core.engine_core import EngineCore
from pipeline.errors import EngineClosedError, PipelineError
from pipeline.models import family_of
from pipeline.models.family import Checkpoint

log = logging.getLogger(__name__)

_STOP = object()

DECODE_STREAM_PRIORITY = -1
"""CUDA stream priority of the engine thread (lower is more urgent; torch's streams default to 0)."""

SLOW_REQUEST_MS = 50.0
"""An engine request (a commit's tail encode, an audio block) running longer than this is logged: it delays
every response's next step and the command behind it."""

ENGINE_SWITCH_INTERVAL_S = 0.0005
"""The interpreter's thread switch interval while an engine runs (process-wide; Python's default is 5 ms)."""


def _noop(core: EngineCore) -> None:
    return None


CoreCall = CoreCommand | Callable[[EngineCore], object]
"""What an engine thread runs between two steps: an engine request (:mod:`pipeline.core.commands`, run by
:meth:`EngineCore.handle <pipeline.core.engine_core.EngineCore.handle>`), or (in this process only: tests, and the
child side of an
engine process) any callable taking the core."""


class EngineBackend(Protocol):
    """Where the engine core runs: :class:`EngineThread` (this process) or
    :class:`pipeline.hosting.process.EngineProcess` (a child process). Commands run in submission order,
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
    """Empty when the engine has no audio output."""
    default_voice: str | None
    """None when the engine has no audio output."""
    random_weights: bool
    device_name: str
    """The thinker's device in words (the GPU's name on CUDA), for reports."""
    max_output_tokens: int
    """The longest reply in text tokens: the thinker's ``max_tokens``, else its context size."""
    vision: VisionInfo | None = None
    """What the checkpoint's vision tower takes; None: it has none."""
    audio_output: bool = True
    """Whether the checkpoint speaks (:meth:`ModelFamily.speaks <pipeline.models.family.ModelFamily.speaks>`); if
    not, the engine answers in text only and refuses a spoken response."""

    @classmethod
    def of(cls, ckpt: Checkpoint, cfg: StageGraphConfig) -> EngineFacts:
        device = cfg.thinker.torch_device
        if device.type == "cuda":
            name = torch.cuda.get_device_name(device)
        else:
            name = f"{device.type.upper()} ({os.cpu_count()} cores, {platform.machine()})"
        family = family_of(cfg.model_family)
        speaks = family.speaks(ckpt)
        return cls(
            model_name=ckpt.source,
            voices=family.voices(ckpt) if speaks else (),
            default_voice=family.default_voice(ckpt) if speaks else None,
            random_weights=ckpt.random_weights,
            device_name=name,
            max_output_tokens=cfg.thinker.max_tokens or cfg.thinker.max_context_tokens or family.max_context(ckpt),
            vision=family.vision_info(ckpt),
            audio_output=speaks,
        )


class EngineThread:
    """Runs commands and engine steps on one thread (the only one that touches model tensors)."""

    def __init__(self, core: EngineCore) -> None:
        self.core = core
        # Every torch call releases and re-takes the GIL; while the server's event loop runs Python (VAD,
        # JSON, base64), each re-take can wait a whole switch interval (5 ms by default), and an eager prefill
        # makes hundreds of calls per step. A short interval bounds each wait (its effect alone is not measured).
        if sys.getswitchinterval() > ENGINE_SWITCH_INTERVAL_S:
            sys.setswitchinterval(ENGINE_SWITCH_INTERVAL_S)
        self._commands: queue.SimpleQueue = queue.SimpleQueue()
        core.commands_waiting = lambda: not self._commands.empty()
        # a finished token2wav chunk, picture preprocessing or vision encode wakes the loop at once instead of at its
        # next poll
        core.wake_on_results(lambda: self._commands.put((_noop, None)))
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
        (a 4 ms step took ~290 ms while a chunk was being made). With the talker on another GPU than the thinker, it
        gets such a stream there too (token2wav may share that GPU); the thinker's device stays the thread's current
        one."""
        stack = contextlib.ExitStack()
        for device in reversed(self.core.decode_devices):  # the thinker's last: its device ends up current
            if device.type == "cuda":
                torch.cuda.synchronize(device)  # what start-up queued on the default stream (pools, graphs) is done
                stack.enter_context(torch.cuda.stream(torch.cuda.Stream(device, priority=DECODE_STREAM_PRIORITY)))
        return stack

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
                progressed = self._step()

    def _step(self) -> bool:
        """One engine step. A step that raises (a bug: the core isolates each response's own failures) fails every
        live response and the loop serves on, rather than leaving every session waiting for an engine thread that
        died."""
        try:
            return self.core.step()
        except Exception:  # noqa: BLE001 - the engine thread must go on serving the sessions that come next
            log.exception("engine step failed; every live response fails")
            self.core.fail_all()
            return True

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
                    result = self._timed(fn, lambda f: run_call(f, self.core))
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
            if elapsed_ms > SLOW_REQUEST_MS:
                log.info("slow engine request: %s took %.0f ms", _describe(fn), elapsed_ms)

    def _run_posted(self, fn: CoreCall) -> None:
        try:
            run_call(fn, self.core)
        except PipelineError as exc:  # e.g. audio appended to a conversation closed meanwhile
            log.info("engine command %s failed (nobody waits for it): %s", _describe(fn), exc)
        except Exception:  # noqa: BLE001 - a bug, but the engine thread must go on serving everyone else
            log.exception("engine command %s failed (nobody waits for it)", _describe(fn))

    def _shutdown(self) -> None:
        self.core.close()


def _describe(fn: CoreCall) -> str:
    return type(fn).__name__ if is_request(fn) else getattr(fn, "__qualname__", type(fn).__name__)


def is_request(fn: CoreCall) -> TypeIs[CoreCommand]:
    return isinstance(fn, CoreCommand.__args__)


def run_call(fn: CoreCall, core: EngineCore):
    """Run one call on the engine thread: a request through the core's ``handle``, a callable with the core."""
    return core.handle(fn) if is_request(fn) else fn(core)
