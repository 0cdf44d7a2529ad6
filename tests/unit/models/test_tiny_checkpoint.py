"""The random checkpoint maker: layout, determinism, config rules, reference generation, 7B shape."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import time
from pathlib import Path

import pytest
import torch

from pipeline.errors import CheckpointError
from pipeline.models.qwen2_5_omni import checkpoint as ckpt
from pipeline.models.qwen2_5_omni import tiny
from pipeline.models.qwen2_5_omni.tiny import Qwen25OmniRandomModelSpec

RELEASED_FILES = {
    "config.json",
    "generation_config.json",
    "model.safetensors",
    "spk_dict.pt",
    "tokenizer.json",
    "tokenizer_config.json",
    "vocab.json",
    "merges.txt",
    "preprocessor_config.json",
    "omni_realtime_random.json",
}


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # Import the model classes first: the build time should not include transformers' import.
    from transformers import Qwen2_5OmniForConditionalGeneration, WhisperFeatureExtractor  # noqa: F401

    start = time.perf_counter()
    out = tiny.make_random_checkpoint(tmp_path_factory.mktemp("tiny") / "ckpt")
    elapsed = time.perf_counter() - start
    print(f"tiny checkpoint built in {elapsed:.2f} s")
    assert elapsed < 10.0  # ~1 s on an idle core
    return out


@pytest.fixture(scope="module")
def reference_model(tiny_dir: Path):
    from transformers import AutoTokenizer, Qwen2_5OmniForConditionalGeneration

    model = Qwen2_5OmniForConditionalGeneration.from_pretrained(tiny_dir).eval()
    return model, AutoTokenizer.from_pretrained(tiny_dir)


def test_layout_matches_released_checkpoints(tiny_dir: Path) -> None:
    assert RELEASED_FILES <= {p.name for p in tiny_dir.iterdir()}
    config = json.loads((tiny_dir / "config.json").read_text())
    assert config["model_type"] == "qwen2_5_omni"
    assert config["enable_audio_output"] is True
    assert {"thinker_config", "talker_config", "token2wav_config"} <= set(config)
    size_mb = (tiny_dir / "model.safetensors").stat().st_size / 1e6
    assert 1.0 < size_mb < 8.0
    preprocessor = json.loads((tiny_dir / "preprocessor_config.json").read_text())
    assert preprocessor["feature_extractor_type"] == "WhisperFeatureExtractor"
    assert preprocessor["feature_size"] == 128
    marker = json.loads((tiny_dir / ckpt.RANDOM_MARKER_FILE).read_text())
    assert marker == {
        "random_weights": True,
        "spec": json.loads(json.dumps(Qwen25OmniRandomModelSpec.tiny().to_dict())),
    }


def test_weights_use_released_key_names(tiny_dir: Path) -> None:
    from safetensors import safe_open

    with safe_open(tiny_dir / "model.safetensors", "pt") as f:
        keys = set(f.keys())
    for prefix in (
        "thinker.model.layers.",
        "thinker.audio_tower.",
        "thinker.visual.",
        "thinker.lm_head.",
        "talker.model.",
        "talker.codec_head.",
        "token2wav.code2wav_dit_model.",
        "token2wav.code2wav_bigvgan_model.",
    ):
        assert any(k.startswith(prefix) for k in keys), prefix


def test_same_seed_gives_identical_weights_and_other_seed_differs(tiny_dir: Path, tmp_path: Path) -> None:
    again = tiny.make_random_checkpoint(tmp_path / "again")
    other = tiny.make_random_checkpoint(tmp_path / "other", Qwen25OmniRandomModelSpec.tiny(seed=1))
    assert _sha256(again / "model.safetensors") == _sha256(tiny_dir / "model.safetensors")
    assert _sha256(again / "tokenizer.json") == _sha256(tiny_dir / "tokenizer.json")
    assert _sha256(other / "model.safetensors") != _sha256(tiny_dir / "model.safetensors")


def test_speakers_file(tiny_dir: Path) -> None:
    raw = torch.load(tiny_dir / "spk_dict.pt", weights_only=True)
    spec = Qwen25OmniRandomModelSpec.tiny()
    assert set(raw) == {"Chelsie", "Ethan"}
    assert raw["Chelsie"]["bos_token"] != raw["Ethan"]["bos_token"]
    for entry in raw.values():
        assert entry["cond"].shape == (1, spec.speaker_dim)
        assert entry["ref_mel"].shape[0] == 1 and entry["ref_mel"].shape[2] == spec.mel_dim
        assert entry["cond"].dtype == torch.float32


def test_tokenizer_ids_and_chat_template(reference_model) -> None:
    _, tokenizer = reference_model
    ids = tiny.added_token_ids(Qwen25OmniRandomModelSpec.tiny().tokenizer_bpe_vocab)
    for token, expected in ids.items():
        assert tokenizer.convert_tokens_to_ids(token) == expected
    text = "Hello, how is the weather today?"
    encoded = tokenizer(text)["input_ids"]
    assert len(encoded) < len(text) // 2  # a trained BPE, not bytes
    assert tokenizer.decode(encoded) == text
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": [{"type": "audio", "audio": "a.wav"}, {"type": "text", "text": "What is it?"}]},
        {"role": "assistant", "content": "A bird."},
    ]
    rendered = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert rendered == (
        "<|im_start|>system\nBe brief.<|im_end|>\n"
        "<|im_start|>user\n<|audio_bos|><|AUDIO|><|audio_eos|>What is it?<|im_end|>\n"
        "<|im_start|>assistant\nA bird.<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    no_system = tokenizer.apply_chat_template([{"role": "user", "content": "Hi"}], tokenize=False)
    assert no_system == ("<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n")
    numbered = tokenizer.apply_chat_template(
        [{"role": "user", "content": [{"type": "audio"}, {"type": "image"}, {"type": "audio"}]}],
        tokenize=False,
        add_audio_id=True,
        add_vision_id=True,
    )
    assert "Audio 1: <|audio_bos|>" in numbered and "Audio 2: <|audio_bos|>" in numbered
    assert "Picture 1: <|vision_bos|><|IMAGE|><|vision_eos|>" in numbered


@pytest.mark.slow
def test_reference_generate_speaks_audibly_and_fast(tiny_dir: Path, reference_model) -> None:
    model, tokenizer = reference_model
    special = ckpt.load_checkpoint(tiny_dir).special
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "Tell me a story."}],
        add_generation_prompt=True,
        return_tensors="pt",
        return_dict=True,
    )["input_ids"]
    torch.manual_seed(0)  # token2wav starts from noise
    with torch.inference_mode():
        model.generate(
            prompt,
            speaker="Chelsie",
            thinker_max_new_tokens=2,
            talker_max_new_tokens=4,
            talker_do_sample=False,
            thinker_do_sample=False,
            talker_eos_token_id=list(special.codec_stop_ids()),
        )  # warm-up
        start = time.perf_counter()
        sequences, waveform = model.generate(
            prompt,
            speaker="Chelsie",
            thinker_max_new_tokens=64,
            talker_max_new_tokens=60,
            talker_do_sample=False,
            thinker_do_sample=False,
            talker_eos_token_id=list(special.codec_stop_ids()),
        )
        elapsed = time.perf_counter() - start
    reply = sequences[0, prompt.shape[1] :]
    rms = waveform.pow(2).mean().sqrt().item()
    print(
        f"reference generate: {len(reply)} text tokens, {waveform.numel() / 24000:.2f} s audio, "
        f"rms {rms:.3f}, {elapsed:.3f} s on one core"
    )
    assert len(reply) >= 1
    assert 0.01 < rms < 0.5
    # Greedy decoding does not stop while the text runs: a full 60 codes of 480 samples each.
    assert waveform.numel() == 60 * 480
    assert elapsed < 3.0  # ~0.7 s on an idle core; generous for a shared CI machine


def test_talker_stop_ids_are_rare_but_possible(reference_model) -> None:
    """The stop rows are shrunk: for random talker states a stop id is (almost) never the greedy
    choice, yet sometimes among the top-k candidates, so sampling can end an utterance. While the
    reply's text runs the talker's end channel (its last) is zero, as the next test shows."""
    model, _ = reference_model
    spec = Qwen25OmniRandomModelSpec.tiny()
    stops = torch.tensor([spec.codec_eos_id, spec.codec_pad_id])
    states = torch.randn(20000, spec.talker_hidden, generator=torch.Generator().manual_seed(0))
    states[:, -1] = 0.0
    with torch.inference_mode():
        logits = model.talker.codec_head(states)
    greedy_stop = torch.isin(logits.argmax(-1), stops).float().mean().item()
    in_top40 = torch.isin(logits.topk(40, dim=-1).indices, stops).any(-1).float().mean().item()
    assert greedy_stop < 1e-3
    assert in_top40 > 0.01
    assert torch.isfinite(logits[:, stops]).all()


def _talker_logits(model, vectors: torch.Tensor, codes: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The talker's codec logits and last hidden states for thinker-side input ``vectors`` (T, H) beside ``codes``."""
    talker = model.talker
    inputs = talker.thinker_to_talker_proj(talker.model.embed_tokens(codes) + vectors)
    hidden = talker.model(inputs_embeds=inputs.unsqueeze(0)).last_hidden_state[0]
    return talker.codec_head(hidden), hidden


def test_speech_ends_soon_after_the_text(reference_model) -> None:
    """While the text runs (the talker's input holds thinker states and token embeddings) codec eos is
    outside the sampler's top-40; once the talker is fed the text-pad vector it is among them (sampling ends the
    speech soon), yet not the greedy choice (greedy decoding runs to its cap, as the engine's tests expect)."""
    model, tokenizer = reference_model
    spec = Qwen25OmniRandomModelSpec.tiny()
    text_model = model.thinker.model
    text_model = getattr(text_model, "language_model", text_model)
    prompt = tokenizer("Tell me a story about the sea and the sky, please.", return_tensors="pt")["input_ids"]
    codes = torch.arange(prompt.shape[1]) % spec.codec_speech_vocab
    with torch.inference_mode():
        thinker_out = text_model(input_ids=prompt).last_hidden_state[0]
        assert torch.all(thinker_out[:, -2] == 0.0)  # the marker channel is silent in the thinker's states
        words = thinker_out + text_model.embed_tokens(prompt[0])
        during, hidden = _talker_logits(model, words, codes)
        assert torch.all(hidden[:, -1] == 0.0)
        pad = text_model.embed_tokens.weight[spec.tts_text_pad_id].expand(len(codes), -1)
        after, _ = _talker_logits(model, pad, codes)
    eos = spec.codec_eos_id
    assert not torch.isin(torch.tensor(eos), during.topk(40, dim=-1).indices).item()
    assert (after.topk(40, dim=-1).indices == eos).any(-1).float().mean().item() > 0.5
    assert not (after.argmax(-1) == eos).any()


def test_thinker_end_logit_sits_below_the_best_but_inside_the_top_k(reference_model) -> None:
    """``<|im_end|>`` is seldom the greedy choice but often among the packaged sampler's top 20, so a sampled
    reply ends on its own while greedy replies run on."""
    model, tokenizer = reference_model
    end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    prompts = torch.randint(0, 500, (8, 48), generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        logits = model.thinker(input_ids=prompts).logits.reshape(-1, model.thinker.config.text_config.vocab_size)
    greedy_end = (logits.argmax(-1) == end).float().mean().item()
    in_top20 = (logits.topk(20, dim=-1).indices == end).any(-1).float().mean().item()
    assert greedy_end < 0.02
    assert in_top20 > 0.1


@pytest.mark.slow
def test_seven_b_spec_has_the_released_parameter_count() -> None:
    count = tiny.parameter_count(Qwen25OmniRandomModelSpec.qwen2_5_omni_7b())
    assert abs(count - 10.69e9) < 0.01e9, count
    assert count == tiny.RELEASED_7B_PARAMETERS["total"]


@pytest.mark.slow
def test_the_recorded_seven_b_parameters_per_part_are_what_transformers_builds() -> None:
    """The per-part counts the capacity table reads (docs/engine.md: token2wav's weights stay float32)."""
    from transformers import Qwen2_5OmniForConditionalGeneration

    with torch.device("meta"):
        model = Qwen2_5OmniForConditionalGeneration(tiny.build_config(Qwen25OmniRandomModelSpec.qwen2_5_omni_7b()))
    parts = {
        name: sum(p.numel() for p in getattr(model, name).parameters()) for name in ("thinker", "talker", "token2wav")
    }
    assert {**parts, "total": sum(parts.values())} == dict(tiny.RELEASED_7B_PARAMETERS)


def test_seven_b_config_keeps_released_codec_ids() -> None:
    config = tiny.build_config(Qwen25OmniRandomModelSpec.qwen2_5_omni_7b())
    talker = config.talker_config
    assert (
        talker.tts_codec_pad_token_id,
        talker.tts_codec_start_token_id,
        talker.tts_codec_end_token_id,
        talker.tts_codec_mask_token_id,
    ) == (8292, 8293, 8294, 8296)
    assert config.token2wav_config.dit_config.num_embeds == 8193
    assert config.thinker_config.text_config.vocab_size == 152064
    assert config.thinker_config.text_config.tie_word_embeddings is False


def _bad(**changes) -> Qwen25OmniRandomModelSpec:
    return dataclasses.replace(Qwen25OmniRandomModelSpec.tiny(), **changes)


@pytest.mark.parametrize(
    ("spec", "needle"),
    [
        (_bad(audio_output_dim=48), "audio_config.output_dim"),
        (_bad(vision_out_hidden=48), "vision_config.out_hidden_size"),
        (_bad(thinker_mrope_section=(4, 6, 4)), "mrope_section"),
        (_bad(talker_mrope_section=(8, 4, 0)), "mrope_section"),
        (_bad(bigvgan_upsample_rates=(5, 3, 2, 2, 2, 4)), "upsample_rates"),
        (_bad(bigvgan_channels=100), "upsample_initial_channel"),
        (_bad(bigvgan_resblock_dilations=((1, 3),)), "resblock_dilation_sizes"),
        (_bad(speaker_enc_channels=(32, 32, 48)), "enc_channels"),
        (_bad(codec_eos_id=128), "codec_eos_id"),
        (_bad(codec_mask_id=100), "codec_mask_id"),
        (_bad(dit_num_embeds=64), "dit_num_embeds"),
        (_bad(tts_text_pad_id=520), "tts_text_pad_id"),
        (_bad(speaker_bos_ids=(1010, 2000)), "speaker_bos_ids"),
        (_bad(speaker_bos_ids=(1010, 1010)), "distinct"),
        (_bad(thinker_vocab=500), "thinker_vocab"),
    ],
)
def test_build_config_rejects_inconsistent_specs(spec: Qwen25OmniRandomModelSpec, needle: str) -> None:
    with pytest.raises(CheckpointError, match=needle.replace("(", r"\(").replace("[", r"\[")):
        tiny.build_config(spec)


def test_build_random_model_in_memory() -> None:
    loaded = tiny.build_random_model(Qwen25OmniRandomModelSpec.tiny(), device="cpu", dtype=torch.float32)
    try:
        assert loaded.random_weights
        assert loaded.tokenizer.convert_tokens_to_ids("<|AUDIO|>") == loaded.special.audio_token
        assert set(loaded.speakers) == {"Chelsie", "Ethan"}
        assert next(loaded.token2wav.parameters()).dtype == torch.float32
        assert not loaded.thinker.training
        ids = loaded.tokenizer("Hello there", return_tensors="pt")["input_ids"]
        with torch.inference_mode():
            logits = loaded.thinker(input_ids=ids).logits
        assert logits.shape == (1, ids.shape[1], Qwen25OmniRandomModelSpec.tiny().thinker_vocab)
    finally:
        import shutil

        shutil.rmtree(loaded.path, ignore_errors=True)


def test_build_random_model_matches_written_checkpoint(tiny_dir: Path) -> None:
    """In-memory and on-disk builds share the seeded initialisation."""
    from safetensors import safe_open

    loaded = tiny.build_random_model(Qwen25OmniRandomModelSpec.tiny(), device="cpu", dtype=torch.float32)
    try:
        with safe_open(tiny_dir / "model.safetensors", "pt") as f:
            stored = f.get_tensor("talker.codec_head.weight")
        assert torch.equal(loaded.talker.codec_head.weight, stored)
    finally:
        import shutil

        shutil.rmtree(loaded.path, ignore_errors=True)


def test_cli_main_writes_a_checkpoint(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert tiny.main(["--out", str(tmp_path / "cli"), "--seed", "2"]) == 0
    assert "wrote tiny random checkpoint (seed 2)" in capsys.readouterr().out
    marker = json.loads((tmp_path / "cli" / ckpt.RANDOM_MARKER_FILE).read_text())
    assert marker["spec"]["seed"] == 2
