"""The vision tower as the thinker runner drives it (pipeline/models/qwen2_5_omni/vision_encoder.py): the reference
module's outputs, one item or several, and the tiny tower's windowed attention."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from transformers.vision_utils import get_vision_window_index

from pipeline.models import family_of
from pipeline.models.common.hf_parts import thinker_vision_tower
from pipeline.models.qwen2_5_omni.checkpoint import load_checkpoint
from pipeline.models.qwen2_5_omni.tiny import Qwen25OmniRandomModelSpec, build_config
from pipeline.models.qwen2_5_omni.vision_encoder import Qwen25OmniVisionEncoder

FAMILY = family_of("qwen2_5_omni")


@pytest.fixture(scope="module")
def ckpt(tiny_model_dir):
    return load_checkpoint(tiny_model_dir)


@pytest.fixture(scope="module")
def items(ckpt):
    rng = np.random.default_rng(0)
    pictures = [rng.integers(0, 256, shape, dtype=np.uint8) for shape in ((112, 112, 3), (90, 200, 3), (60, 60, 3))]
    clip = [rng.integers(0, 256, (100, 130, 3), dtype=np.uint8) for _ in range(4)]
    return [ckpt.vision([p]) for p in pictures] + [ckpt.vision(clip)]


def _hf(ckpt, batch):
    """The reference model's own call (``get_image_features``: all items in one tower call)."""
    pixels = torch.cat([torch.as_tensor(p) for p, _ in batch])
    grid = torch.tensor([list(g) for _, g in batch])
    with torch.inference_mode():
        return list(ckpt.thinker.get_image_features(pixels, image_grid_thw=grid).pooler_output)


def test_the_family_exposes_the_tower_and_its_settings(ckpt, tiny_model_dir):
    parts = FAMILY.thinker_parts(ckpt, device=torch.device("cpu"), cuda_graphs=False)
    assert isinstance(parts.vision, Qwen25OmniVisionEncoder)
    assert parts.vision.visual is thinker_vision_tower(ckpt.thinker)
    info = FAMILY.vision_info(ckpt)
    spec = Qwen25OmniRandomModelSpec.tiny()
    assert (info.min_pixels, info.max_pixels) == (spec.image_min_pixels, spec.image_max_pixels)
    assert info.fps == 2.0 and FAMILY.vision_preprocessor(ckpt) is ckpt.vision
    blind = dataclasses.replace(ckpt, vision=None)
    assert FAMILY.vision_info(blind) is None and FAMILY.vision_preprocessor(blind) is None
    assert FAMILY.thinker_parts(blind, device=torch.device("cpu"), cuda_graphs=False).vision is None


def test_one_item_equals_the_reference_exactly(ckpt, items):
    encoder = Qwen25OmniVisionEncoder(thinker_vision_tower(ckpt.thinker), device=torch.device("cpu"))
    for item in items:
        (got,) = encoder.encode_many([item])
        (want,) = _hf(ckpt, [item])
        assert got.shape == (encoder.tokens(item.grid_thw), ckpt.thinker_hidden_size)
        assert torch.equal(got, want)


def test_several_items_in_one_call_equal_the_reference_call(ckpt, items):
    batched = Qwen25OmniVisionEncoder(thinker_vision_tower(ckpt.thinker), device=torch.device("cpu"), batch=True)
    single = Qwen25OmniVisionEncoder(thinker_vision_tower(ckpt.thinker), device=torch.device("cpu"), batch=False)
    assert not single.batch and not Qwen25OmniVisionEncoder(batched.visual, device=torch.device("cpu")).batch
    got, want = batched.encode_many(items), _hf(ckpt, items)
    assert [g.shape[0] for g in got] == [batched.tokens(i.grid_thw) for i in items]
    for g, w in zip(got, want, strict=True):
        assert torch.equal(g, w)
    # attention stays within an item: one by one gives the same values, up to the rounding of bigger products
    for g, s in zip(got, single.encode_many(items), strict=True):
        torch.testing.assert_close(g, s, rtol=1e-5, atol=1e-5)
    assert batched.encode_many([]) == []


def test_the_tiny_tower_runs_windowed_attention_on_a_test_picture(ckpt, items):
    vision = ckpt.config.thinker_config.vision_config
    assert vision.depth >= 3 and set(vision.fullatt_block_indexes) < set(range(vision.depth))
    grid = torch.tensor([list(items[0].grid_thw)])
    index, cu_windows = get_vision_window_index(
        grid, spatial_merge_size=vision.spatial_merge_size, window_size=vision.window_size, patch_size=14
    )
    assert not torch.equal(index, torch.arange(index.numel()))
    assert len(cu_windows) - 1 > 1  # several windows, so the windowed layers see less than the whole picture


def test_the_7b_preset_tower_has_the_released_sizes():
    vision = build_config(Qwen25OmniRandomModelSpec.qwen2_5_omni_7b()).thinker_config.vision_config
    released = {
        "hidden_size": 1280,
        "num_heads": 16,
        "intermediate_size": 3420,
        "depth": 32,
        "out_hidden_size": 3584,
        "fullatt_block_indexes": [7, 15, 23, 31],
        "window_size": 112,
        "patch_size": 14,
        "spatial_merge_size": 2,
        "temporal_patch_size": 2,
    }
    assert {k: (list(v) if isinstance(v, tuple) else v) for k in released for v in [getattr(vision, k)]} == released


def test_the_vision_towers_shape_leaves_the_other_random_weights_alone():
    from pipeline.models.qwen2_5_omni.tiny import build_model

    spec = Qwen25OmniRandomModelSpec.tiny()
    other = dataclasses.replace(spec, vision_depth=2, vision_fullatt_blocks=(0,), vision_window_size=112)
    a, b = build_model(spec, build_config(spec)), build_model(other, build_config(other))
    assert len(a.thinker.model.visual.blocks) == 3 and len(b.thinker.model.visual.blocks) == 2
    for part in ("talker", "token2wav"):
        assert all(torch.equal(x, y) for x, y in zip(*(getattr(m, part).state_dict().values() for m in (a, b))))
    rest = [{k: v for k, v in m.thinker.state_dict().items() if "visual" not in k} for m in (a, b)]
    assert rest[0].keys() == rest[1].keys() and all(torch.equal(rest[0][k], rest[1][k]) for k in rest[0])
