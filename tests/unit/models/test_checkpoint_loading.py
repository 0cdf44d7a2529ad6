"""load_checkpoint: the tiny checkpoint, placement, audio token counts, and broken checkpoints."""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch

from pipeline.errors import CheckpointError, ConfigError
from pipeline.models.qwen2_5_omni import checkpoint as ckpt
from pipeline.models.qwen2_5_omni import tiny
from pipeline.models.qwen2_5_omni.tiny import Qwen25OmniRandomModelSpec


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny.make_random_checkpoint(tmp_path_factory.mktemp("tiny") / "ckpt")


@pytest.fixture(scope="module")
def loaded(tiny_dir: Path) -> ckpt.Qwen25OmniLoadedCheckpoint:
    return ckpt.load_checkpoint(tiny_dir)


def test_loads_every_part(loaded: ckpt.Qwen25OmniLoadedCheckpoint, tiny_dir: Path) -> None:
    spec = Qwen25OmniRandomModelSpec.tiny()
    assert loaded.path == tiny_dir.resolve()
    assert loaded.source == str(tiny_dir)
    assert loaded.random_weights is True
    assert loaded.thinker_hidden_size == spec.thinker_hidden
    for part in (loaded.thinker, loaded.talker, loaded.token2wav):
        assert not part.training
        assert {p.dtype for p in part.parameters()} == {torch.float32}
        assert {p.device.type for p in part.parameters()} == {"cpu"}
    assert set(loaded.speakers) == {"Chelsie", "Ethan"}
    assert loaded.default_speaker == "Chelsie"
    chelsie = loaded.speakers["Chelsie"]
    assert chelsie.cond.shape == (1, spec.speaker_dim)
    assert chelsie.bos_token == spec.speaker_bos_ids[0]
    assert loaded.feature_extractor.feature_size == 128
    assert loaded.feature_extractor.sampling_rate == 16000


def test_special_tokens_come_from_config_and_agree_with_tokenizer(loaded: ckpt.Qwen25OmniLoadedCheckpoint) -> None:
    special, tok, config = loaded.special, loaded.tokenizer, loaded.config
    for field, token in ckpt.TOKENIZER_NAMED_FIELDS.items():
        assert getattr(special, field) == tok.convert_tokens_to_ids(token)
    assert special.audio_token == config.thinker_config.audio_token_index
    assert special.tts_text_pad == config.talker_config.tts_text_pad_token_id
    assert special.codec_bos == config.talker_config.tts_codec_start_token_id
    assert special.codec_stop_ids() == (
        config.talker_config.tts_codec_end_token_id,
        config.talker_config.tts_codec_pad_token_id,
    )
    assert special.codec_mask == config.talker_config.tts_codec_mask_token_id


def test_non_random_checkpoint_is_reported_as_such(tiny_dir: Path, tmp_path: Path) -> None:
    copy = _copy(tiny_dir, tmp_path)
    (copy / ckpt.RANDOM_MARKER_FILE).unlink()
    assert ckpt.load_checkpoint(copy).random_weights is False


@pytest.mark.slow
def test_per_part_dtypes(tiny_dir: Path) -> None:
    loaded = ckpt.load_checkpoint(tiny_dir, dtypes={"thinker": torch.bfloat16, "talker": torch.bfloat16})
    assert next(loaded.thinker.parameters()).dtype == torch.bfloat16
    assert next(loaded.talker.parameters()).dtype == torch.bfloat16
    assert {p.dtype for p in loaded.token2wav.parameters()} == {torch.float32}


@pytest.mark.parametrize(
    ("kwargs", "param"),
    [
        ({"devices": {"vocoder": "cpu"}}, "devices"),
        ({"dtypes": {"token2wav": torch.bfloat16}}, "dtypes.token2wav"),
    ],
)
def test_bad_placement_arguments(tiny_dir: Path, kwargs: dict, param: str) -> None:
    with pytest.raises(ConfigError) as info:
        ckpt.load_checkpoint(tiny_dir, **kwargs)
    assert info.value.param == param


@pytest.mark.parametrize("seconds", [1.0, 2.0, 2.5, 7.0, 0.03, 0.3, 1.2345, 4.01])
def test_audio_tokens_for_samples_matches_the_audio_tower(
    loaded: ckpt.Qwen25OmniLoadedCheckpoint, seconds: float
) -> None:
    n_samples = int(round(seconds * 16000))
    audio = np.random.default_rng(0).standard_normal(n_samples).astype(np.float32) * 0.1
    # As the reference processor does: pad to the extractor's window, keep the frame mask.
    features = loaded.feature_extractor(
        audio, sampling_rate=16000, return_attention_mask=True, padding="max_length", return_tensors="pt"
    )
    with torch.inference_mode():
        out = loaded.thinker.get_audio_features(
            features["input_features"], feature_attention_mask=features["attention_mask"]
        )
    produced = out.last_hidden_state.shape[0]
    assert loaded.audio_tokens_for_samples(n_samples) == produced
    if seconds in (1.0, 2.0, 7.0):
        assert produced == int(seconds * 25)  # 25 tokens per second


def test_audio_token_arithmetic_edges() -> None:
    assert ckpt.audio_tokens_for_mel_frames(0) == 0
    assert ckpt.audio_tokens_for_mel_frames(2) == 0  # one conv output, nothing to pool with
    assert ckpt.audio_tokens_for_mel_frames(3) == 1
    assert ckpt.audio_tokens_for_mel_frames(200) == 50
    assert ckpt.mel_frames_for_samples(161, hop_length=160, max_samples=480000) == 2
    assert ckpt.mel_frames_for_samples(10**7, hop_length=160, max_samples=480000) == 3000
    with pytest.raises(ValueError):
        ckpt.mel_frames_for_samples(-1, hop_length=160, max_samples=None)


@pytest.mark.slow
def test_sharded_weights_load(tiny_dir: Path, tmp_path: Path) -> None:
    """The released checkpoints ship model-0000X-of-0000N.safetensors plus an index."""
    from transformers import Qwen2_5OmniForConditionalGeneration

    copy = _copy(tiny_dir, tmp_path)
    (copy / "model.safetensors").unlink()
    model = Qwen2_5OmniForConditionalGeneration.from_pretrained(tiny_dir)
    model.save_pretrained(copy, max_shard_size="1MB")
    assert (copy / ckpt.WEIGHTS_INDEX_FILE).is_file()
    assert len(list(copy.glob("model-*-of-*.safetensors"))) > 1
    loaded = ckpt.load_checkpoint(copy)
    original = ckpt.load_checkpoint(tiny_dir)
    assert torch.equal(loaded.talker.codec_head.weight, original.talker.codec_head.weight)


def test_config_in_the_released_format_loads(tiny_dir: Path, tmp_path: Path) -> None:
    """The released config.json predates transformers 5: `rope_theta` + `rope_scaling` (with the
    mrope sections) instead of `rope_parameters`, no `layer_types`."""
    copy = _copy(tiny_dir, tmp_path)

    def to_released_format(config: dict) -> None:
        for sub in (
            config["thinker_config"]["text_config"],
            config["talker_config"],
            config["token2wav_config"]["dit_config"],
        ):
            rope = sub.pop("rope_parameters")
            sub["rope_theta"] = rope["rope_theta"]
            if "mrope_section" in rope:
                sub["rope_scaling"] = {"mrope_section": rope["mrope_section"], "rope_type": "default"}
            sub.pop("layer_types", None)

    _edit_config(copy, to_released_format)
    loaded = ckpt.load_checkpoint(copy)
    section = loaded.config.thinker_config.text_config.rope_parameters["mrope_section"]
    assert list(section) == list(Qwen25OmniRandomModelSpec.tiny().thinker_mrope_section)


def test_hub_id_resolves_from_local_cache_only(tiny_dir: Path, tmp_path: Path, monkeypatch) -> None:
    import huggingface_hub.constants

    cache = tmp_path / "hub"
    repo = cache / "models--omni-test--tiny"
    revision = "0" * 40
    shutil.copytree(tiny_dir, repo / "snapshots" / revision)
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(revision)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(cache))
    assert ckpt.resolve_checkpoint_path("omni-test/tiny") == (repo / "snapshots" / revision).resolve()
    with pytest.raises(CheckpointError, match="not in the local Hugging Face cache") as missing:
        ckpt.resolve_checkpoint_path("omni-test/absent")
    assert "`hf download omni-test/absent`" in str(missing.value)
    hub_command = shutil.which("hf")  # the command huggingface_hub >= 1.0 installs (a dependency of transformers 5)
    if hub_command is not None:
        assert subprocess.run([hub_command, "download", "--help"], capture_output=True).returncode == 0


def test_not_a_folder_nor_hub_id(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match="no such folder"):
        ckpt.load_checkpoint(tmp_path / "missing" / "deeper")
    (tmp_path / "weights.bin").write_bytes(b"")
    with pytest.raises(CheckpointError, match="a file, not a checkpoint folder"):
        ckpt.load_checkpoint(tmp_path / "weights.bin")


# --- Broken checkpoints -------------------------------------------------------------------------
def _copy(src: Path, tmp_path: Path) -> Path:
    dst = tmp_path / "ckpt"
    shutil.copytree(src, dst)
    return dst


def _edit_config(path: Path, edit: Callable[[dict], None]) -> None:
    config = json.loads((path / "config.json").read_text())
    edit(config)
    (path / "config.json").write_text(json.dumps(config))


def _remove(name: str) -> Callable[[Path], None]:
    return lambda path: (path / name).unlink()


def _set(*keys_and_value) -> Callable[[Path], None]:
    *keys, value = keys_and_value

    def edit(config: dict) -> None:
        node = config
        for key in keys[:-1]:
            node = node[key]
        node[keys[-1]] = value

    return lambda path: _edit_config(path, edit)


def _speakers(mutate: Callable[[dict], None]) -> Callable[[Path], None]:
    def apply(path: Path) -> None:
        raw = torch.load(path / "spk_dict.pt", weights_only=True)
        mutate(raw)
        torch.save(raw, path / "spk_dict.pt")

    return apply


def _drop_tensor(path: Path) -> None:
    from safetensors.torch import load_file, save_file

    tensors = load_file(path / "model.safetensors")
    del tensors["talker.codec_head.weight"]
    save_file(tensors, path / "model.safetensors", metadata={"format": "pt"})


def _fake_shard_index(path: Path) -> None:
    (path / "model.safetensors").unlink()
    index = {"metadata": {}, "weight_map": {"thinker.lm_head.weight": "model-00001-of-00002.safetensors"}}
    (path / ckpt.WEIGHTS_INDEX_FILE).write_text(json.dumps(index))


def _rename_audio_token(path: Path) -> None:
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.json"):
        file = path / name
        file.write_text(file.read_text().replace("<|AUDIO|>", "<|SOUND|>"))


def _narrow_cond(raw: dict) -> None:
    raw["Ethan"]["cond"] = torch.zeros(1, 8)


def _same_bos(raw: dict) -> None:
    raw["Ethan"]["bos_token"] = raw["Chelsie"]["bos_token"]


BROKEN = {
    "no config": (_remove("config.json"), "config.json"),
    "config not json": (lambda p: (p / "config.json").write_text("{"), "config.json"),
    "wrong model type": (_set("model_type", "qwen2_audio"), "model_type"),
    "no audio output": (_set("enable_audio_output", False), "enable_audio_output"),
    "audio width": (_set("thinker_config", "audio_config", "output_dim", 32), "audio_config.output_dim=32"),
    "talker embedding": (_set("talker_config", "embedding_size", 32), "embedding_size"),
    "mel dims": (_set("token2wav_config", "bigvgan_config", "mel_dim", 64), "mel"),
    "no weights": (_remove("model.safetensors"), "model.safetensors"),
    "missing shard": (_fake_shard_index, "model-00001-of-00002.safetensors"),
    "missing tensor": (_drop_tensor, "talker.codec_head.weight"),
    "no speakers": (_remove("spk_dict.pt"), "spk_dict.pt"),
    "speaker cond width": (_speakers(_narrow_cond), "enc_emb_dim"),
    "speaker bos clash": (_speakers(_same_bos), "distinct bos_token"),
    "no tokenizer": (
        lambda p: [(p / n).unlink() for n in ("tokenizer.json", "tokenizer_config.json", "vocab.json")],
        "tokenizer",
    ),
    "tokenizer lacks a marker": (_rename_audio_token, "<|AUDIO|> is missing"),
    "marker id differs from tokenizer": (_set("thinker_config", "audio_token_index", 600), "tokenizer's id"),
    "codec id outside talker vocab": (_set("talker_config", "tts_codec_end_token_id", 4096), "codec_eos"),
    "tts text id outside thinker vocab": (_set("talker_config", "tts_text_pad_token_id", 5000), "tts_text_pad"),
    "no preprocessor": (_remove("preprocessor_config.json"), "preprocessor_config.json"),
    "mel bins differ": (lambda p: _edit_json(p / "preprocessor_config.json", feature_size=80), "num_mel_bins"),
    "bad marker file": (lambda p: (p / ckpt.RANDOM_MARKER_FILE).write_text("[]"), ckpt.RANDOM_MARKER_FILE),
}


def _edit_json(file: Path, **changes) -> None:
    data = json.loads(file.read_text())
    data.update(changes)
    file.write_text(json.dumps(data))


@pytest.mark.parametrize("case", sorted(BROKEN))
def test_broken_checkpoint_raises_checkpoint_error(tiny_dir: Path, tmp_path: Path, case: str) -> None:
    breaker, needle = BROKEN[case]
    copy = _copy(tiny_dir, tmp_path)
    breaker(copy)
    with pytest.raises(CheckpointError) as info:
        ckpt.load_checkpoint(copy)
    assert needle in str(info.value), str(info.value)
    assert info.value.code == "invalid_checkpoint"
