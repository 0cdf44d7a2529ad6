"""The sharpened test checkpoint (``Qwen25OmniRandomModelSpec.sharpened``, fixture ``sharp_model_dir``) is the one on
which a wrong position shows: with transformers' thinker alone, greedy tokens with the reference positions differ from
those with wrong ones, on an image prompt and on an audio prompt, while the plain tiny checkpoint hardly notices."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from pipeline.models.qwen2_5_omni.checkpoint import load_checkpoint

STEPS = 10


def _greedy(thinker, ids: torch.Tensor, positions, **inputs) -> tuple[list[int], torch.Tensor]:
    """``STEPS`` greedy tokens, each step a full forward with ``positions(ids)`` (3, 1, L); also the last logits."""
    out = []
    for _ in range(STEPS):
        with torch.inference_mode():
            logits = thinker(input_ids=ids, position_ids=positions(ids), **inputs).logits[0, -1]
        out.append(int(logits.argmax()))
        ids = torch.cat([ids, torch.tensor([[out[-1]]])], dim=1)
    return out, logits


def _flat(ids: torch.Tensor) -> torch.Tensor:
    return torch.arange(ids.shape[1]).view(1, 1, -1).expand(3, 1, -1)


def _prompt(ckpt, *middle: int) -> torch.Tensor:
    s, tok = ckpt.special, ckpt.tokenizer
    head = [s.im_start, *tok.encode("user\nWhat is this?", add_special_tokens=False)]
    tail = [s.im_end, *tok.encode("\n", add_special_tokens=False), s.im_start]
    return torch.tensor([head + list(middle) + tail + tok.encode("assistant\n", add_special_tokens=False)])


def _image_case(ckpt):
    s = ckpt.special
    picture = np.random.default_rng(1).integers(0, 256, (120, 170, 3), dtype=np.uint8)
    pixels, grid = ckpt.vision([picture])
    n = grid[0] * grid[1] * grid[2] // 4
    ids = _prompt(ckpt, s.vision_start, *[s.image_token] * n, s.vision_end)
    inputs = {"pixel_values": torch.as_tensor(pixels), "image_grid_thw": torch.tensor([grid])}
    return ids, inputs


def _audio_case(ckpt):
    s = ckpt.special
    t = np.arange(int(1.7 * 16000)) / 16000
    noise = 0.05 * np.random.default_rng(0).standard_normal(t.size)
    pcm = (0.3 * np.sin(2 * np.pi * 220 * t) + noise).astype(np.float32)
    feats = ckpt.feature_extractor(
        pcm, sampling_rate=16000, return_attention_mask=True, padding="max_length", return_tensors="pt"
    )
    n = ckpt.audio_tokens_for_samples(pcm.size)
    ids = _prompt(ckpt, s.audio_start, *[s.audio_token] * n, s.audio_end)
    return ids, {"input_features": feats["input_features"], "feature_attention_mask": feats["attention_mask"]}


@pytest.fixture(scope="module")
def checkpoints(tiny_model_dir, sharp_model_dir):
    return {"plain": load_checkpoint(tiny_model_dir), "sharp": load_checkpoint(sharp_model_dir)}


def _image_runs(ckpt):
    ids, inputs = _image_case(ckpt)
    thinker = ckpt.thinker

    def reference(x):
        return thinker.get_rope_index(x, image_grid_thw=inputs["image_grid_thw"], attention_mask=torch.ones_like(x))[0]

    assert not torch.equal(reference(ids), _flat(ids))
    return _greedy(thinker, ids, reference, **inputs), _greedy(thinker, ids, _flat, **inputs)


def test_on_the_sharp_checkpoint_1d_positions_change_an_image_prompts_greedy_tokens(checkpoints):
    (right, right_logits), (wrong, wrong_logits) = _image_runs(checkpoints["sharp"])
    assert right != wrong
    assert (right_logits - wrong_logits).abs().max() > 0.1


def test_on_the_plain_checkpoint_they_do_not(checkpoints):
    """Why the sharp checkpoint exists: the plain random model is nearly blind to positions."""
    (right, right_logits), (wrong, wrong_logits) = _image_runs(checkpoints["plain"])
    assert right == wrong
    assert (right_logits - wrong_logits).abs().max() < 0.01


def test_the_reference_loop_is_reference_generate(checkpoints):
    """The greedy loop above, with ``get_rope_index`` positions, makes what transformers' own ``generate`` makes."""
    ckpt = checkpoints["sharp"]
    ids, inputs = _image_case(ckpt)
    (right, _), _ = _image_runs(ckpt)
    with torch.inference_mode():
        out = ckpt.thinker.generate(
            input_ids=ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=STEPS,
            min_new_tokens=STEPS,
            do_sample=False,
            **inputs,
        )
    assert out[0, ids.shape[1] :].tolist() == right


@pytest.mark.parametrize("name", ["sharp", "plain"])
def test_an_audio_prompts_tokens_change_with_a_one_position_shift_only_on_the_sharp_checkpoint(checkpoints, name):
    """Audio alone gets 1-D positions from the reference (asserted), so the wrong positions here are a shift by one
    of everything after the audio block, as an incremental prefill that miscounted the audio would make."""
    ckpt = checkpoints[name]
    ids, inputs = _audio_case(ckpt)
    thinker = ckpt.thinker
    lengths = inputs["feature_attention_mask"].sum(-1)
    end = int((ids[0] == ckpt.special.audio_end).nonzero()[0, 0])

    def reference(x):
        return thinker.get_rope_index(x, attention_mask=torch.ones_like(x), audio_seqlens=lengths)[0]

    def shifted(x):
        positions = _flat(x).clone()
        positions[..., end:] += 1
        return positions

    assert torch.equal(reference(ids), _flat(ids))
    right, _ = _greedy(thinker, ids, reference, **inputs)
    wrong, _ = _greedy(thinker, ids, shifted, **inputs)
    assert (right != wrong) == (name == "sharp")
