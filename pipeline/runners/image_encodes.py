"""Pictures and camera frame pairs from the engine's commands to vision-tower embeddings, off the engine thread's
critical path.

A block goes through three hands:

1. :meth:`ImageEncodes.picture` (a command, on the engine thread) checks the frames (``InvalidImageError`` at once
   for a bad picture: nothing is queued), allocates the :class:`~pipeline.core.conversation_state.ImageBlock` on the
   device (its ``embeds`` and the per-layer ``deepstack`` features of a tower that makes them,
   :class:`pipeline.models.family.LayeredVision`; the token count follows from the patch grid) with the family's
   offsets of its positions, not :attr:`~pipeline.core.conversation_state.ImageBlock.ready`, and hands the
   preprocessing (resize, normalise, patches) to the :class:`~pipeline.runners.picture_prep.PicturePrep` pool.
2. :meth:`ImageEncodes.flush`, which the engine runs at the start of every step, takes the blocks whose preprocessing
   finished and encodes them together, in one call of the tower (if that fails, each alone, so only a faulty one
   fails): with an :class:`~pipeline.runners.encode_worker.EncodeWorker` (``thinker.vision_worker``, on with CUDA) on
   the worker's thread and CUDA stream, one job at a time (blocks prepared while a job runs wait for the next);
   without one on the engine thread, at once, in its stream's order.
3. A later :meth:`ImageEncodes.flush` collects the worker's finished job: once its CUDA event has completed
   (``query()``, on the host, never waiting) the engine's stream waits for it (free by then) and the job's blocks turn
   ready. Decode steps queued meanwhile never wait for the tower.

The scheduler plans no prefill chunk that reaches a block that is not ready
(:attr:`~pipeline.core.conversation_state.Rendering.ready_until`): that conversation waits a step (a prompt as for a KV
slot) while every other one decodes on, and chunk boundaries do not depend on when an encode finishes. A block whose
preprocessing or encode fails keeps the exception in ``ImageBlock.error`` (set by the engine thread when it turns
ready); the response that would read it fails with it, the conversation stays usable (delete the item).

Memory across streams: a block's tensors are allocated on the engine's stream and written on the worker's; the
worker's stream first waits for the engine's work queued before the submit, and the job holds the blocks until the
engine has collected it after its event completed, so no tensor it writes is freed or reused while it writes.
Engine thread only (the pool's and the worker's threads run only what this class hands them).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from concurrent.futures import Future
from typing import Protocol

import numpy as np
import torch

from pipeline.core.conversation_state import ImageBlock
from pipeline.models.positions import PositionScheme
from pipeline.runners.background_encodes import EncodeNames, EncodeQueue
from pipeline.runners.encode_worker import EncodeResult, EncodeWorker
from pipeline.runners.picture_prep import PicturePrep

__all__ = ["ImageEncodes", "ImageEncoder"]

log = logging.getLogger(__name__)

_NAMES = EncodeNames(many="pictures", one="a picture", unit="picture", encoder="vision tower")

Grid = tuple[int, int, int]
Pixels = np.ndarray | Future
"""A block's tower input: prepared pixel values, or a future of the family's ``VisionInput`` (the pool's)."""


class ImageEncoder(Protocol):
    """What encodes (the thinker's runner)."""

    def encode_images(self, items: list) -> list:
        """``(pixel_values, grid_thw)`` items -> their encodings, in one call: each a (tokens, width) tensor, or an
        object with ``tokens`` (tokens, width) and ``deepstack`` (:attr:`image_deepstack_layers` tensors of that
        shape)."""
        ...

    def image_tokens(self, grid_thw) -> int: ...

    image_deepstack_layers: int
    """Per-layer feature tensors each picture's encoding carries beside its tokens (0: plain tensors)."""


class ImageEncodes:
    def __init__(
        self,
        encoder: ImageEncoder,
        *,
        positions: PositionScheme,
        merge: int,
        width: int,
        dtype: torch.dtype,
        device: torch.device,
        prep: PicturePrep | None = None,
        worker: bool = False,
    ) -> None:
        """``positions``: the family's, which give a picture's offsets from its grid and the tower's ``merge``;
        ``prep``: the family's preprocessing on its pool (None: only :meth:`block` with prepared pixel values);
        ``worker``: encode on an :class:`~pipeline.runners.encode_worker.EncodeWorker` (else inline in
        :meth:`flush`)."""
        self._encoder = encoder
        self._positions = positions
        self._merge = merge
        self._deepstack_layers = getattr(encoder, "image_deepstack_layers", 0)  # an encoder without it makes none
        self._queue: EncodeQueue[tuple[np.ndarray, Grid], ImageBlock] = EncodeQueue(
            lambda items: encoder.encode_images(items),  # looked up per call: a test may replace it
            _NAMES,
            log=log,
            width=width,
            dtype=dtype,
            device=device,
            fill=self._fill,
        )
        self.prep = prep
        self.worker = EncodeWorker(self._queue.encode, device, name="omni-vision") if worker else None
        self._waiting: list[tuple[Pixels, Grid, ImageBlock]] = []
        """Blocks queued, in order, whose encode has not started (their preprocessing may still run)."""
        self._running = 0
        """Blocks in the worker's job, until it is polled."""
        self._collected: list[EncodeResult] = []
        """Polled worker jobs whose CUDA event has not completed yet (the worker waits for it before handing a job
        back, so only a failing device keeps one here)."""

    @property
    def pending(self) -> int:
        """Blocks queued and not ready yet (preprocessing, waiting for an encode, or being encoded)."""
        return len(self._waiting) + self._running + sum(len(result.items) for result in self._collected)

    @property
    def has_room(self) -> bool:
        """Whether the preprocessing pool admits more camera frames (:attr:`PicturePrep.has_room`)."""
        return self.prep is None or self.prep.has_room

    def check(self, frames: Sequence[np.ndarray]) -> Grid:
        """The patch grid of ``frames`` (one picture, or one frame pair); ``InvalidImageError`` for a bad picture
        (:meth:`PicturePrep.grid`)."""
        if self.prep is None:
            raise RuntimeError("these image encodes take prepared pixel values only (no preprocessing pool)")
        return self.prep.grid(frames)

    def picture(self, frames: Sequence[np.ndarray]) -> ImageBlock:
        """A block for ``frames`` (one picture, or one camera frame pair), checked here (:meth:`check`), preprocessed
        on the pool and encoded at a later :meth:`flush`."""
        grid = self.check(frames)
        assert self.prep is not None, "check() needs the pool"
        if grid[0] != 1:  # refused before any work is queued
            raise ValueError(f"a picture is one temporal patch, got a grid of {grid[0]}")
        return self.block(self.prep.submit(frames), grid)

    def block(self, pixels: Pixels, grid_thw: Sequence[int]) -> ImageBlock:
        """A block for one picture, encoded at a later :meth:`flush`, with the family's offsets of its positions
        (:meth:`pipeline.models.positions.PositionScheme.image_offsets`): ``pixels`` are the preprocessor's
        ``pixel_values``, or a future of its ``VisionInput``, whose grid must then be ``grid_thw``."""
        t, h, w = (int(v) for v in grid_thw)
        if t != 1:
            raise ValueError(f"a picture is one temporal patch, got a grid of {t}")
        tokens = self._encoder.image_tokens((t, h, w))
        block = ImageBlock(
            self._queue.empty(tokens),
            offsets=self._positions.image_offsets((t, h, w), merge=self._merge),
            deepstack=tuple(self._queue.empty(tokens) for _ in range(self._deepstack_layers)),
            ready=False,
        )
        if block.offsets.shape[1] != tokens:
            raise ValueError(f"a picture of grid {(t, h, w)} has {tokens} tokens, not {block.offsets.shape[1]}")
        self._waiting.append((pixels, (t, h, w), block))
        return block

    def flush(self) -> int:
        """Collect the worker's finished job, then encode the blocks whose preprocessing finished (see the module
        docstring). Returns how many blocks turned ready."""
        ready = self._collect()
        if self.worker is not None and (not self.worker.idle or self._collected):
            return ready  # one job at a time, from its submit until its blocks are ready
        waiting = len(self._waiting)
        prepared = self._take_prepared()
        ready += waiting - len(self._waiting) - len(prepared)  # failed preprocessing
        if not prepared:
            return ready
        if self.worker is not None:
            self.worker.submit(prepared)
            self._running = len(prepared)
            return ready
        self._finish(prepared, self._queue.encode(prepared))
        return ready + len(prepared)

    def close(self) -> None:
        """Stop the preprocessing pool and the worker (after their running jobs)."""
        if self.prep is not None:
            self.prep.close()
        if self.worker is not None:
            self.worker.close()

    # -- inside ---------------------------------------------------------------------------------------
    def _take_prepared(self) -> list[tuple[tuple[np.ndarray, Grid], ImageBlock]]:
        """The waiting blocks whose pixel values are there, in order, as the queue's ``((pixels, grid), block)``; a
        block whose preprocessing failed, or gave another grid, turns ready with the error."""
        prepared: list[tuple[tuple[np.ndarray, Grid], ImageBlock]] = []
        still: list[tuple[Pixels, Grid, ImageBlock]] = []
        for pixels, grid, block in self._waiting:
            if isinstance(pixels, Future):
                if not pixels.done():
                    still.append((pixels, grid, block))
                    continue
                try:
                    values, got = pixels.result()
                    if tuple(int(v) for v in got) != grid:
                        raise RuntimeError(f"picture preprocessing gave a grid of {tuple(got)}, expected {grid}")
                except Exception as exc:  # noqa: BLE001 - kept on the block: its response fails with it
                    block.error, block.ready = exc, True
                    continue
                pixels = values
            prepared.append(((pixels, grid), block))
        self._waiting = still
        return prepared

    def _collect(self) -> int:
        """Blocks of finished worker jobs whose CUDA event has completed turn ready (errors recorded), after the
        engine's stream waits for the event (free: it completed). Returns how many."""
        if self.worker is None:
            return 0
        if (result := self.worker.poll()) is not None:
            self._collected.append(result)
            self._running = 0
        ready, still = 0, []
        for result in self._collected:
            if result.done is not None:
                if not result.done.query():
                    still.append(result)
                    continue
                torch.cuda.current_stream(self.worker.device).wait_event(result.done)
            if result.error is not None:  # the whole job failed (its stream or event): each of its blocks fails
                failures = [(block, result.error) for _, block in result.items]
            else:
                failures = result.value
            self._finish(result.items, failures)
            ready += len(result.items)
        self._collected = still
        return ready

    @staticmethod
    def _finish(items: Sequence[tuple[object, ImageBlock]], failures: list[tuple[ImageBlock, Exception]]) -> None:
        for block, exc in failures:
            block.error = exc
        for _, block in items:
            block.ready = True

    def _fill(self, block: ImageBlock, out) -> None:
        """Copy one encoding (a tensor, or tokens with deepstack features) into its block, every shape checked."""
        tokens, deepstack = (out, ()) if isinstance(out, torch.Tensor) else (out.tokens, tuple(out.deepstack))
        if len(deepstack) != len(block.deepstack):
            raise RuntimeError(
                f"{_NAMES.encoder} gave deepstack features for {len(deepstack)} layers, expected {len(block.deepstack)}"
            )
        self._queue.copy_checked(block.embeds, tokens)
        for target, feature in zip(block.deepstack, deepstack):
            self._queue.copy_checked(target, feature)
