"""Encodes on a thread and CUDA stream of their own, so decode steps never wait for the vision tower.

Why a thread and not only a stream: transformers' vision towers read device values on the host while they run (the
patch grids' ``tolist()``, and with SDPA every layer's sequence lengths), and each read waits for the stream's work so
far. Queued from the engine thread on a side stream, the tower would still hold the engine thread for most of its
device time; here only this thread waits.

Contract (the engine thread's :class:`~pipeline.runners.image_encodes.ImageEncodes` is the only caller):

- One job at a time: :meth:`EncodeWorker.submit` only while :attr:`EncodeWorker.idle`; the job is ``encode(items)``,
  which returns whatever the caller wants back (the failures). The job keeps its items, so every tensor it writes,
  until its result is polled.
- GPU ordering: ``submit`` records an event on the caller's current stream and the worker's stream waits for it before
  the job, so everything queued before the submit (the blocks' tensors allocated there, whose memory earlier work on
  that stream may still use) is done first. After the job the worker records ``done`` on its stream and waits for it
  on its own thread, so a polled result's work is complete on the device; the caller still checks
  ``done.query()`` and makes its stream wait for ``done`` (free once complete) before reading what the job wrote.
  The two events are made once and reused: one job runs at a time, and a job is polled only after ``done``.
- The worker's stream has torch's default priority, the lowest: the engine's decode stream and token2wav's urgent
  stream go first when both have work.
- On the CPU the same thread runs the job with no stream and no events.
- ``on_done()`` is called on the worker thread after each job. :meth:`EncodeWorker.close` stops the thread after the
  running job.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

__all__ = ["EncodeResult", "EncodeWorker"]

log = logging.getLogger(__name__)

_STOP = object()


@dataclass
class EncodeResult:
    """A finished job: its ``items``, what ``encode`` returned (None if it raised: ``error``), and ``done``, the CUDA
    event recorded after its work (None on the CPU)."""

    items: list
    value: Any
    error: Exception | None
    done: torch.cuda.Event | None


class EncodeWorker:
    def __init__(self, encode: Callable[[list], Any], device: torch.device, *, name: str = "omni-encode") -> None:
        """``encode(items)``: the job, run on the worker thread under ``torch.inference_mode`` and, on CUDA, with the
        worker's stream current."""
        self._encode = encode
        self.device = torch.device(device)
        cuda = self.device.type == "cuda"
        self.stream: torch.cuda.Stream | None = torch.cuda.Stream(self.device) if cuda else None
        """The worker's CUDA stream (None on the CPU)."""
        self._submitted = torch.cuda.Event() if cuda else None
        # blocking: the worker's wait for its job sleeps instead of spinning a core the engine and the server need
        self._done = torch.cuda.Event(blocking=True) if cuda else None
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._results: queue.SimpleQueue = queue.SimpleQueue()
        self._busy = False
        self.on_done: Callable[[], None] | None = None
        """Called on the worker thread after each job's result is queued (the engine thread's wake-up)."""
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self._thread.start()

    @property
    def idle(self) -> bool:
        """No job submitted and not yet polled (caller's thread)."""
        return not self._busy

    def submit(self, items: list) -> None:
        """Start a job on ``items`` (caller's thread); RuntimeError unless :attr:`idle`."""
        if self._busy:
            raise RuntimeError("the encode worker runs one job at a time")
        if self._submitted is not None:
            self._submitted.record(torch.cuda.current_stream(self.device))
        self._busy = True
        self._jobs.put(list(items))

    def poll(self, *, wait: bool = False) -> EncodeResult | None:
        """The finished job (None while it runs or when none was submitted); with ``wait``, block until it ends."""
        if not self._busy:
            return None
        try:
            result = self._results.get() if wait else self._results.get_nowait()
        except queue.Empty:
            return None
        self._busy = False
        return result

    def close(self, timeout: float = 10.0) -> None:
        """Stop the thread after the running job (its result is dropped)."""
        self._jobs.put(_STOP)
        self._thread.join(timeout)

    def _loop(self) -> None:
        with torch.inference_mode():
            while True:
                job = self._jobs.get()
                if job is _STOP:
                    return
                try:
                    result = self._run(job)
                except Exception as exc:  # noqa: BLE001 - a failing stream or event: the job's items fail with it
                    log.warning("encode job of %d items failed on its stream: %r", len(job), exc)
                    result = EncodeResult(job, None, exc, None)
                self._results.put(result)
                if self.on_done is not None:
                    self.on_done()

    def _run(self, items: list) -> EncodeResult:
        if self.stream is None:
            return EncodeResult(items, *self._call(items), None)
        assert self._submitted is not None and self._done is not None, "made with the stream"
        with torch.cuda.stream(self.stream):
            self.stream.wait_event(self._submitted)
            value, error = self._call(items)
            self._done.record(self.stream)
        self._done.synchronize()  # this thread waits, not the engine's
        return EncodeResult(items, value, error, self._done)

    def _call(self, items: list) -> tuple[Any, Exception | None]:
        try:
            return self._encode(items), None
        except Exception as exc:  # noqa: BLE001 - handed to the engine thread with the job's items
            log.warning("encode job of %d items failed: %r", len(items), exc)
            return None, exc
