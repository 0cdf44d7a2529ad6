"""A video's frame pairs encoded one call each equal the whole video encoded at once (one ``grid_thw`` over every
frame, as the reference encodes a message's video): the tower's full and windowed attention, its rotary positions and
its patch merger never cross temporal patches, so the engine can encode a spoken message's video chunk by chunk."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from pipeline.models.common.hf_parts import thinker_vision_tower
from pipeline.models.qwen2_5_omni.checkpoint import load_checkpoint
from pipeline.models.qwen2_5_omni.vision_encoder import Qwen25OmniVisionEncoder


@pytest.fixture(scope="module")
def ckpt(tiny_model_dir):
    return load_checkpoint(tiny_model_dir)


def test_frame_pairs_encode_like_the_whole_video(ckpt):
    rng = np.random.default_rng(1)
    frames = [rng.integers(0, 256, (200, 260, 3), dtype=np.uint8) for _ in range(6)]
    whole = ckpt.vision(frames)
    pairs = [ckpt.vision(frames[i : i + 2]) for i in range(0, len(frames), 2)]
    assert whole.grid_thw[0] == 3 and all(p.grid_thw == (1, *whole.grid_thw[1:]) for p in pairs)
    np.testing.assert_array_equal(whole.pixel_values, np.concatenate([p.pixel_values for p in pairs]))
    visual = thinker_vision_tower(ckpt.thinker)
    window_tokens = (ckpt.config.thinker_config.vision_config.window_size // 28) ** 2
    assert whole.grid_thw[1] * whole.grid_thw[2] // 4 > 2 * window_tokens  # several windows per frame pair
    one_call = Qwen25OmniVisionEncoder(visual, device=torch.device("cpu"), batch=False)
    (video,) = one_call.encode_many([whole])
    chunked = torch.cat(one_call.encode_many(pairs))
    # the same arithmetic on fewer rows: equal up to the rounding of a smaller matrix product on CPU
    torch.testing.assert_close(chunked, video, rtol=1e-5, atol=1e-6)
    batched = Qwen25OmniVisionEncoder(visual, device=torch.device("cpu"), batch=True)
    torch.testing.assert_close(torch.cat(batched.encode_many(pairs)), video, rtol=1e-5, atol=1e-6)
    # a video of frames in a different order differs: the comparison sees the frames
    (swapped,) = one_call.encode_many([ckpt.vision(frames[2:4] + frames[:2] + frames[4:])])
    assert not torch.allclose(swapped, video, atol=1e-3)
