"""The stage config: one default per setting (the packaged YAML agrees with the code), ``auto`` resolved at load,
per-stage fields, and overlays (``extends``)."""

from __future__ import annotations

import dataclasses

import pytest
import yaml

from pipeline.config import (
    DEFAULT_STAGE_CONFIG,
    MAX_EXTENDS_DEPTH,
    STAGE_CLASSES,
    ConfigError,
    EngineConfig,
    SamplingConfig,
    load_stage_config,
    merge_settings,
    parse_stage_config,
)
from pipeline.models.qwen2_5_omni.token2wav_settings import Token2WavSettings


def code_default(cls, name: str):
    f = next(f for f in dataclasses.fields(cls) if f.name == name)
    return f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default


def test_every_value_the_packaged_yaml_sets_is_the_code_default() -> None:
    raw = yaml.safe_load(DEFAULT_STAGE_CONFIG.read_text())
    for name, settings in raw["stages"].items():
        for key, value in settings.items():
            own = name == "token2wav" and key in Token2WavSettings.__dataclass_fields__  # the family's keys
            default = code_default(Token2WavSettings if own else STAGE_CLASSES[name], key)
            if key == "sampling":
                value = SamplingConfig(**value)
            elif key == "chunking":
                value = {**default, **value}
            assert value == default, f"stages.{name}.{key}: the YAML says {value!r}, the code {default!r}"
    for key, value in raw.get("engine", {}).items():
        assert value == code_default(EngineConfig, key), f"engine.{key}"


def test_a_minimal_yaml_is_the_packaged_config() -> None:
    minimal = {
        "model_family": "qwen2_5_omni",
        "stages": {"thinker": {"input": "request"}, "talker": {"input": "thinker"}, "token2wav": {"input": "talker"}},
    }
    assert dataclasses.replace(parse_stage_config(minimal), source="") == dataclasses.replace(
        load_stage_config(), source=""
    )


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_auto_values_are_resolved_at_load(device: str) -> None:
    stages = {name: {"device": device} for name in ("thinker", "talker", "token2wav")}
    cfg = load_stage_config(overrides={"stages": stages})
    cuda = device == "cuda"
    assert (cfg.thinker.device, cfg.thinker.dtype) == (device, "bfloat16" if cuda else "float32")
    assert cfg.token2wav.dtype == "float32"  # the packaged precision, not auto
    assert cfg.talker.overlap is cuda and cfg.engine.process is cuda and cfg.thinker.vision_worker is cuda
    tw = cfg.token2wav
    assert (
        tw.worker_thread is cuda
        and tw.settings.compile is cuda
        and tw.settings.dit_dtype == ("bfloat16" if cuda else "float32")
    )
    assert tw.settings.dit_attention in ("triton", "sdpa") and (tw.settings.dit_attention == "sdpa" or cuda)
    assert str(cfg.thinker.torch_device) == device
    assert (cfg.thinker.torch_dtype, tw.settings.torch_dit_dtype) == (
        getattr(__import__("torch"), cfg.thinker.dtype),
        getattr(__import__("torch"), tw.settings.dit_dtype),
    )


@pytest.mark.parametrize(("given", "want"), [("on", True), ("off", False), (True, True), (False, False)])
def test_the_vision_worker_switch_reads_on_and_off(given, want) -> None:
    cfg = load_stage_config(overrides={"stages": {"thinker": {"device": "cpu", "vision_worker": given}}})
    assert cfg.thinker.vision_worker is want


def test_each_stage_refuses_another_stages_field() -> None:
    for stage, key, value in (
        ("thinker", "overlap", "on"),
        ("talker", "max_batch", 4),
        ("token2wav", "kv_slots", 2),
        ("thinker", "connector", "thinker_to_talker"),
    ):
        raw = yaml.safe_load(DEFAULT_STAGE_CONFIG.read_text())
        raw["stages"][stage][key] = value
        with pytest.raises(ConfigError) as info:
            parse_stage_config(raw)
        assert info.value.param == f"stages.{stage}.{key}"


def test_the_context_retention_ratio_is_a_fraction() -> None:
    raw = yaml.safe_load(DEFAULT_STAGE_CONFIG.read_text())
    for bad in (0, 1.5, -0.2, "0.8", True, float("nan")):
        raw["stages"]["thinker"]["context_retention_ratio"] = bad
        with pytest.raises(ConfigError, match=r"must be a number in \(0, 1\]") as info:
            parse_stage_config(raw)
        assert info.value.param == "stages.thinker.context_retention_ratio"
    raw["stages"]["thinker"]["context_retention_ratio"] = 1
    assert parse_stage_config(raw).thinker.context_retention_ratio == 1
    raw["stages"]["thinker"]["context_policy"] = "truncate"
    with pytest.raises(ConfigError, match="must be one of"):
        parse_stage_config(raw)


def test_merge_settings_merges_mappings_and_replaces_the_rest() -> None:
    base = {"a": {"b": 1, "c": [1, 2]}, "d": 1}
    assert merge_settings(base, {"a": {"c": [3]}, "e": 2}) == {"a": {"b": 1, "c": [3]}, "d": 1, "e": 2}
    assert base == {"a": {"b": 1, "c": [1, 2]}, "d": 1}  # unchanged


def test_the_bench_overlay_changes_only_its_keys() -> None:
    bench_path = DEFAULT_STAGE_CONFIG.parent / "bench_forced.yaml"
    assert yaml.safe_load(bench_path.read_text())["extends"] == "qwen2_5_omni.yaml"
    bench, packaged = load_stage_config(bench_path), load_stage_config()
    assert (bench.thinker.min_tokens, bench.thinker.max_tokens, bench.talker.min_tokens) == (
        30,
        30,
        400,
    )  # ~8 s replies
    assert (bench.thinker.kv_slots, bench.thinker.context_policy) == (64, "drop_oldest")
    assert bench.thinker.sampling == packaged.thinker.sampling and bench.token2wav == packaged.token2wav
    assert bench.talker.chain_steps == packaged.talker.chain_steps


def test_an_overlay_of_an_overlay(tmp_path) -> None:
    (tmp_path / "base.yaml").write_text(f"extends: {DEFAULT_STAGE_CONFIG}\nstages:\n  talker:\n    chain_steps: 2\n")
    (tmp_path / "top.yaml").write_text(
        "extends: base.yaml\nstages:\n  token2wav:\n    chunking:\n      chunk_frames: 96\n"
    )
    cfg = load_stage_config(tmp_path / "top.yaml")
    assert cfg.talker.chain_steps == 2 and cfg.token2wav.settings.chunking["chunk_frames"] == 96
    assert cfg.token2wav.settings.chunking["first_chunk_frames"] == 48  # the mapping merged, not replaced


def test_bad_extends_are_refused(tmp_path) -> None:
    for text, message in (
        ("extends: missing.yaml\n", "cannot read"),
        ("extends: 3\n", "extends must be"),
        ("extends: self.yaml\n", "cycle"),
    ):
        (tmp_path / "self.yaml").write_text(text)
        with pytest.raises(ConfigError, match=message) as info:
            load_stage_config(tmp_path / "self.yaml")
        assert info.value.param in ("extends", "stage_config")
    (tmp_path / "a.yaml").write_text("extends: b.yaml\n")
    (tmp_path / "b.yaml").write_text("extends: a.yaml\n")
    with pytest.raises(ConfigError, match="cycle"):
        load_stage_config(tmp_path / "a.yaml")
    for i in range(MAX_EXTENDS_DEPTH + 1):
        (tmp_path / f"d{i}.yaml").write_text(f"extends: d{i + 1}.yaml\n")
    (tmp_path / f"d{MAX_EXTENDS_DEPTH + 1}.yaml").write_text(DEFAULT_STAGE_CONFIG.read_text())
    with pytest.raises(ConfigError, match=f"more than {MAX_EXTENDS_DEPTH} files") as info:
        load_stage_config(tmp_path / "d0.yaml")
    assert info.value.param == "extends"
    with pytest.raises(ConfigError, match="unknown field 'extends'"):  # only a file can extend another
        parse_stage_config({"extends": "qwen2_5_omni.yaml"})


def test_slow_step_threshold_is_resolved_by_device_and_validated():
    from pipeline.config import SLOW_STEP_MS_CPU, SLOW_STEP_MS_CUDA

    cpu = load_stage_config(overrides={"stages": {"thinker": {"device": "cpu"}}})
    assert cpu.engine.slow_step_ms == SLOW_STEP_MS_CPU
    cuda = load_stage_config(overrides={"stages": {"thinker": {"device": "cuda"}}})
    assert cuda.engine.slow_step_ms == SLOW_STEP_MS_CUDA
    assert load_stage_config(overrides={"engine": {"slow_step_ms": 80}}).engine.slow_step_ms == 80
    for bad in (0, -5, "soon", True):
        with pytest.raises(ConfigError) as info:
            load_stage_config(overrides={"engine": {"slow_step_ms": bad}})
        assert info.value.param == "engine.slow_step_ms"
