"""The audio tower over padded blocks (pipeline/models/qwen2_5_omni/audio_encoder.py) equals transformers' forward on
each block, eagerly on the CPU and from its CUDA graphs on a GPU, whatever the blocks batched beside it."""

from __future__ import annotations

import pytest
import torch

from pipeline.models.common.hf_parts import thinker_audio_tower
from pipeline.models.qwen2_5_omni.audio_encoder import Qwen25OmniBlockEncoder
from pipeline.models.qwen2_5_omni.checkpoint import audio_tokens_for_mel_frames

LENGTHS = (200, 199, 37, 4, 3, 2, 150)
"""Full blocks and tails, odd and even positions after the strided convolution, the shortest a commit accepts."""

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


@pytest.fixture(scope="module")
def tower(tiny_model_dir):
    from pipeline.models.qwen2_5_omni.checkpoint import load_checkpoint

    return thinker_audio_tower(load_checkpoint(tiny_model_dir, dtypes={"thinker": torch.float32}).thinker)


def reference(tower, features: torch.Tensor) -> torch.Tensor:
    lens = torch.tensor([features.shape[1]], dtype=torch.long, device=features.device)
    return tower(input_features=features, feature_lens=lens).last_hidden_state


def blocks(lengths=LENGTHS, seed=0) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(128, n, generator=gen) for n in lengths]


def test_token_counts_are_transformers():
    from transformers.models.qwen2_5_omni.modeling_qwen2_5_omni import Qwen2_5OmniAudioEncoder

    frames = torch.arange(1, 201)
    _, expected = Qwen2_5OmniAudioEncoder._get_feat_extract_output_lengths(None, frames)
    assert [audio_tokens_for_mel_frames(int(n)) for n in frames] == expected.tolist()


@torch.inference_mode()
def test_eager_batch_equals_transformers_per_block(tower):
    encoder = Qwen25OmniBlockEncoder(tower, device=torch.device("cpu"))
    features = blocks()
    encoded = encoder.encode_many(features)
    for f, got in zip(features, encoded, strict=True):
        want = reference(tower, f)
        assert got.shape == want.shape == (audio_tokens_for_mel_frames(f.shape[1]), want.shape[1])
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


@torch.inference_mode()
def test_a_block_does_not_depend_on_its_batch(tower):
    encoder = Qwen25OmniBlockEncoder(tower, device=torch.device("cpu"))
    (alone,) = encoder.encode_many(blocks((37,)))
    beside = encoder.encode_many(blocks((200,), seed=1) + blocks((37,)))[1]
    torch.testing.assert_close(beside, alone, rtol=1e-5, atol=1e-5)


def test_blocks_longer_than_the_encoders_window_are_refused(tower):
    encoder = Qwen25OmniBlockEncoder(tower, device=torch.device("cpu"))
    with pytest.raises(ValueError, match="1..200 frames"):
        encoder.encode_many([torch.zeros(128, 201)])


@cuda
@torch.inference_mode()
def test_graph_replays_equal_transformers_per_block(tower):
    tower = tower.to("cuda")
    try:
        encoder = Qwen25OmniBlockEncoder(tower, device=torch.device("cuda"), batch_sizes=(1, 4))
        encoder.capture()
        assert encoder.captured
        features = blocks()  # 7 blocks: one replay of 4, then 3 padded to 4
        encoded = encoder.encode_many(features)
        (single,) = encoder.encode_many(features[2:3])
        for f, got in zip(features, encoded, strict=True):
            torch.testing.assert_close(got, reference(tower, f.cuda()), rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(single, encoded[2], rtol=1e-5, atol=1e-5)
    finally:
        tower.to("cpu")
