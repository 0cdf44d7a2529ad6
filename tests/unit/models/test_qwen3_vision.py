"""Qwen3-Omni pictures and video (pipeline/models/qwen3_omni/vision.py, vision_encoder.py) against transformers.

Preprocessing: pictures against the reference image processor's PIL path (bit-identical: our resize is PIL's bicubic
filter too); video against a hand-built reference of the processor's algorithm (each frame resized, rescaled and
normalised by transformers' own functions, the frames padded to a pair and cut into patches by one reshape): without
torchvision there is no reference video processor here. Encoding: a tiny random ``Qwen3OmniMoeVisionEncoder`` (built
here, fp32) run on each item alone is the reference for merged tokens and every deepstack feature.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from transformers.image_transforms import normalize, rescale, resize
from transformers.image_utils import PILImageResampling
from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil, smart_resize
from transformers.models.qwen3_omni_moe.configuration_qwen3_omni_moe import Qwen3OmniMoeVisionEncoderConfig
from transformers.models.qwen3_omni_moe.modeling_qwen3_omni_moe import Qwen3OmniMoeVisionEncoder

from pipeline.api import VisionInfo
from pipeline.errors import CheckpointError, InvalidImageError
from pipeline.models.qwen3_omni.vision import VIDEO_FPS, VIDEO_MAX_PIXELS, VIDEO_MIN_PIXELS, Qwen3OmniVisionPreprocessor
from pipeline.models.qwen3_omni.vision_encoder import Qwen3OmniVisionEncoder, VisionFeatures

RELEASED_PREPROCESSOR = {
    "feature_extractor_type": "WhisperFeatureExtractor",
    "feature_size": 128,
    "hop_length": 160,
    "n_fft": 400,
    "n_samples": 4800000,
    "nb_max_frames": 30000,
    "sampling_rate": 16000,
    "image_processor_type": "Qwen2VLImageProcessor",
    "image_mean": [0.5, 0.5, 0.5],
    "image_std": [0.5, 0.5, 0.5],
    "patch_size": 16,
    "temporal_patch_size": 2,
    "merge_size": 2,
    "min_pixels": 3136,
    "max_pixels": 12845056,
    "processor_class": "Qwen3OmniMoeProcessor",
}
"""The image processor fields of Qwen/Qwen3-Omni-30B-A3B-Instruct's ``preprocessor_config.json`` (with the Whisper
fields beside them, as released)."""

TINY_BUDGET = {"min_pixels": 4 * 32 * 32, "max_pixels": 16 * 32 * 32}
"""At least 4, at most 16 thinker positions per picture (patch 16, merge 2)."""


def _image(height: int, width: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (height, width, 3), dtype=np.uint8)


def _tiny_tower_config() -> Qwen3OmniMoeVisionEncoderConfig:
    return Qwen3OmniMoeVisionEncoderConfig(
        depth=3,
        hidden_size=32,
        intermediate_size=64,
        num_heads=2,
        out_hidden_size=64,
        num_position_embeddings=64,  # an 8 x 8 learned grid, interpolated to each item's grid
        deepstack_visual_indexes=[0, 2],
        initializer_range=0.2,  # weights large enough that every layer changes the outputs visibly
    )


@pytest.fixture(scope="module")
def preprocessor() -> Qwen3OmniVisionPreprocessor:
    pre = Qwen3OmniVisionPreprocessor.from_preprocessor_config(
        {**RELEASED_PREPROCESSOR, **TINY_BUDGET}, _tiny_tower_config()
    )
    assert pre is not None
    return pre


@pytest.fixture(scope="module")
def tower() -> Qwen3OmniMoeVisionEncoder:
    torch.manual_seed(0)
    config = _tiny_tower_config()
    config._attn_implementation = "sdpa"
    return Qwen3OmniMoeVisionEncoder(config).eval()


@pytest.fixture(scope="module")
def items(preprocessor):
    """Two pictures of different grids and a clip of three frames."""
    clip = [_image(100, 130, seed=10 + i) for i in range(3)]
    return [preprocessor([_image(64, 64, seed=1)]), preprocessor([_image(90, 200, seed=2)]), preprocessor(clip)]


def _hf(tower, pixels, grid_thw):
    with torch.inference_mode():
        out = tower(torch.as_tensor(pixels), grid_thw=torch.tensor([list(grid_thw)]))
    return out.pooler_output, out.deepstack_features


def test_the_released_settings(preprocessor):
    pre = Qwen3OmniVisionPreprocessor.from_preprocessor_config(RELEASED_PREPROCESSOR, Qwen3OmniMoeVisionEncoderConfig())
    assert pre.info == VisionInfo(
        fps=VIDEO_FPS, min_pixels=3136, max_pixels=12845056, patch_size=16, merge_size=2, temporal_patch_size=2
    )
    assert pre.image_mean == (0.5, 0.5, 0.5) and pre.image_std == (0.5, 0.5, 0.5) and pre.rescale_factor == 1 / 255
    assert pre.video_info == VisionInfo(VIDEO_FPS, VIDEO_MIN_PIXELS, VIDEO_MAX_PIXELS, 16, 2, 2)
    # the reference processor's per-frame video budget: 128 .. 768 thinker positions per frame pair
    video = pre.video_info
    assert video.tokens(480, 640, 2) == 300 and video.tokens(2000, 2000, 2) <= 768
    assert video.tokens(10, 10, 2) >= 128 and pre.info.tokens(10, 10, 2) == 4
    whisper_only = {k: v for k, v in RELEASED_PREPROCESSOR.items() if k.startswith(("feature", "n_", "sampling"))}
    assert Qwen3OmniVisionPreprocessor.from_preprocessor_config(whisper_only, Qwen3OmniMoeVisionEncoderConfig()) is None


@pytest.mark.parametrize(
    "broken, param",
    [
        ({"patch_size": 14}, "patch_size"),
        ({"temporal_patch_size": 1}, "temporal_patch_size"),
        ({"merge_size": None}, "merge_size"),
        ({"image_mean": [0.5, 0.5]}, "image_mean"),
        ({"min_pixels": 20_000_000}, "min_pixels"),
    ],
)
def test_a_config_that_does_not_fit_the_tower_is_a_checkpoint_error(broken, param):
    with pytest.raises(CheckpointError) as caught:
        Qwen3OmniVisionPreprocessor.from_preprocessor_config({**RELEASED_PREPROCESSOR, **broken}, _tiny_tower_config())
    assert caught.value.param == param


def test_the_resize_rule_is_the_reference_smart_resize(preprocessor):
    for info in (preprocessor.info, preprocessor.video_info):
        for height, width in ((1, 1), (17, 33), (64, 64), (90, 200), (480, 640), (720, 1280), (1080, 1920), (31, 4)):
            want = smart_resize(height, width, factor=32, min_pixels=info.min_pixels, max_pixels=info.max_pixels)
            assert info.resized(height, width) == want, (info, height, width)


@pytest.mark.parametrize("shape", [(32, 32), (64, 64), (90, 200), (200, 90), (17, 333), (480, 640), (7, 9)])
def test_a_picture_equals_the_reference_image_processor_exactly(preprocessor, shape):
    hf = Qwen2VLImageProcessorPil(
        **{
            k: RELEASED_PREPROCESSOR[k]
            for k in ("patch_size", "temporal_patch_size", "merge_size", "image_mean", "image_std")
        },
        **TINY_BUDGET,
    )
    image = _image(*shape, seed=shape[0] * 7 + shape[1])
    want = hf(images=[image], return_tensors="np")
    got = preprocessor([image])
    assert got.grid_thw == tuple(int(v) for v in want["image_grid_thw"][0])
    assert got.pixel_values.shape == (int(np.prod(got.grid_thw)), 3 * 2 * 16 * 16)
    assert got.pixel_values.dtype == np.float32
    np.testing.assert_array_equal(got.pixel_values, want["pixel_values"])


def test_the_released_budget_equals_the_reference_too():
    pre = Qwen3OmniVisionPreprocessor.from_preprocessor_config(RELEASED_PREPROCESSOR, Qwen3OmniMoeVisionEncoderConfig())
    hf = Qwen2VLImageProcessorPil.from_dict(RELEASED_PREPROCESSOR)
    assert list(hf.image_mean) == list(pre.image_mean) and hf.patch_size == 16
    image = _image(333, 500, seed=3)
    want = hf(images=[image], return_tensors="np")
    got = pre([image])
    assert got.grid_thw == tuple(int(v) for v in want["image_grid_thw"][0]) == (1, 20, 32)
    np.testing.assert_array_equal(got.pixel_values, want["pixel_values"])


def _hand_built_video(frames: list[np.ndarray], info: VisionInfo) -> tuple[np.ndarray, tuple[int, int, int]]:
    height, width = smart_resize(
        *frames[0].shape[:2], factor=32, min_pixels=info.min_pixels, max_pixels=info.max_pixels
    )
    out = []
    for frame in frames:
        x = resize(frame, (height, width), resample=PILImageResampling.BICUBIC)
        x = normalize(rescale(x, 1 / 255), [0.5] * 3, [0.5] * 3)
        out.append(np.moveaxis(x, -1, 0))
    if len(out) % 2:
        out.append(out[-1])
    x = np.stack(out)
    gt, gh, gw = len(out) // 2, height // 16, width // 16
    rows = x.reshape(gt, 2, 3, gh // 2, 2, 16, gw // 2, 2, 16).transpose(0, 3, 6, 4, 7, 2, 1, 5, 8)
    return rows.reshape(gt * gh * gw, 3 * 2 * 16 * 16), (gt, gh, gw)


@pytest.mark.parametrize("count", [1, 2, 3, 4])
def test_video_frames_equal_the_hand_built_reference(preprocessor, count):
    frames = [_image(90, 120, seed=i) for i in range(count)]
    for info in (preprocessor.info, preprocessor.video_info):
        want, grid = _hand_built_video(frames, info)
        got = preprocessor(frames, info=info)
        assert got.grid_thw == grid and grid[0] == (count + 1) // 2
        np.testing.assert_array_equal(got.pixel_values, want)


@pytest.mark.parametrize(
    "frame, match",
    [
        (np.zeros((40, 40, 3), dtype=np.float32), "uint8 RGB"),
        (np.zeros((40, 40), dtype=np.uint8), "uint8 RGB"),
        (np.zeros((40, 40, 4), dtype=np.uint8), "uint8 RGB"),
        ([[1, 2, 3]], "uint8 RGB"),
        (np.zeros((0, 40, 3), dtype=np.uint8), "empty"),
        (np.zeros((1, 300, 3), dtype=np.uint8), "aspect ratio"),
    ],
)
def test_bad_frames_are_invalid_images(preprocessor, frame, match):
    with pytest.raises(InvalidImageError, match=match) as caught:
        preprocessor([frame])
    assert caught.value.code == "invalid_image"
    if match != "aspect ratio":  # a clip's later frames are resized to the first one's size, whatever theirs
        with pytest.raises(InvalidImageError, match=match):
            preprocessor([_image(40, 40), frame])
    with pytest.raises(InvalidImageError, match="no frames"):
        preprocessor([])


def test_token_counts(preprocessor, tower, items):
    encoder = Qwen3OmniVisionEncoder(tower, device=torch.device("cpu"))
    assert encoder.merge_size == 2 and encoder.deepstack_layers == 2
    assert [item.grid_thw for item in items] == [(1, 4, 4), (1, 4, 10), (2, 6, 8)]
    assert [encoder.tokens(item.grid_thw) for item in items] == [4, 10, 24]
    shapes = [(64, 64, 1), (90, 200, 1), (100, 130, 3)]
    assert [preprocessor.info.tokens(*shape) for shape in shapes] == [4, 10, 24]


def test_one_item_at_a_time_equals_the_reference_forward_exactly(tower, items):
    encoder = Qwen3OmniVisionEncoder(tower, device=torch.device("cpu"), batch=False)
    got = encoder.encode_many(items)
    assert len(got) == len(items) and all(isinstance(g, VisionFeatures) for g in got)
    for features, item in zip(got, items, strict=True):
        tokens, deepstack = _hf(tower, *item)
        n = encoder.tokens(item.grid_thw)
        assert features.tokens.shape == (n, 64) and features.tokens.dtype == torch.float32
        assert torch.equal(features.tokens, tokens)
        assert len(features.deepstack) == 2
        for mine, want in zip(features.deepstack, deepstack, strict=True):
            assert mine.shape == (n, 64) and torch.equal(mine, want)
        # the deepstack mergers are distinct layers: their features are not the final tokens
        assert not torch.allclose(features.deepstack[0], features.deepstack[1], atol=1e-3)


def test_a_batch_equals_the_reference_forward_on_each_item(tower, items):
    batched = Qwen3OmniVisionEncoder(tower, device=torch.device("cpu"), batch=True)
    assert not Qwen3OmniVisionEncoder(tower, device=torch.device("cpu")).batch  # one call per item on CPU by default
    pictures = items[:2]
    for selection in (pictures, items):
        got = batched.encode_many(selection)
        assert [g.tokens.shape[0] for g in got] == [batched.tokens(i.grid_thw) for i in selection]
        for features, item in zip(got, selection, strict=True):
            tokens, deepstack = _hf(tower, *item)
            torch.testing.assert_close(features.tokens, tokens, rtol=1e-5, atol=1e-5)
            for mine, want in zip(features.deepstack, deepstack, strict=True):
                torch.testing.assert_close(mine, want, rtol=1e-5, atol=1e-5)
    assert batched.encode_many([]) == []


def test_reference_pixel_values_through_the_encoder(tower):
    """The whole path: a picture preprocessed by the reference image processor and by ours encodes the same."""
    pre = Qwen3OmniVisionPreprocessor.from_preprocessor_config({**RELEASED_PREPROCESSOR, **TINY_BUDGET}, tower.config)
    hf = Qwen2VLImageProcessorPil.from_dict({**RELEASED_PREPROCESSOR, **TINY_BUDGET})
    image = _image(70, 110, seed=5)
    want = hf(images=[image], return_tensors="np")
    tokens, deepstack = _hf(tower, want["pixel_values"], want["image_grid_thw"][0])
    (got,) = Qwen3OmniVisionEncoder(tower, device=torch.device("cpu")).encode_many([pre([image])])
    assert torch.equal(got.tokens, tokens) and all(torch.equal(a, b) for a, b in zip(got.deepstack, deepstack))
