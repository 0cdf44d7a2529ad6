"""Picture encodes, queued by the engine's commands and run together at the start of the next engine step.

The same contract as :mod:`pipeline.runners.audio_encodes`: :meth:`ImageEncodes.block` returns an
:class:`~pipeline.conversation_state.ImageBlock` at once, its ``embeds`` allocated on the device (the token count
follows from the patch grid) and filled by the next :meth:`ImageEncodes.flush`, which the engine runs at the start of
every step, before anything renders or prefills a conversation. A picture whose encode fails keeps the exception in
``ImageBlock.error``; the response that would read it fails with it, the conversation stays usable (delete the item).
The queue holds what the requests since the last step added: it is emptied by every step.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import torch

from pipeline.conversation_state import ImageBlock
from pipeline.models.qwen2_5_omni.positions import vision_offsets

__all__ = ["ImageEncodes", "ImageEncoder"]

log = logging.getLogger(__name__)


class ImageEncoder(Protocol):
    """What encodes (the thinker's runner)."""

    def encode_images(self, items: list) -> list[torch.Tensor]:
        """``(pixel_values, grid_thw)`` items -> their encodings (tokens, width), in one call."""
        ...

    def image_tokens(self, grid_thw) -> int: ...


@dataclass
class _Encode:
    item: tuple[np.ndarray, tuple[int, int, int]]
    block: ImageBlock


class ImageEncodes:
    def __init__(
        self, encoder: ImageEncoder, *, merge: int, width: int, dtype: torch.dtype, device: torch.device
    ) -> None:
        self._encoder = encoder
        self._merge = merge
        self._width, self._dtype, self._device = width, dtype, torch.device(device)
        self._queue: list[_Encode] = []

    @property
    def pending(self) -> int:
        return len(self._queue)

    def block(self, pixel_values: np.ndarray, grid_thw: tuple[int, int, int]) -> ImageBlock:
        """A block for one picture (the vision preprocessor's output), encoded at the next :meth:`flush`. Its TMRoPE
        offsets: one temporal patch per picture at time 0, one row/column per merged patch."""
        t, h, w = (int(v) for v in grid_thw)
        if t != 1:
            raise ValueError(f"a picture is one temporal patch, got a grid of {t}")
        tokens = self._encoder.image_tokens((t, h, w))
        embeds = torch.empty(tokens, self._width, dtype=self._dtype, device=self._device)
        block = ImageBlock(embeds, offsets=vision_offsets(t, h, w, merge=self._merge, t_step=0))
        if block.offsets.shape[1] != tokens:
            raise ValueError(f"a picture of grid {(t, h, w)} has {tokens} tokens, not {block.offsets.shape[1]}")
        self._queue.append(_Encode((pixel_values, (t, h, w)), block))
        return block

    def flush(self) -> int:
        """Encode every queued picture in one call (if that fails, each alone, so only a faulty one fails). Returns
        how many were encoded."""
        queued, self._queue = self._queue, []
        if not queued:
            return 0
        try:
            self._fill(queued, self._encoder.encode_images([q.item for q in queued]))
        except Exception:  # noqa: BLE001 - find the faulty picture by encoding one by one
            log.exception("batched encode of %d pictures failed; encoding each alone", len(queued))
            for q in queued:
                try:
                    self._fill([q], self._encoder.encode_images([q.item]))
                except Exception as exc:  # noqa: BLE001 - kept on the block: its response fails with it
                    log.exception("encoding a picture failed")
                    q.block.error = exc
        return len(queued)

    @staticmethod
    def _fill(queued: list[_Encode], outputs: list[torch.Tensor]) -> None:
        for q, out in zip(queued, outputs, strict=True):
            if out.shape != q.block.embeds.shape:
                want = tuple(q.block.embeds.shape)
                raise RuntimeError(f"vision tower gave {tuple(out.shape)} for a picture of {want}")
            q.block.embeds.copy_(out)
