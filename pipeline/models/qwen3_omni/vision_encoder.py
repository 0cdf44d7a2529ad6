"""Qwen3-Omni's vision tower as the thinker runner drives it: preprocessed pictures in, thinker embeddings and deepstack
features out.

The arithmetic is the reference module's own (``thinker.model.visual``, transformers' ``Qwen3OmniMoeVisionEncoder``:
learned position embeddings interpolated to each item's grid, 2-D rotary attention within an item, a patch merger at
the end and one more merger after each of its ``deepstack_visual_indexes`` blocks): pixel values are cast to the
tower's dtype and passed with their ``grid_thw`` as the reference model does, so the outputs equal the reference's.

How the thinker uses them (``Qwen3OmniMoeThinkerModel.forward``): :attr:`VisionFeatures.tokens` are the input
embeddings at the item's image (or video) placeholder positions; ``deepstack[k]`` is added to the hidden states that
decoder layer ``k`` outputs, at the same positions, for ``k`` in ``range(len(deepstack))``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from pipeline.models.common.vision_patches import VisionInput

VisionItem = VisionInput | tuple[np.ndarray, Sequence[int]]
"""One picture or clip as :class:`~pipeline.models.qwen3_omni.vision.Qwen3OmniVisionPreprocessor` makes it:
``(pixel_values, grid_thw)``."""


@dataclass(frozen=True)
class VisionFeatures:
    """What the tower makes of one picture or clip of ``n`` = :meth:`Qwen3OmniVisionEncoder.tokens` thinker
    positions."""

    tokens: torch.Tensor
    """``(n, thinker hidden)``: the input embeddings of the item's placeholder positions, in order."""
    deepstack: tuple[torch.Tensor, ...]
    """One ``(n, thinker hidden)`` tensor per deepstack layer, in ``deepstack_visual_indexes`` order: the ``k``-th is
    added to decoder layer ``k``'s output at the item's positions."""


class Qwen3OmniVisionEncoder:
    """Encodes pictures and video clips on the tower's device (call it on the thread that owns the tower).

    ``batch``: several items go through the tower in one call (their patches concatenated, one ``grid_thw`` row each:
    attention stays within an item); the default on CUDA. Without it each item is its own call, as when the reference
    sees one picture per prompt (on CPU a bigger matrix product may round differently)."""

    def __init__(self, visual: nn.Module, *, device: torch.device, batch: bool | None = None) -> None:
        self.visual = visual
        self.device = torch.device(device)
        self.merge_size = int(visual.spatial_merge_size)
        self.deepstack_layers = len(visual.config.deepstack_visual_indexes)
        self.batch = self.device.type == "cuda" if batch is None else batch

    @property
    def dtype(self) -> torch.dtype:
        return next(self.visual.parameters()).dtype

    def tokens(self, grid_thw: Sequence[int]) -> int:
        """Thinker positions (embeddings) the tower makes of an item of patch grid ``grid_thw``."""
        t, h, w = (int(v) for v in grid_thw)
        return t * h * w // (self.merge_size * self.merge_size)

    @torch.inference_mode()
    def encode_many(self, items: Sequence[VisionItem]) -> list[VisionFeatures]:
        """One :class:`VisionFeatures` per item, in order, in the tower's dtype on its device."""
        if not items:
            return []
        if not self.batch:
            return [self._encode(items[i : i + 1])[0] for i in range(len(items))]
        return self._encode(items)

    def _encode(self, items: Sequence[VisionItem]) -> list[VisionFeatures]:
        pixels = torch.cat([torch.as_tensor(np.asarray(values)) for values, _ in items])
        pixels = pixels.to(device=self.device, dtype=self.dtype, non_blocking=True)
        grid = torch.tensor([[int(v) for v in g] for _, g in items], dtype=torch.long, device=self.device)
        out = self.visual(pixels, grid_thw=grid)
        sizes = [self.tokens(g) for _, g in items]
        tokens = torch.split(out.pooler_output, sizes)
        deepstack = [torch.split(feature, sizes) for feature in out.deepstack_features]
        return [
            VisionFeatures(tokens=tokens[i], deepstack=tuple(layer[i] for layer in deepstack))
            for i in range(len(items))
        ]
