"""The thinker's vision tower as the thinker runner drives it: preprocessed pictures in, thinker embeddings out.

The arithmetic is the reference module's own (``thinker.visual``, a Qwen2.5-VL ViT with windowed attention): pixel
values are cast to the tower's dtype and passed with their ``grid_thw`` as the reference model does, so the
embeddings equal the reference's for the same input.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from torch import nn

from pipeline.models.qwen2_5_omni.vision import VisionInput


class Qwen25OmniVisionEncoder:
    """Encodes pictures and video clips (:class:`~.vision.VisionInput`) on the tower's device.

    ``batch``: several items go through the tower in one call (their patches concatenated, one ``grid_thw`` row
    each: attention stays within an item); the default on CUDA. Without it each item is its own call, as when the
    reference sees one picture per prompt (on CPU a bigger matrix product may round differently)."""

    deepstack_layers = 0
    """The tower's outputs are the items' input embeddings only (no features added inside the decoder)."""

    def __init__(self, visual: nn.Module, *, device: torch.device, batch: bool | None = None) -> None:
        self.visual = visual
        self.device = torch.device(device)
        self.merge_size = int(visual.spatial_merge_size)
        self.batch = self.device.type == "cuda" if batch is None else batch

    @property
    def dtype(self) -> torch.dtype:
        return next(self.visual.parameters()).dtype

    def tokens(self, grid_thw: Sequence[int]) -> int:
        """Thinker positions (embeddings) the tower makes of an item of patch grid ``grid_thw``."""
        t, h, w = (int(v) for v in grid_thw)
        return t * h * w // (self.merge_size * self.merge_size)

    @torch.inference_mode()
    def encode_many(self, items: Sequence[VisionInput | tuple[np.ndarray, Sequence[int]]]) -> list[torch.Tensor]:
        """One ``(tokens(grid_thw), thinker hidden)`` tensor per item, in order, in the tower's dtype on its device."""
        if not items:
            return []
        if not self.batch:
            return [self._encode(items[i : i + 1])[0] for i in range(len(items))]
        return self._encode(items)

    def _encode(self, items: Sequence[VisionInput | tuple[np.ndarray, Sequence[int]]]) -> list[torch.Tensor]:
        pixels = torch.cat([torch.as_tensor(np.asarray(values)) for values, _ in items])
        pixels = pixels.to(device=self.device, dtype=self.dtype, non_blocking=True)
        grid = torch.tensor([[int(v) for v in g] for _, g in items], dtype=torch.long, device=self.device)
        merged = self.visual(pixels, grid_thw=grid).pooler_output
        return list(torch.split(merged, [self.tokens(g) for _, g in items]))
