"""token2wav on a thread (and CUDA stream) of its own, so decode steps never wait for a DiT chunk.

One token2wav chunk takes ~100-300 ms on a GPU; run inside the engine step it held back every session's next
thinker and talker token for that long. Here the engine thread hands the streams that are ready to the worker
(:meth:`Token2WavWorker.submit`) and goes on decoding; at the start of each later step it collects what the worker
finished (:meth:`Token2WavWorker.poll`) and emits the audio itself, so every event of a response still leaves
from the engine thread, in order.

Contract:
- One job at a time: ``submit`` only while ``idle`` (the engine submits every ready stream at once and the
  synthesizer batches them). While a job runs, its streams must not be stepped, closed or passed to another job
  (the engine keeps them in ``in_flight``); pushing codes and ``finish()`` are safe (codes live on the host and
  the chunk plan is computed from a prefix of them).
- GPU ordering: ``submit`` records an event on the caller's current stream and the worker's stream waits for it,
  so everything the engine thread queued before (the streams' noise, speaker conditioning) is visible.
- Results are ``(streams, chunks or the exception)``; ``close`` stops the thread after the running job.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch

log = logging.getLogger(__name__)

_STOP = object()

URGENT_PRIORITY = -2
"""CUDA stream priority of jobs holding a first chunk (the engine thread's decode stream has -1; torch's default is
0, and out-of-range values are clamped to the device's range)."""


@dataclass
class Token2WavResult:
    streams: list
    chunks: list[np.ndarray] | None
    error: Exception | None = None


class Token2WavWorker:
    def __init__(self, synthesizer, device: torch.device) -> None:
        """Jobs without a first chunk run on a stream of their own of default priority."""
        self.synthesizer = synthesizer
        self.device = torch.device(device)
        cuda = self.device.type == "cuda"
        # (default-priority stream, urgent stream), None on CPU. A job with a first chunk is on someone's
        # time-to-first-audio path: it outranks decode steps
        self._cuda_streams: tuple[torch.cuda.Stream, torch.cuda.Stream] | None = (
            (torch.cuda.Stream(self.device), torch.cuda.Stream(self.device, priority=URGENT_PRIORITY)) if cuda else None
        )
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._results: queue.SimpleQueue = queue.SimpleQueue()
        self.in_flight: set[int] = set()
        """``id()`` of the streams of the running job (engine thread only)."""
        self.on_done: Callable[[], None] | None = None
        """Called on the worker thread after each job's result is queued (the engine thread's wake-up)."""
        self._thread = threading.Thread(target=self._loop, name="omni-token2wav", daemon=True)
        self._thread.start()

    @property
    def idle(self) -> bool:
        return not self.in_flight

    def busy_with(self, stream) -> bool:
        return id(stream) in self.in_flight

    def submit(self, streams: Sequence, *, urgent: bool = False) -> None:
        """Start a job; ``urgent`` runs it on a CUDA stream of higher priority than the engine's decode steps."""
        if not self.idle:
            raise RuntimeError("the token2wav worker runs one job at a time")
        event = None
        if self._cuda_streams is not None:
            event = torch.cuda.Event()
            event.record(torch.cuda.current_stream(self.device))
        self.in_flight = {id(s) for s in streams}
        self._jobs.put((list(streams), event, urgent))

    def poll(self, *, wait: bool = False) -> list[Token2WavResult]:
        """Finished jobs (at most one, as one runs at a time); with ``wait``, block until the running one ends."""
        results = []
        try:
            if wait and self.in_flight:
                results.append(self._results.get())
            while True:
                results.append(self._results.get_nowait())
        except queue.Empty:
            pass
        if results:
            self.in_flight = set()
        return results

    def close(self, timeout: float = 10.0) -> None:
        self._jobs.put(_STOP)
        self._thread.join(timeout)

    def _loop(self) -> None:
        with torch.inference_mode():
            while True:
                job = self._jobs.get()
                if job is _STOP:
                    return
                streams, event, urgent = job
                self._results.put(self._run(streams, event, urgent))
                if self.on_done is not None:
                    self.on_done()

    def _run(self, streams: list, event, urgent: bool) -> Token2WavResult:
        try:
            if self._cuda_streams is None:
                return Token2WavResult(streams, self.synthesizer.step_many(streams))
            cuda_stream = self._cuda_streams[1] if urgent else self._cuda_streams[0]
            with torch.cuda.stream(cuda_stream):
                cuda_stream.wait_event(event)
                return Token2WavResult(streams, self.synthesizer.step_many(streams))
        except Exception as exc:  # noqa: BLE001 - handed to the engine thread, which isolates the faulty stream
            log.warning("token2wav job of %d streams failed: %r", len(streams), exc)
            return Token2WavResult(streams, None, exc)
