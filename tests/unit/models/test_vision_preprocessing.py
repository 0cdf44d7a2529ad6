"""Qwen2.5-Omni picture preprocessing (pipeline/models/qwen2_5_omni/vision.py over
pipeline/models/common/vision_patches.py) against transformers' Qwen2-VL image processor.

No torchvision here, so the reference is the processor's PIL path; our resize is PIL's bicubic filter too, so the
pixel values must be bit-identical. Video has no reference processor without torchvision: it is checked against the
hand-built reference (each frame resized, rescaled and normalised by transformers' own functions, the frames padded
to a pair and cut into patches by one reshape)."""

from __future__ import annotations

import dataclasses
import itertools

import numpy as np
import pytest
from transformers.image_transforms import normalize, rescale, resize
from transformers.image_utils import PILImageResampling
from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil, smart_resize

from pipeline.api import MAX_ASPECT_RATIO, VisionInfo
from pipeline.errors import CheckpointError, InvalidImageError
from pipeline.models.qwen2_5_omni.tiny import Qwen25OmniRandomModelSpec, _write_preprocessor_config, build_config
from pipeline.models.qwen2_5_omni.vision import VIDEO_FPS, Qwen25OmniVisionPreprocessor

RELEASED = VisionInfo(
    fps=VIDEO_FPS, min_pixels=3136, max_pixels=12845056, patch_size=14, merge_size=2, temporal_patch_size=2
)
TINY_BUDGETS = (RELEASED, dataclasses.replace(RELEASED, max_pixels=64 * 28 * 28))
SIDES = (1, 2, 13, 14, 27, 28, 29, 41, 55, 56, 57, 100, 111, 112, 199, 224, 333, 480, 640, 1000, 1080, 1920, 4000)


def _image(height: int, width: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (height, width, 3), dtype=np.uint8)


@pytest.fixture(scope="module")
def preprocessor(tmp_path_factory) -> Qwen25OmniVisionPreprocessor:
    """The tiny checkpoint's settings, read back from the preprocessor_config.json it writes."""
    import json

    folder = tmp_path_factory.mktemp("pre")
    spec = Qwen25OmniRandomModelSpec.tiny()
    _write_preprocessor_config(folder, spec)
    raw = json.loads((folder / "preprocessor_config.json").read_text())
    pre = Qwen25OmniVisionPreprocessor.from_preprocessor_config(raw, build_config(spec).thinker_config.vision_config)
    assert pre is not None
    return pre


@pytest.fixture(scope="module")
def hf_processor(preprocessor, tmp_path_factory) -> Qwen2VLImageProcessorPil:
    folder = tmp_path_factory.mktemp("pre-hf")
    _write_preprocessor_config(folder, Qwen25OmniRandomModelSpec.tiny())
    return Qwen2VLImageProcessorPil.from_pretrained(folder)


@pytest.mark.parametrize("info", TINY_BUDGETS, ids=["released", "tiny"])
def test_the_resize_rule_is_the_reference_smart_resize(info):
    factor = info.patch_size * info.merge_size
    checked = 0
    for height, width in itertools.product(SIDES, SIDES):
        if max(height, width) / min(height, width) > MAX_ASPECT_RATIO:
            continue
        want = smart_resize(height, width, factor=factor, min_pixels=info.min_pixels, max_pixels=info.max_pixels)
        assert info.resized(height, width) == want, (height, width)
        checked += 1
    for height, width in ((1, 200), (200, 1), (3, 600), (100, 20000), (28, 5600), (5, 7), (13, 2600)):
        want = smart_resize(height, width, factor=factor, min_pixels=info.min_pixels, max_pixels=info.max_pixels)
        assert info.resized(height, width) == want, (height, width)
    assert checked > 400


def test_what_the_reference_refuses_is_an_invalid_image():
    for height, width in ((1, 201), (300, 1), (10, 2001)):
        with pytest.raises(ValueError, match="aspect ratio"):
            smart_resize(height, width, factor=28, min_pixels=RELEASED.min_pixels, max_pixels=RELEASED.max_pixels)
        with pytest.raises(InvalidImageError, match="aspect ratio") as caught:
            RELEASED.resized(height, width)
        assert caught.value.code == "invalid_image"
    for height, width in ((0, 10), (10, 0)):
        with pytest.raises(InvalidImageError, match="empty"):
            RELEASED.resized(height, width)


@pytest.mark.parametrize(
    "shape", [(28, 28), (56, 84), (100, 150), (150, 100), (17, 333), (480, 640), (7, 9), (300, 41)]
)
def test_a_picture_equals_the_reference_image_processor_exactly(preprocessor, hf_processor, shape):
    image = _image(*shape, seed=shape[0] * 7 + shape[1])
    want = hf_processor(images=[image], return_tensors="np")
    got = preprocessor([image])
    assert got.grid_thw == tuple(int(v) for v in want["image_grid_thw"][0])
    assert got.pixel_values.dtype == np.float32
    np.testing.assert_array_equal(got.pixel_values, want["pixel_values"])


def test_the_released_budget_equals_the_reference_too(preprocessor):
    hf = Qwen2VLImageProcessorPil(min_pixels=RELEASED.min_pixels, max_pixels=RELEASED.max_pixels)
    for shape in ((480, 640), (33, 1000)):
        image = _image(*shape, seed=3)
        want = hf(images=[image], return_tensors="np")
        got = preprocessor([image], info=RELEASED)
        assert got.grid_thw == tuple(int(v) for v in want["image_grid_thw"][0])
        np.testing.assert_array_equal(got.pixel_values, want["pixel_values"])


def _hand_built_video(
    frames: list[np.ndarray], pre: Qwen25OmniVisionPreprocessor
) -> tuple[np.ndarray, tuple[int, int, int]]:
    info = pre.info
    height, width = smart_resize(
        *frames[0].shape[:2],
        factor=info.patch_size * info.merge_size,
        min_pixels=info.min_pixels,
        max_pixels=info.max_pixels,
    )
    out = []
    for frame in frames:
        x = resize(frame, (height, width), resample=PILImageResampling.BICUBIC)
        x = normalize(rescale(x, 1 / 255), pre.image_mean, pre.image_std)
        out.append(np.moveaxis(x, -1, 0))
    if len(out) % 2:
        out.append(out[-1])
    x = np.stack(out)
    gt, gh, gw = len(out) // 2, height // 14, width // 14
    rows = x.reshape(gt, 2, 3, gh // 2, 2, 14, gw // 2, 2, 14).transpose(0, 3, 6, 4, 7, 2, 1, 5, 8)
    return rows.reshape(gt * gh * gw, 3 * 2 * 14 * 14), (gt, gh, gw)


@pytest.mark.parametrize("count", [1, 2, 3, 4])
def test_video_frames_equal_the_hand_built_reference(preprocessor, count):
    frames = [_image(90, 120, seed=i) for i in range(count)]
    want, grid = _hand_built_video(frames, preprocessor)
    got = preprocessor(frames)
    assert got.grid_thw == grid and grid[0] == (count + 1) // 2
    np.testing.assert_array_equal(got.pixel_values, want)


def test_an_image_is_its_frame_twice(preprocessor):
    image = _image(60, 80)
    np.testing.assert_array_equal(preprocessor([image]).pixel_values, preprocessor([image, image]).pixel_values)


def test_frames_of_a_clip_take_the_first_frames_size(preprocessor):
    first, second = _image(90, 120, seed=1), _image(180, 240, seed=2)
    got = preprocessor([first, second])
    assert got.grid_thw == preprocessor([first]).grid_thw


@pytest.mark.parametrize(
    "frame, match",
    [
        (np.zeros((10, 10, 3), dtype=np.float32), "uint8 RGB"),
        (np.zeros((10, 10), dtype=np.uint8), "uint8 RGB"),
        (np.zeros((10, 10, 4), dtype=np.uint8), "uint8 RGB"),
        ([[1, 2, 3]], "uint8 RGB"),
        (np.zeros((0, 10, 3), dtype=np.uint8), "empty"),
        (np.zeros((1, 300, 3), dtype=np.uint8), "aspect ratio"),
    ],
)
def test_bad_frames_are_invalid_images(preprocessor, frame, match):
    with pytest.raises(InvalidImageError, match=match):
        preprocessor([frame])
    with pytest.raises(InvalidImageError, match="no frames"):
        preprocessor([])


def test_the_settings_come_from_the_preprocessor_config():
    vision_config = build_config(Qwen25OmniRandomModelSpec.tiny()).thinker_config.vision_config
    whisper_only = {"feature_extractor_type": "WhisperFeatureExtractor", "feature_size": 128}
    assert Qwen25OmniVisionPreprocessor.from_preprocessor_config(whisper_only, vision_config) is None
    full = {
        **whisper_only,
        "size": {"shortest_edge": 3136, "longest_edge": 50176},
        "patch_size": 14,
        "merge_size": 2,
        "temporal_patch_size": 2,
        "image_mean": [0.5, 0.5, 0.5],
        "image_std": [0.25, 0.25, 0.25],
    }
    pre = Qwen25OmniVisionPreprocessor.from_preprocessor_config(full, vision_config)
    assert pre.info == VisionInfo(2.0, 3136, 50176, 14, 2, 2) and pre.image_std == (0.25, 0.25, 0.25)
    for broken, param in (
        ({**full, "patch_size": 16}, "patch_size"),
        ({**full, "merge_size": None}, "merge_size"),
        ({**full, "image_mean": [0.5, 0.5]}, "image_mean"),
        ({**full, "image_std": [0.5, 0.0, 0.5]}, "image_std"),
        ({**full, "size": {"shortest_edge": 60000, "longest_edge": 50176}}, "min_pixels"),
    ):
        with pytest.raises(CheckpointError) as caught:
            Qwen25OmniVisionPreprocessor.from_preprocessor_config(broken, vision_config)
        assert caught.value.param == param


def test_the_7b_preset_has_the_released_processor_settings(tmp_path):
    import json

    spec = Qwen25OmniRandomModelSpec.qwen2_5_omni_7b()
    _write_preprocessor_config(tmp_path, spec)
    raw = json.loads((tmp_path / "preprocessor_config.json").read_text())
    pre = Qwen25OmniVisionPreprocessor.from_preprocessor_config(raw, build_config(spec).thinker_config.vision_config)
    assert pre.info == RELEASED
    defaults = Qwen2VLImageProcessorPil()
    assert list(pre.image_mean) == list(defaults.image_mean) and list(pre.image_std) == list(defaults.image_std)
    assert pre.info.min_pixels == defaults.size["shortest_edge"]
    assert raw["feature_extractor_type"] == "WhisperFeatureExtractor" and raw["feature_size"] == 128
