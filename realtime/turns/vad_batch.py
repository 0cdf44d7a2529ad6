"""The server VAD of every session scored together: one silero call for the frames that many sessions sent
within a few milliseconds, instead of one call per frame per session on the event loop (~1 ms of CPU each: at 64
sessions that was ~75 % of the loop's time, and turn ends were detected seconds late).

:class:`SileroBatchModel` is the network run over a batch with each stream's state kept by the caller (pure);
:class:`VadBatcher` gathers frames on the event loop and runs each batch on the process's VAD thread, off the loop;
:class:`BatchedSileroStream` is one session's :class:`~realtime.turns.vad.BatchedSpeechProbability` on it.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
import torch

logger = logging.getLogger(__name__)


@dataclass
class SileroState:
    """One stream's memory in the batched silero model: its recurrent state (2, 1, 128) and the last
    ``context`` samples of its previous frame (1, 64)."""

    rnn: torch.Tensor
    context: torch.Tensor


class SileroBatchModel:
    """silero-vad's 16 kHz network run over frames of many streams in one call, each stream's state kept by
    the caller (:class:`SileroState`). Row by row it computes what :class:`SileroVad` computes (the packaged
    model's own wrapper prepends the previous frame's last 64 samples and carries the recurrent state); one
    call for 64 frames costs ~6 ms of CPU against ~0.7 ms for one (measured on a 2-core VM)."""

    frame_samples = 512

    def __init__(self) -> None:
        from silero_vad import load_silero_vad  # deferred: the import sets torch's thread count

        torch.set_num_threads(1)
        self._net = load_silero_vad()._model
        self.context_samples = int(self._net.context_size_samples)

    def new_state(self) -> SileroState:
        return SileroState(torch.zeros(2, 1, 128), torch.zeros(1, self.context_samples))

    def run(self, states: list[SileroState], frames: np.ndarray) -> np.ndarray:
        """P(speech) of ``frames`` (B, 512), row b the next frame of the stream whose state is ``states[b]``
        (each state at most once); the states advance."""
        frames = np.asarray(frames, dtype=np.float32)
        if frames.shape != (len(states), self.frame_samples):
            raise ValueError(f"expected frames of shape ({len(states)}, {self.frame_samples}), got {frames.shape}")
        with torch.inference_mode():
            x = torch.cat([torch.cat([s.context for s in states]), torch.from_numpy(frames.copy())], dim=1)
            out, rnn = self._net(x, torch.cat([s.rnn for s in states], dim=1))
        for b, state in enumerate(states):
            state.rnn, state.context = rnn[:, b : b + 1].clone(), x[b : b + 1, -self.context_samples :].clone()
        return out[:, 0].numpy()


_vad_thread: ThreadPoolExecutor | None = None
_vad_thread_lock = threading.Lock()


def _one_torch_thread() -> None:
    # A new thread starts with OpenMP's default thread count (every core): a batch of a few 512-sample frames only
    # pays for their spinning.
    torch.set_num_threads(1)


def vad_thread() -> ThreadPoolExecutor:
    """The process's one VAD thread, shared by every :class:`VadBatcher` (made on first use; its idle thread ends
    with the interpreter). One thread: batches run one at a time, in the order they were flushed."""
    global _vad_thread
    with _vad_thread_lock:
        if _vad_thread is None:
            _vad_thread = ThreadPoolExecutor(1, thread_name_prefix="vad", initializer=_one_torch_thread)
        return _vad_thread


class VadBatcher:
    """Scores the frames of every session's VAD together, one batched call per flush, run on the VAD thread
    (:func:`vad_thread`) so that the event loop only gathers frames and hands out results.

    A flush runs as soon as every *active* stream (made, or sent a frame, within ``active_s``) has a frame pending,
    else ``window_s`` after the first pending frame. Sessions send a frame each 32 ms hop, at phases of their own: the
    window gathers about ``window_s / 32 ms`` of them per call, and the early flush means a lone session (or a set
    of sessions whose frames happen to line up) waits for no one. A frame thus waits at most ``window_s`` for its
    probability. Each session awaits a frame's probability before sending its next, so a stream appears at most
    once in a call and a session with a backlog drains it at one frame per flush. Bounded: one pending frame per
    live session. Frames that arrive while a batch runs gather into the next one. Results are set on the event loop
    once their batch has run; a session cancelled meanwhile just misses its result (the stream's state still
    advances, as it would have). A failing call fails every frame of that call (their sessions get the error)."""

    def __init__(self, model: SileroBatchModel, *, window_s: float = 0.016, active_s: float = 0.1) -> None:
        self.model = model
        self.window_s = window_s
        self.active_s = active_s
        self.calls = 0
        """Batched model calls so far (the tests count them)."""
        self._pending: list[tuple[SileroState, np.ndarray, asyncio.Future]] = []
        self._flush_at: asyncio.TimerHandle | None = None
        self._last_frame: dict[int, float] = {}
        """id of a stream's state → ``time.monotonic()`` of its creation or latest frame (pruned as a batch starts)."""

    def stream(self) -> BatchedSileroStream:
        """A fresh stream (one session's VAD)."""
        return BatchedSileroStream(self)

    def new_state(self) -> SileroState:
        """A fresh stream state, active from now: the next flush waits (up to its window) for its first frame too."""
        state = self.model.new_state()
        self._mark_active(state)
        return state

    def _mark_active(self, state: SileroState) -> None:
        self._last_frame[id(state)] = time.monotonic()

    async def probability(self, state: SileroState, frame: np.ndarray) -> float:
        loop = asyncio.get_running_loop()
        done = loop.create_future()
        if not self._pending:  # a new batch: forget the streams that went quiet
            horizon = time.monotonic() - self.active_s
            self._last_frame = {k: t for k, t in self._last_frame.items() if t >= horizon}
        self._pending.append((state, frame, done))
        self._mark_active(state)
        if len(self._pending) >= len(self._last_frame):  # every active stream is waiting: no one else to wait for
            self._flush()
        elif self._flush_at is None:
            self._flush_at = loop.call_later(self.window_s, self._flush)
        return await done

    def _flush(self) -> None:
        if self._flush_at is not None:
            self._flush_at.cancel()
            self._flush_at = None
        batch, self._pending = self._pending, []
        self.calls += 1
        loop = asyncio.get_running_loop()
        states, frames = [state for state, _, _ in batch], [frame for _, frame, _ in batch]
        ran = vad_thread().submit(lambda: self.model.run(states, np.stack(frames)))
        ran.add_done_callback(lambda f: _hand_back(loop, batch, f))


def _hand_back(loop: asyncio.AbstractEventLoop, batch: list, ran: Future) -> None:
    """On the VAD thread: the batch's results go back to the loop its sessions wait on. A loop already closed has no
    one waiting (its sessions ended with it): there is nothing to deliver."""
    try:
        loop.call_soon_threadsafe(_deliver, batch, ran)
    except RuntimeError:  # asyncio's "Event loop is closed"
        if not loop.is_closed():
            raise
        logger.debug("VAD batch of %d frames finished after its event loop closed", len(batch))


def _deliver(batch: list[tuple[SileroState, np.ndarray, asyncio.Future]], ran: Future) -> None:
    """On the event loop: each frame's probability, or the call's exception, to the session awaiting it."""
    exc = ran.exception()
    if exc is not None:  # delivered to every session that waits on this call
        for _, _, done in batch:
            if not done.done():
                done.set_exception(exc)
        return
    for (_, _, done), prob in zip(batch, ran.result(), strict=True):
        if not done.done():  # its session may have been cancelled meanwhile
            done.set_result(float(prob))


class BatchedSileroStream:
    """One session's VAD on a shared :class:`VadBatcher` (a :class:`BatchedSpeechProbability`)."""

    frame_samples = SileroBatchModel.frame_samples

    def __init__(self, batcher: VadBatcher) -> None:
        self._batcher = batcher
        self._state = batcher.new_state()

    def __call__(self, frame: np.ndarray) -> float:
        """Score one frame now, alone (a batch of one)."""
        return float(self._batcher.model.run([self._state], np.asarray(frame, dtype=np.float32)[None])[0])

    async def probability(self, frame: np.ndarray) -> float:
        return await self._batcher.probability(self._state, np.asarray(frame, dtype=np.float32))

    def reset(self) -> None:
        self._state = self._batcher.new_state()
