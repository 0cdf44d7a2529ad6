"""Camera video in a spoken message on Qwen3-Omni, prefilled chunk by chunk while the message is spoken (each frame
pair's deepstack features with its chunk), answered with speech: the rendering and its positions equal the reference
processor's layout and ``get_rope_index`` with ``use_audio_in_video``, and the reply's text equals transformers'
thinker ``generate`` (greedy) fed the same features and pixel values, on the sharpened tiny checkpoint; without the
video's deepstack features it differs. The reference talker cannot answer such a message (its ``get_rope_index``
reads an ``audio_config`` the talker config lacks), so the spoken part is checked to run, not against a reference."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from transformers import AutoTokenizer, Qwen3OmniMoeForConditionalGeneration, WhisperFeatureExtractor
from transformers.models.qwen3_omni_moe.modeling_qwen3_omni_moe import _get_feat_extract_output_lengths

from conftest import greedy_stage_config
from pipeline.engine import OmniEngine
from pipeline.models.qwen3_omni.av_interleave import Qwen3OmniAVLayout
from pipeline.models.qwen3_omni.prompt import DEFAULT_SYSTEM_PROMPT
from tests.helpers.camera_clips import RATE, camera, speak, speech
from tests.helpers.qwen3_reference import TALKER_MAX, THINKER_MAX, VOICE, collect

CLIP = (speech(5.3, 1), camera(11, 2))
"""5.3 s of audio, 11 frames at 2 fps: 6 frame pairs."""


@pytest.fixture(scope="module")
def engine(qwen3_sharp_model_dir):
    config = greedy_stage_config(
        family="qwen3_omni", thinker={"audio_floor": "exact"}, talker={"max_tokens": TALKER_MAX}
    )
    engine = OmniEngine.from_pretrained(qwen3_sharp_model_dir, config, seed=7)
    yield engine
    engine.close()


@pytest.fixture(scope="module")
def reference(qwen3_sharp_model_dir):
    model = Qwen3OmniMoeForConditionalGeneration.from_pretrained(qwen3_sharp_model_dir, dtype=torch.float32).eval()
    tokenizer = AutoTokenizer.from_pretrained(qwen3_sharp_model_dir)
    return model, tokenizer, WhisperFeatureExtractor.from_pretrained(qwen3_sharp_model_dir)


def reference_inputs(engine, reference, pcm: np.ndarray, frames: list[np.ndarray]) -> dict:
    """The thinker's inputs for one spoken message with video after the system message: the processor's layout of
    audio in video (:class:`Qwen3OmniAVLayout`, tested against it), Whisper features, the engine's preprocessing of
    each frame pair."""
    _, tokenizer, features = reference
    core = engine.core
    s, enc = core.special, tokenizer.encode
    timing = core.family.av_timing(core.ckpt)
    f = features(pcm, sampling_rate=RATE, return_attention_mask=True, padding="max_length")
    mel = torch.tensor(np.asarray(f["input_features"][0]))[None]
    mask = torch.tensor(np.asarray(f["attention_mask"][0]))[None]
    n_audio = int(_get_feat_extract_output_lengths(mask.sum()))
    preprocess = core.family.vision_preprocessor(core.ckpt)
    pairs = [preprocess(frames[i : i + 2]) for i in range(0, len(frames), 2)]
    _, gh, gw = pairs[0].grid_thw
    merge = engine.vision.merge_size
    layout = Qwen3OmniAVLayout(timing, rows=gh // merge, cols=gw // merge, n_patches=len(pairs), n_audio=n_audio)
    ids = [s.im_start, *enc(f"system\n{DEFAULT_SYSTEM_PROMPT}", add_special_tokens=False), s.im_end]
    ids += [*enc("\n", add_special_tokens=False), s.im_start, *enc("user\n", add_special_tokens=False)]
    ids += layout.token_ids(
        vision_start=s.vision_start,
        audio_start=s.audio_start,
        video=s.video_token,
        audio=s.audio_token,
        audio_end=s.audio_end,
        vision_end=s.vision_end,
    )
    ids += [s.im_end, *enc("\n", add_special_tokens=False), s.im_start, *enc("assistant\n", add_special_tokens=False)]
    return dict(
        input_ids=torch.tensor([ids]),
        attention_mask=torch.ones(1, len(ids), dtype=torch.long),
        input_features=mel,
        feature_attention_mask=mask,
        pixel_values_videos=torch.from_numpy(np.concatenate([p.pixel_values for p in pairs])),
        video_grid_thw=torch.tensor([[len(pairs), gh, gw]]),
        video_second_per_grid=torch.tensor([timing.second_per_grid]),
        use_audio_in_video=True,
    )


def reference_text(engine, reference, inputs: dict) -> list[int]:
    special = engine.ckpt.special
    with torch.inference_mode():
        out = reference[0].thinker.generate(
            **inputs, max_new_tokens=THINKER_MAX, do_sample=False, repetition_penalty=1.0, eos_token_id=special.im_end
        )
    reply = out[0, inputs["input_ids"].shape[1] :].tolist()
    return [t for t in reply if t not in (special.im_end, special.endoftext)]


async def spoken_reply(engine):
    conv = engine.conversation()
    await speak(engine, conv, "u1", CLIP)
    done, pcm = await collect(conv.respond(item_id="a1", voice=VOICE, max_output_tokens=THINKER_MAX))
    return conv, done, pcm


@pytest.mark.slow
async def test_a_spoken_message_with_video_matches_the_reference_thinker(engine, reference):
    conv, done, pcm = await spoken_reply(engine)
    inputs = reference_inputs(engine, reference, *CLIP)
    state = engine.core.conversations.get(conv.id)
    rendering = state.render()
    n = inputs["input_ids"].shape[1]
    assert rendering.token_ids[:n] == inputs["input_ids"][0].tolist()
    positions, _ = reference[0].thinker.get_rope_index(
        inputs["input_ids"],
        None,
        inputs["video_grid_thw"],
        inputs["attention_mask"],
        use_audio_in_video=True,
        audio_seqlens=inputs["feature_attention_mask"].sum(-1),
        second_per_grids=inputs["video_second_per_grid"],
    )
    ours = engine.core.scheduler.positions.rope_positions(n, rendering.spans)
    np.testing.assert_array_equal(ours, positions[:, 0].numpy())
    assert done.usage.cached_tokens > done.usage.input_image_tokens > 0, "the video was prefilled while spoken"
    assert list(done.text_token_ids) == reference_text(engine, reference, inputs)
    assert len(done.audio_codes) >= 3 and len(pcm) > 0, "the talker speaks the reply"
    await conv.close()


@pytest.mark.slow
async def test_without_the_videos_deepstack_features_the_text_differs(engine, reference, monkeypatch):
    import pipeline.runners.model_runner as model_runner

    monkeypatch.setattr(model_runner.ModelRunner, "_deepstack", staticmethod(lambda job, device: None))
    conv, done, _ = await spoken_reply(engine)
    assert list(done.text_token_ids) != reference_text(engine, reference, reference_inputs(engine, reference, *CLIP))
    await conv.close()
