"""Queued picture encodes: blocks are allocated at once with their TMRoPE offsets and filled by the step's one
batched encode; a failing batch is retried picture by picture; an encoder answer of the wrong shape fails only its
picture, with an error that names both shapes; an encoder's deepstack features are allocated and filled with the
picture's tokens."""

from __future__ import annotations

import logging
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from pipeline.models.common.tmrope import TMROPE
from pipeline.runners.image_encodes import ImageEncodes

MERGE = 2


class FakeVision:
    """Encodes a (1, h, w) grid to (h // 2) * (w // 2) rows of the value h; raises for the heights in ``fail_on``,
    answers one row short for the heights in ``short``."""

    def __init__(self, calls: list, fail_on: set[int] = frozenset(), short: set[int] = frozenset()) -> None:
        self.calls, self.fail_on, self.short = calls, fail_on, short

    def image_tokens(self, grid_thw) -> int:
        t, h, w = grid_thw
        return t * (h // MERGE) * (w // MERGE)

    def encode_images(self, items):
        heights = [grid[1] for _, grid in items]
        self.calls.append(heights)
        if any(h in self.fail_on for h in heights):
            raise RuntimeError("boom")
        return [torch.full((self.image_tokens(grid) - (grid[1] in self.short), 3), float(grid[1])) for _, grid in items]


def encodes(vision: FakeVision) -> ImageEncodes:
    return ImageEncodes(vision, positions=TMROPE, merge=MERGE, width=3, dtype=torch.float32, device=torch.device("cpu"))


def picture(h: int, w: int = 4) -> tuple[np.ndarray, tuple[int, int, int]]:
    return np.zeros((h * w, 8), dtype=np.float32), (1, h, w)


def test_pictures_are_filled_by_one_batched_call_at_flush():
    calls = []
    queue = encodes(FakeVision(calls))
    a, b = queue.block(*picture(4)), queue.block(*picture(6))
    assert a.embeds.shape == (4, 3) and b.embeds.shape == (6, 3) and queue.pending == 2
    assert b.offsets.tolist() == [[0] * 6, [0, 0, 1, 1, 2, 2], [0, 1, 0, 1, 0, 1]]
    assert queue.flush() == 2 and calls == [[4, 6]] and queue.pending == 0
    assert torch.all(a.embeds == 4) and torch.all(b.embeds == 6) and a.error is None and b.error is None
    assert queue.flush() == 0 and calls == [[4, 6]], "nothing queued: no call"


def test_a_failing_picture_keeps_its_error_and_the_others_are_encoded_alone(caplog):
    calls = []
    queue = encodes(FakeVision(calls, fail_on={6}))
    good, bad = queue.block(*picture(4)), queue.block(*picture(6))
    with caplog.at_level(logging.ERROR, logger="pipeline.runners.image_encodes"):
        assert queue.flush() == 2
    assert calls == [[4, 6], [4], [6]]
    assert torch.all(good.embeds == 4) and good.error is None
    assert isinstance(bad.error, RuntimeError) and str(bad.error) == "boom"
    assert "batched encode of 2 pictures failed" in caplog.text and "encoding a picture failed" in caplog.text


def test_an_answer_of_the_wrong_shape_fails_its_picture_only():
    queue = encodes(FakeVision([], short={6}))
    good, bad = queue.block(*picture(4)), queue.block(*picture(6))
    queue.flush()
    assert good.error is None and torch.all(good.embeds == 4)
    assert str(bad.error) == "vision tower gave (5, 3) for a picture of (6, 3)"


def test_a_video_grid_is_refused_before_it_is_queued():
    queue = encodes(FakeVision([]))
    with pytest.raises(ValueError, match="one temporal patch"):
        queue.block(np.zeros((32, 8), dtype=np.float32), (2, 4, 4))
    assert queue.pending == 0


class LayeredVision(FakeVision):
    """:class:`FakeVision` whose encodings also carry two deepstack layers (the value h + 1, h + 2); one layer short
    for the heights in ``one_layer``."""

    image_deepstack_layers = 2

    def __init__(self, calls: list, one_layer: set[int] = frozenset()) -> None:
        super().__init__(calls)
        self.one_layer = one_layer

    def encode_images(self, items):
        tokens = super().encode_images(items)
        out = []
        for t, (_, grid) in zip(tokens, items):
            layers = 1 if grid[1] in self.one_layer else 2
            out.append(SimpleNamespace(tokens=t, deepstack=tuple(t + k for k in range(1, layers + 1))))
        return out


def test_deepstack_features_are_allocated_with_the_block_and_filled_by_the_same_encode():
    calls = []
    queue = encodes(LayeredVision(calls, one_layer={6}))
    good, bad = queue.block(*picture(4)), queue.block(*picture(6))
    assert [f.shape for f in good.deepstack] == [(4, 3), (4, 3)]
    queue.flush()
    assert calls == [[4, 6], [4], [6]], "the batch failed on the bad picture: each again alone"
    assert good.error is None and torch.all(good.embeds == 4)
    assert torch.all(good.deepstack[0] == 5) and torch.all(good.deepstack[1] == 6)
    assert str(bad.error) == "vision tower gave deepstack features for 1 layers, expected 2"


def test_plain_encodings_make_blocks_without_deepstack():
    queue = encodes(FakeVision([]))
    block = queue.block(*picture(4))
    queue.flush()
    assert block.deepstack == () and block.error is None
