"""Picture encodes, queued by the engine's commands and run together at the start of the next engine step.

The same contract as :mod:`pipeline.runners.audio_encodes`: :meth:`ImageEncodes.block` returns an
:class:`~pipeline.core.conversation_state.ImageBlock` at once, its ``embeds`` (and the per-layer ``deepstack``
features of
a tower that makes them, :class:`pipeline.models.family.LayeredVision`) allocated on the device (the token count
follows from the patch grid) and filled by the next :meth:`ImageEncodes.flush`, which the engine runs at the start of
every step, before anything renders or prefills a conversation. A picture whose encode fails keeps the exception in
``ImageBlock.error``; the response that would read it fails with it, the conversation stays usable (delete the item).
The queue holds what the requests since the last step added: it is emptied by every step.
"""

from __future__ import annotations

import logging
from typing import Protocol

import numpy as np
import torch

from pipeline.core.conversation_state import ImageBlock
from pipeline.models.positions import PositionScheme
from pipeline.runners.background_encodes import EncodeNames, EncodeQueue

__all__ = ["ImageEncodes", "ImageEncoder"]

log = logging.getLogger(__name__)

_NAMES = EncodeNames(many="pictures", one="a picture", unit="picture", encoder="vision tower")


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
    ) -> None:
        """``positions``: the family's, which give a picture's offsets from its grid and the tower's ``merge``."""
        self._encoder = encoder
        self._positions = positions
        self._merge = merge
        self._deepstack_layers = getattr(encoder, "image_deepstack_layers", 0)  # an encoder without it makes none
        self._queue: EncodeQueue[tuple[np.ndarray, tuple[int, int, int]], ImageBlock] = EncodeQueue(
            lambda items: encoder.encode_images(items),  # looked up per call: a test may replace it
            _NAMES,
            log=log,
            width=width,
            dtype=dtype,
            device=device,
            fill=self._fill,
        )

    @property
    def pending(self) -> int:
        return self._queue.pending

    def block(self, pixel_values: np.ndarray, grid_thw: tuple[int, int, int]) -> ImageBlock:
        """A block for one picture (the vision preprocessor's output), encoded at the next :meth:`flush`, with the
        family's offsets of its positions (:meth:`pipeline.models.positions.PositionScheme.image_offsets`)."""
        t, h, w = (int(v) for v in grid_thw)
        if t != 1:
            raise ValueError(f"a picture is one temporal patch, got a grid of {t}")
        tokens = self._encoder.image_tokens((t, h, w))
        block = ImageBlock(
            self._queue.empty(tokens),
            offsets=self._positions.image_offsets((t, h, w), merge=self._merge),
            deepstack=tuple(self._queue.empty(tokens) for _ in range(self._deepstack_layers)),
        )
        if block.offsets.shape[1] != tokens:
            raise ValueError(f"a picture of grid {(t, h, w)} has {tokens} tokens, not {block.offsets.shape[1]}")
        return self._queue.add((pixel_values, (t, h, w)), block)

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

    def flush(self) -> int:
        """Encode every queued picture in one call (if that fails, each alone, so only a faulty one fails). Returns
        how many were encoded."""
        return self._queue.flush()
