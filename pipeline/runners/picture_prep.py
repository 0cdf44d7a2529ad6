"""Picture preprocessing on threads of its own: the engine thread never resizes, normalises or cuts a picture into
patches.

Why: the family's preprocessing (PIL's bicubic resize, the normalisation table, the patch layout) costs 2-8 ms of CPU
per picture or camera frame pair; on the engine thread, 16 users' cameras (16 pairs a second) took that much from
every second of decode steps.

Contract:

- :meth:`PicturePrep.grid` runs on the caller's thread (the engine thread): it checks the frames and returns the patch
  grid their preprocessing will have, or raises the :class:`~pipeline.errors.InvalidImageError` it would raise, without
  doing the work (header arithmetic only). So a bad picture is refused at once, by the command that brought it.
- :meth:`PicturePrep.submit` queues the work on the pool and returns a :class:`~concurrent.futures.Future` of the
  family's ``VisionInput`` (``pixel_values``, ``grid_thw``); it never blocks and never refuses. Its result (or the
  exception the preprocessing raised) is read by whoever queued it, on its own thread.
- The queue is bounded where the input is unbounded: :attr:`PicturePrep.has_room` is False while ``max_pending``
  jobs are queued or running. A caller admits camera frames only while there is room (the engine drops a frame that
  arrives while the pool is full, counted with the frames its video rules drop); pictures, which a client awaits one
  message at a time, and the frame pairs of frames already admitted always queue, so the queue exceeds
  ``max_pending`` by at most those.
- ``on_done()`` is called on a pool thread after each job (the engine loop's wake-up). :meth:`PicturePrep.close`
  cancels the jobs not started and waits for the running ones.

Thread-safe: every method may be called from any thread.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import numpy as np

from pipeline.api import VisionInfo
from pipeline.models.common.vision_patches import check_frames

__all__ = ["PREP_MAX_PENDING", "PREP_THREADS", "PicturePrep"]

log = logging.getLogger(__name__)

PREP_THREADS = 2
"""Pool threads: PIL's resize and numpy's copies release the GIL, so two threads keep up with ~16 camera pairs a
second at a few ms each with room to spare, and leave the other cores to the engine and the server."""

PREP_MAX_PENDING = 64
"""Jobs queued or running before :attr:`PicturePrep.has_room` turns False: four seconds of 16 users' cameras."""


class PicturePrep:
    def __init__(
        self,
        preprocess: Callable[..., Any],
        info: VisionInfo,
        *,
        threads: int = PREP_THREADS,
        max_pending: int = PREP_MAX_PENDING,
    ) -> None:
        """``preprocess``: the family's (:meth:`ModelFamily.vision_preprocessor
        <pipeline.models.family.ModelFamily.vision_preprocessor>`), ``(frames) -> (pixel_values, grid_thw)``, safe on
        any thread; ``info``: the pixel budget and patch sizes it applies (the family's ``vision_info``)."""
        if threads <= 0 or max_pending <= 0:
            raise ValueError(f"picture preprocessing needs threads and room, got {threads} and {max_pending}")
        self.preprocess = preprocess
        """Looked up per job (a test may wrap it)."""
        self.info = info
        self.max_pending = max_pending
        self.on_done: Callable[[], None] | None = None
        """Called on a pool thread after each job (its future is resolved by then)."""
        self._pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="omni-picture-prep")
        self._lock = threading.Lock()
        self._pending = 0

    @property
    def pending(self) -> int:
        """Jobs queued or running."""
        with self._lock:
            return self._pending

    @property
    def has_room(self) -> bool:
        """Whether fewer than ``max_pending`` jobs are queued or running (a camera frame may be admitted)."""
        return self.pending < self.max_pending

    def grid(self, frames: Sequence[np.ndarray]) -> tuple[int, int, int]:
        """The patch grid ``(t, h, w)`` the preprocessing gives ``frames`` (one picture, or video frames in time order):
        ``t`` temporal patches of ``info.temporal_patch_size`` frames. Raises ``InvalidImageError`` as the
        preprocessing would (no frames, not uint8 RGB ``(H, W, 3)``, empty, extreme aspect ratio). Cheap: no pixel is
        read."""
        height, width = check_frames(frames, self.info)
        info = self.info
        return -(-len(frames) // info.temporal_patch_size), height // info.patch_size, width // info.patch_size

    def submit(self, frames: Sequence[np.ndarray]) -> Future:
        """Preprocess ``frames`` on the pool: a future of the family's ``VisionInput`` (or of the exception its
        preprocessing raised). The frames must not change until it is resolved (the engine's never do)."""
        with self._lock:
            self._pending += 1
        future = self._pool.submit(self._run, list(frames))
        future.add_done_callback(self._finished)
        return future

    def close(self) -> None:
        """Cancel the jobs not started, wait for the running ones, stop the threads."""
        self._pool.shutdown(wait=True, cancel_futures=True)

    def _run(self, frames: list[np.ndarray]):
        return self.preprocess(frames)

    def _finished(self, future: Future) -> None:
        with self._lock:
            self._pending -= 1
        if not future.cancelled() and future.exception() is not None:
            log.warning("picture preprocessing failed: %r", future.exception())
        if self.on_done is not None:
            self.on_done()
