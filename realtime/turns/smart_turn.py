"""Smart Turn v3.2, the end-of-turn model of ``semantic_vad``: the probability that a turn's audio ends a turn.

:class:`SmartTurnModel` runs pipecat's ONNX export (Whisper-tiny encoder with a classifier head, 8 MB int8, BSD-2)
with onnxruntime on the CPU over a batch of turns. The file is the one the ``pipecat-ai`` wheel ships
(:func:`bundled_model_path`, installed by this project's ``turn`` extra); it is found on disk without importing
pipecat (whose import pulls in its own dependencies) and is never downloaded.

:class:`TurnScorer` is the server's one front to the model: sessions ``await score(audio)`` on the event loop; the
requests of many sessions are batched and run on the scorer's own thread, never on the loop.

Errors: a model that cannot be loaded or that raises makes the scorer *broken* for good (a model that raised once
is not trusted again: its inputs are validated before they are queued, so a failure is a defect or a resource
problem, not bad input). It then logs ONE warning and calls ``on_failure`` once, and every request, waiting or
new, raises :class:`TurnModelUnavailable`: the caller falls back to silence-based (server VAD) turn detection.
"""

from __future__ import annotations

import asyncio
import importlib.metadata
import importlib.util
import logging
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import numpy as np

from realtime.turns.features import FRAMES, N_MELS, WhisperFeatures, last_window
from realtime.turns.model_settings import DEFAULT_MAX_BATCH, DEFAULT_MAX_WAITING, DEFAULT_THREADS

logger = logging.getLogger(__name__)

MODEL_DISTRIBUTION = "pipecat-ai"
"""The PyPI distribution that ships the model file (the ``turn`` extra pins its version)."""
MODEL_FILE = ("audio", "turn", "smart_turn", "data", "smart-turn-v3.2-cpu.onnx")
"""The model's path inside the ``pipecat`` package."""
INPUT_NAME = "input_features"
"""The ONNX graph's input: (B, 80, 800) float32 log-mel features."""


class TurnModelError(Exception):
    """The turn model cannot answer: the caller falls back to silence-based turn detection."""


class TurnModelUnavailable(TurnModelError):
    """The model is not there (the ``turn`` extra is not installed, the file is missing or unreadable), failed to
    load, failed earlier (the scorer is broken), or the scorer was closed."""


class TurnModelFailed(TurnModelError):
    """Running the model raised (the cause is chained)."""


class TurnModel(Protocol):
    """Scores whole turns: ``audios`` are 16 kHz mono float arrays (any length; the model hears the last 8 s);
    returns P(the turn is complete) for each, a float array of shape ``(len(audios),)`` in [0, 1].
    Called from one thread at a time."""

    def __call__(self, audios: Sequence[np.ndarray]) -> np.ndarray: ...


def bundled_model_path() -> Path:
    """The Smart Turn v3.2 CPU model inside the installed ``pipecat`` package, located without importing it.

    Raises :class:`TurnModelUnavailable` naming the fix when the package or the file is not there."""
    spec = importlib.util.find_spec("pipecat")
    if spec is None or not spec.submodule_search_locations:
        raise TurnModelUnavailable(
            f"the turn model ships in the {MODEL_DISTRIBUTION} package, which is not installed: "
            "pip install 'omni-realtime[turn]'"
        )
    for root in spec.submodule_search_locations:
        path = Path(root).joinpath(*MODEL_FILE)
        if path.is_file():
            return path
    raise TurnModelUnavailable(
        f"{'/'.join(MODEL_FILE)} is not in the installed pipecat package ({_distribution_version()}): "
        "install the version the turn extra names"
    )


def _distribution_version() -> str:
    try:
        return f"{MODEL_DISTRIBUTION} {importlib.metadata.version(MODEL_DISTRIBUTION)}"
    except importlib.metadata.PackageNotFoundError:
        return f"not installed as {MODEL_DISTRIBUTION}"


class SmartTurnModel:
    """Smart Turn v3.x (ONNX) on onnxruntime's CPU provider: a :class:`TurnModel`.

    ``threads``: onnxruntime's intra-op threads (1: the calling thread alone; the server's cores also serve every
    session's audio). Loading raises :class:`TurnModelUnavailable`; a call that raises in onnxruntime raises
    :class:`TurnModelFailed`. Bad audio raises :class:`~pipeline.errors.InvalidAudioError` before the model runs."""

    def __init__(self, path: Path, *, threads: int = DEFAULT_THREADS) -> None:
        if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
            raise ValueError(f"threads must be a positive integer, got {threads!r}")
        try:
            import onnxruntime as ort
        except ImportError as exc:
            raise TurnModelUnavailable("onnxruntime is not installed: pip install 'omni-realtime[turn]'") from exc
        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        try:
            self._session = ort.InferenceSession(str(path), sess_options=options, providers=["CPUExecutionProvider"])
        except Exception as exc:  # onnxruntime raises its own types (Fail, InvalidProtobuf, NoSuchFile...)
            raise TurnModelUnavailable(f"cannot load the turn model {path}: {exc}") from exc
        inputs = {i.name: i.shape for i in self._session.get_inputs()}
        if INPUT_NAME not in inputs or list(inputs[INPUT_NAME])[1:] != [N_MELS, FRAMES]:
            raise TurnModelUnavailable(f"{path} is not a Smart Turn v3 model: its inputs are {inputs}")
        self.path = path
        self._features = WhisperFeatures()

    @classmethod
    def bundled(cls, *, threads: int = DEFAULT_THREADS) -> SmartTurnModel:
        """The model the ``pipecat-ai`` wheel ships (:func:`bundled_model_path`)."""
        return cls(bundled_model_path(), threads=threads)

    def features(self, audios: Sequence[np.ndarray]) -> np.ndarray:
        """The model's input for ``audios``: (B, 80, 800) float32 (:mod:`realtime.turns.features`)."""
        return self._features(audios)

    def __call__(self, audios: Sequence[np.ndarray]) -> np.ndarray:
        features = self.features(audios)
        try:
            (probabilities,) = self._session.run(None, {INPUT_NAME: features})
        except Exception as exc:  # onnxruntime's own exception types
            raise TurnModelFailed(f"the turn model raised on a batch of {len(audios)}: {exc}") from exc
        # the graph ends in a sigmoid (pipecat's analyzer reads it the same way): its (B, 1) output is a probability
        result = np.asarray(probabilities, dtype=np.float64).reshape(len(audios))
        if not ((result >= 0.0) & (result <= 1.0)).all():
            raise TurnModelFailed(f"the turn model answered values that are not probabilities: {result}")
        return result


@dataclass
class _Request:
    window: np.ndarray
    answer: asyncio.Future[float]


class TurnScorer:
    """Batches turn-scoring requests from every session and runs them on one thread of its own.

    Calling order: :meth:`score` from coroutines of ONE event loop, any number at a time; :meth:`close` once at the
    end. The model is made by ``load()`` on the scorer's thread before its first batch (or at :meth:`start`).

    Batching: while a batch runs, new requests wait; when it ends, the next batch takes up to ``max_batch`` of the
    waiting requests, oldest first. A lone request runs at once (no window to fill).

    Bounded: at most ``max_waiting`` requests wait (not counting the running batch). When full, :meth:`score`
    answers ``None`` ("unknown") at once and calls ``on_shed``: the caller decides by the silence length alone,
    as it would without a model. A request therefore waits at most ``ceil(max_waiting / max_batch)`` batches
    before its own.

    Cancellation: a cancelled :meth:`score` leaves its request behind; a batch that has not started skips it, a
    running batch runs it and drops its answer. Nobody waits for a cancelled caller.

    Failure: see the module docstring (:class:`TurnModelUnavailable` for everyone once broken; ``on_failure`` once).
    """

    def __init__(
        self,
        load: Callable[[], TurnModel],
        *,
        max_batch: int = DEFAULT_MAX_BATCH,
        max_waiting: int = DEFAULT_MAX_WAITING,
        on_failure: Callable[[TurnModelError], None] | None = None,
        on_shed: Callable[[], None] | None = None,
    ) -> None:
        for name, value in (("max_batch", max_batch), ("max_waiting", max_waiting)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        self.max_batch = max_batch
        self.max_waiting = max_waiting
        self._load = load
        self._on_failure = on_failure
        self._on_shed = on_shed
        self._model: TurnModel | None = None  # touched only on the scorer's thread
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="turn-model", initializer=_one_torch_thread)
        self._waiting: deque[_Request] = deque()
        self._running: list[_Request] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._broken: TurnModelError | None = None
        self.calls = 0
        """Model calls (batches) run so far."""
        self.shed = 0
        """Requests answered ``None`` because ``max_waiting`` requests were waiting."""

    @property
    def broken(self) -> TurnModelError | None:
        """Why the scorer no longer scores (None while it does)."""
        return self._broken

    async def start(self) -> None:
        """Load the model now (on the scorer's thread) rather than at the first request. Raises
        :class:`TurnModelUnavailable` when it cannot be loaded (the scorer is then broken, as at a first request)."""
        self._bind_loop()
        if self._broken is not None:
            raise _unavailable(self._broken)
        try:
            await asyncio.wrap_future(self._executor.submit(self._ensure_model))
        except TurnModelError as exc:
            self._break(exc)
            raise _unavailable(exc) from exc

    async def score(self, audio: np.ndarray) -> float | None:
        """P(the turn whose 16 kHz mono float audio is ``audio`` is complete), in [0, 1]; ``None`` when the scorer
        is saturated (see the class docstring). Only the last 8 s of ``audio`` are heard (copied here: the caller
        may reuse its buffer). Raises :class:`TurnModelUnavailable` once the scorer is broken or closed, and
        :class:`~pipeline.errors.InvalidAudioError` for audio that is not finite 1-D float samples."""
        self._bind_loop()
        if self._broken is not None:
            raise _unavailable(self._broken)
        window = last_window(audio)
        if len(self._waiting) >= self.max_waiting:
            self.shed += 1
            if self._on_shed is not None:
                self._on_shed()
            return None
        assert self._loop is not None
        request = _Request(window, self._loop.create_future())
        self._waiting.append(request)
        self._start_batch()
        return await request.answer

    def close(self) -> None:
        """Stop: waiting requests raise :class:`TurnModelUnavailable`, later ones too; a running batch finishes on
        the scorer's thread and its answers are dropped. Idempotent; does not wait for the thread."""
        if self._broken is None:
            self._broken = TurnModelUnavailable("the turn scorer was closed")
        self._fail_waiting(self._broken)
        for request in self._running or []:
            if not request.answer.done():
                request.answer.set_exception(_unavailable(self._broken))
        self._executor.shutdown(wait=False, cancel_futures=True)

    # --- on the event loop -------------------------------------------------------------------------------------
    def _bind_loop(self) -> None:
        loop = asyncio.get_running_loop()
        if self._loop is None:
            self._loop = loop
        elif self._loop is not loop:
            raise RuntimeError("a TurnScorer serves the one event loop it was first used on")

    def _start_batch(self) -> None:
        if self._running is not None or self._broken is not None:
            return
        batch: list[_Request] = []
        while self._waiting and len(batch) < self.max_batch:
            request = self._waiting.popleft()
            if not request.answer.done():  # a cancelled caller's request costs no model time
                batch.append(request)
        if not batch:
            return
        self._running = batch
        self.calls += 1
        ran = self._executor.submit(self._run, [r.window for r in batch])
        loop = self._loop
        assert loop is not None
        ran.add_done_callback(lambda done: _hand_back(loop, self._finish, done))

    def _finish(self, ran: Future) -> None:
        batch, self._running = self._running or [], None
        if ran.cancelled():  # the scorer was closed before the batch started
            return
        exc = ran.exception()
        if exc is not None:
            error = exc if isinstance(exc, TurnModelError) else TurnModelFailed(f"the turn model raised: {exc!r}")
            if error is not exc:
                error.__cause__ = exc
            self._break(error)
            for request in batch:
                if not request.answer.done():
                    request.answer.set_exception(_unavailable(error))
            return
        for request, probability in zip(batch, ran.result(), strict=True):
            if not request.answer.done():  # its caller may have been cancelled meanwhile
                request.answer.set_result(float(probability))
        self._start_batch()

    def _break(self, error: TurnModelError) -> None:
        if self._broken is not None:
            return
        self._broken = error
        logger.warning("semantic turn detection falls back to silence-based detection: %s", error)
        self._fail_waiting(error)
        if self._on_failure is not None:
            self._on_failure(error)

    def _fail_waiting(self, error: TurnModelError) -> None:
        while self._waiting:
            request = self._waiting.popleft()
            if not request.answer.done():
                request.answer.set_exception(_unavailable(error))

    # --- on the scorer's thread --------------------------------------------------------------------------------
    def _ensure_model(self) -> TurnModel:
        if self._model is None:
            try:
                self._model = self._load()
            except TurnModelError:
                raise
            except Exception as exc:  # a loader's own failure: the model is unavailable all the same
                raise TurnModelUnavailable(f"loading the turn model raised {exc!r}") from exc
        return self._model

    def _run(self, windows: list[np.ndarray]) -> np.ndarray:
        probabilities = np.asarray(self._ensure_model()(windows), dtype=np.float64)
        if probabilities.shape != (len(windows),):
            raise TurnModelFailed(f"the turn model answered shape {probabilities.shape} for {len(windows)} turns")
        return probabilities


def _unavailable(cause: TurnModelError) -> TurnModelUnavailable:
    """What a caller gets from a broken or closed scorer: a fresh exception (each caller's own traceback) whose
    cause is the scorer's failure."""
    error = TurnModelUnavailable(str(cause))
    error.__cause__ = cause
    return error


def _one_torch_thread() -> None:
    # A new thread starts with OpenMP's default thread count (every core); the features' STFT of a few 8 s windows
    # only pays for their spinning, and the cores serve every session's audio.
    import torch

    torch.set_num_threads(1)


def _hand_back(loop: asyncio.AbstractEventLoop, finish: Callable[[Future], None], ran: Future) -> None:
    """On the scorer's thread: the batch's outcome goes to the loop its callers wait on. A loop already closed has
    no one waiting."""
    try:
        loop.call_soon_threadsafe(finish, ran)
    except RuntimeError:  # asyncio's "Event loop is closed"
        if not loop.is_closed():
            raise
        logger.debug("a turn-model batch finished after its event loop closed")
