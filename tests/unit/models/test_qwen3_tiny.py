"""The random Qwen3-Omni checkpoints: the written tiny one loads in transformers' reference with every weight, its
tokenizer agrees with its config, it generates text and speech, and the spec checks, the 30B-A3B parameter count and
the sharpened variant's position sensitivity hold."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
import torch

from pipeline.errors import CheckpointError
from pipeline.models.common.random_checkpoint import RANDOM_MARKER_FILE
from pipeline.models.qwen3_omni import released, tiny
from pipeline.models.qwen3_omni.tiny import Qwen3OmniRandomModelSpec

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return tiny.make_random_checkpoint(tmp_path_factory.mktemp("qwen3-tiny"))


@pytest.fixture(scope="module")
def loaded(checkpoint):
    from transformers import AutoTokenizer, Qwen3OmniMoeForConditionalGeneration

    model, info = Qwen3OmniMoeForConditionalGeneration.from_pretrained(checkpoint, output_loading_info=True)
    return model.eval(), info, AutoTokenizer.from_pretrained(checkpoint)


def _prompt(tokenizer, text="Hello! How are you doing today?"):
    messages = [{"role": "user", "content": text}]
    return tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt", return_dict=True)


def test_written_checkpoint_loads_with_every_weight(checkpoint, loaded):
    model, info, _ = loaded
    assert {key: list(value) for key, value in info.items() if value} == {}
    config = json.loads((checkpoint / "config.json").read_text())
    assert config["model_type"] == released.TOP_LEVEL["model_type"]
    assert config["enable_audio_output"] is True
    assert json.loads((checkpoint / RANDOM_MARKER_FILE).read_text())["random_weights"] is True
    for name in ("model.safetensors", "generation_config.json", "chat_template.json", "tokenizer_config.json"):
        assert (checkpoint / name).is_file(), name
    # Written weights are the ones built: the tuned eos row survives the round trip.
    rebuilt = tiny.build_random_model(Qwen3OmniRandomModelSpec.tiny(), dtype=torch.float32)
    torch.testing.assert_close(model.talker.codec_head.weight, rebuilt.talker.codec_head.weight, rtol=0, atol=0)


def test_config_ids_are_the_tokenizers(loaded):
    model, _, tokenizer = loaded
    config = model.config
    thinker, talker = config.thinker_config, config.talker_config
    expected = {
        "<|im_start|>": [config.im_start_token_id],
        "<|im_end|>": [config.im_end_token_id],
        "<tts_pad>": [config.tts_pad_token_id],
        "<tts_text_bos>": [config.tts_bos_token_id],
        "<tts_text_eod>": [config.tts_eos_token_id],
        "<|audio_pad|>": [thinker.audio_token_id, talker.audio_token_id],
        "<|image_pad|>": [thinker.image_token_id, talker.image_token_id],
        "<|video_pad|>": [thinker.video_token_id, talker.video_token_id],
        "<|audio_start|>": [thinker.audio_start_token_id, talker.audio_start_token_id],
        "<|audio_end|>": [thinker.audio_end_token_id, talker.audio_end_token_id],
        "<|vision_start|>": [thinker.vision_start_token_id, talker.vision_start_token_id],
        "<|vision_end|>": [thinker.vision_end_token_id],
        "system": [config.system_token_id],
        "user": [config.user_token_id, thinker.user_token_id],
        "assistant": [config.assistant_token_id],
    }
    for token, config_ids in expected.items():
        assert tokenizer.encode(token, add_special_tokens=False) == config_ids[:1], token
        assert set(config_ids) == {config_ids[0]}, token
    # The added tokens follow the BPE in the released order, and the thinker's table is padded beyond them.
    order = [token for token, _, _ in released.QWEN3_ADDED_TOKENS]
    assert [tokenizer.convert_tokens_to_ids(t) for t in order] == list(range(512, 512 + len(order)))
    assert thinker.text_config.vocab_size > len(tokenizer)
    assert tokenizer.audio_token == released.TOKENIZER_NAMED_TOKENS["audio_token"]
    assert tokenizer.eos_token == released.TOKENIZER["eos_token"]


def test_chat_template_renders_roles_media_and_tools(loaded):
    _, _, tokenizer = loaded
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": [{"type": "audio", "audio": "a.wav"}, {"type": "text", "text": "Hi"}]},
        {"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "f", "arguments": {"x": 1}}}]},
        {"role": "tool", "content": "42"},
        {"role": "tool", "content": "43"},
    ]
    tools = [{"type": "function", "function": {"name": "f", "parameters": {}}}]
    text = tokenizer.apply_chat_template(messages, tools=tools, tokenize=False, add_generation_prompt=True)
    assert text.startswith("<|im_start|>system\nBe brief.\n\n# Tools\n\n")
    assert '\n{"type": "function", "function": {"name": "f", "parameters": {}}}\n</tools>' in text
    assert "<|im_start|>user\n<|audio_start|><|audio_pad|><|audio_end|>Hi<|im_end|>\n" in text
    assert '<|im_start|>assistant\n<tool_call>\n{"name": "f", "arguments": {"x": 1}}\n</tool_call><|im_end|>\n' in text
    assert (
        "<|im_start|>user\n<tool_response>\n42\n</tool_response>\n<tool_response>\n43\n</tool_response><|im_end|>\n"
        in text
    )
    assert text.endswith("<|im_end|>\n<|im_start|>assistant\n")
    plain = tokenizer.apply_chat_template(messages[1:2], tokenize=False)
    assert plain == "<|im_start|>user\n<|audio_start|><|audio_pad|><|audio_end|>Hi<|im_end|>\n"  # no default system


def test_generates_text_only(loaded):
    model, _, tokenizer = loaded
    inputs = _prompt(tokenizer)
    with torch.inference_mode():
        out = model.generate(
            **inputs,
            return_audio=False,
            thinker_max_new_tokens=12,
            thinker_eos_token_id=model.config.im_end_token_id,
            thinker_do_sample=False,
        )
    sequences = out if torch.is_tensor(out) else out.sequences
    assert sequences.shape[1] > inputs["input_ids"].shape[1]


def test_generates_speech_from_speech_with_a_configured_speaker(checkpoint, loaded):
    from transformers import WhisperFeatureExtractor
    from transformers.models.qwen3_omni_moe.processing_qwen3_omni_moe import _get_feat_extract_output_lengths

    model, _, tokenizer = loaded
    config = model.config
    extractor = WhisperFeatureExtractor.from_pretrained(checkpoint)
    audio = np.random.default_rng(0).standard_normal(2 * 16_000).astype(np.float32) * 0.1
    features = extractor(audio, sampling_rate=16_000, return_attention_mask=True, padding=True, return_tensors="pt")
    mask = features["attention_mask"]
    audio_tokens = int(_get_feat_extract_output_lengths(mask.sum(-1), config.thinker_config.audio_config.n_window)[0])
    content = [{"type": "audio", "audio": "user.wav"}, {"type": "text", "text": "What is said?"}]
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": content}], tokenize=False, add_generation_prompt=True
    )
    inputs = tokenizer(text.replace("<|audio_pad|>", "<|audio_pad|>" * audio_tokens), return_tensors="pt")
    speaker = next(iter(config.talker_config.speaker_id))
    with torch.inference_mode():
        sequences, wav = model.generate(
            **inputs,
            input_features=features["input_features"],
            feature_attention_mask=mask,
            speaker=speaker,
            thinker_max_new_tokens=6,
            thinker_eos_token_id=config.im_end_token_id,
            talker_max_new_tokens=40,
            talker_do_sample=False,
        )
    samples_per_frame = int(model.code2wav.total_upsample)
    assert sequences.shape[1] > inputs["input_ids"].shape[1]
    # Greedy speech ends by itself once the text has (the talker's codec-eos logit is raised then), before the cap.
    assert 0 < wav.shape[-1] < 40 * samples_per_frame
    assert wav.float().pow(2).mean().sqrt().item() > 0.01


def test_feature_extractor_makes_128_bin_features(checkpoint):
    from transformers import WhisperFeatureExtractor

    extractor = WhisperFeatureExtractor.from_pretrained(checkpoint)
    features = extractor(np.zeros(16_000, dtype=np.float32), sampling_rate=16_000, return_tensors="pt")
    assert features["input_features"].shape[1] == released.PREPROCESSOR["feature_size"] == 128
    settings = json.loads((checkpoint / "preprocessor_config.json").read_text())
    assert settings["processor_class"] == "Qwen3OmniMoeProcessor"
    assert settings["patch_size"] == Qwen3OmniRandomModelSpec.tiny().vision_patch_size


def test_text_only_checkpoint_has_no_talker(tmp_path):
    out = tiny.main(["--out", str(tmp_path), "--text-only"])
    assert out == 0
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["enable_audio_output"] is False
    from safetensors import safe_open

    with safe_open(tmp_path / "model.safetensors", "pt") as weights:
        prefixes = {key.split(".")[0] for key in weights.keys()}  # noqa: SIM118 (safe_open has no __iter__)
    assert prefixes == {"thinker"}


@pytest.mark.parametrize(
    ("change", "param"),
    [
        ({"thinker_mrope_section": (8, 5, 5)}, "thinker_mrope_section"),
        ({"talker_vocab": 1000}, "talker_vocab"),
        ({"codec_eos_id": 5}, "codec_eos_id"),
        ({"code2wav_upsample_rates": (8, 5, 4, 2)}, "code2wav_upsample_rates"),
        ({"thinker_vocab": 520}, "thinker_vocab"),
        ({"vision_deepstack_indexes": (0, 5)}, "vision_deepstack_indexes"),
        ({"accept_hidden_layer": 3}, "accept_hidden_layer"),
    ],
)
def test_spec_check_catches_inconsistent_sizes(change, param):
    with pytest.raises(CheckpointError) as caught:
        tiny.check_spec(dataclasses.replace(Qwen3OmniRandomModelSpec.tiny(), **change))
    assert caught.value.param == param


def test_released_preset_has_the_released_parameter_count():
    counts = tiny.parameter_count(Qwen3OmniRandomModelSpec.qwen3_omni_30b_a3b())
    assert 35.2e9 <= counts["total"] <= 35.3e9
    for part in ("thinker", "talker", "code2wav"):
        assert counts[part] / 1e9 == pytest.approx(released.PARAMETERS_B[part], abs=0.05)


def _greedy(thinker, input_ids, positions, steps=8):
    """Greedy tokens with the positions ``positions(length)`` gives, recomputed from scratch at every step."""
    sequence = input_ids
    for _ in range(steps):
        logits = thinker(input_ids=sequence, position_ids=positions(sequence.shape[1])).logits[:, -1]
        sequence = torch.cat([sequence, logits.argmax(-1, keepdim=True)], dim=1)
    return sequence[0, input_ids.shape[1] :].tolist()


def test_sharpened_model_is_position_sensitive():
    built = tiny.build_random_model(Qwen3OmniRandomModelSpec.sharpened(), dtype=torch.float32)
    inputs = _prompt(built.tokenizer, "Could you tell me a short story about a cat who lives in a library?")
    split = inputs["input_ids"].shape[1] // 2

    def right(length):
        return torch.arange(length).expand(3, 1, length)

    def wrong(length):  # one position skipped halfway, as a miscounted audio block would
        return (torch.arange(length) + (torch.arange(length) >= split)).expand(3, 1, length)

    with torch.inference_mode():
        assert _greedy(built.thinker, inputs["input_ids"], right) != _greedy(built.thinker, inputs["input_ids"], wrong)
