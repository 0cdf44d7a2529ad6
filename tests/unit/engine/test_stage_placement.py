"""Stage placement in the stage config: a stage's ``device`` is checked for its form when the config is read, and
against the host's devices before any weight is loaded (:func:`pipeline.config.check_devices`); the split examples
load as documented. Runs on the CPU: the host's CUDA devices are simulated where a test needs some (the GPU run of a
split engine is tests/gpu/test_split_stages_gpu.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from pipeline.config import check_devices, load_stage_config
from pipeline.errors import ConfigError

CONFIGS = Path(__file__).resolve().parents[3] / "pipeline" / "stage_configs"


def placed(**devices: str):
    return load_stage_config(overrides={"stages": {name: {"device": d} for name, d in devices.items()}})


def fake_gpus(monkeypatch, count: int) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: count > 0)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: count)


@pytest.mark.parametrize("device", ["gpu", "cuda:", "cuda:-1", "cuda:x", "cuda:0:1", "mps", "CUDA", " cuda", 1])
def test_a_malformed_device_is_refused_naming_its_field(device) -> None:
    with pytest.raises(ConfigError, match=r"stages\.talker\.device must be auto, cpu, cuda or cuda:N") as err:
        placed(talker=device)
    assert err.value.param == "stages.talker.device"


def test_a_device_past_the_host_s_count_is_refused_naming_its_field(monkeypatch) -> None:
    cfg = placed(thinker="cuda:0", talker="cuda:1", token2wav="cuda:3")
    fake_gpus(monkeypatch, 2)
    with pytest.raises(ConfigError, match=r"'cuda:3', but this host has 2 CUDA devices \(cuda:0 to cuda:1\)") as err:
        check_devices(cfg)
    assert err.value.param == "stages.token2wav.device"
    check_devices(placed(thinker="cuda:0", talker="cuda:1", token2wav="cuda:1"))
    check_devices(placed(thinker="cuda", talker="cuda", token2wav="cpu"))


def test_one_gpu_host_names_its_only_device(monkeypatch) -> None:
    fake_gpus(monkeypatch, 1)
    with pytest.raises(ConfigError, match=r"stages\.talker\.device is 'cuda:1', but this host has 1 CUDA device \("):
        check_devices(placed(thinker="cuda:0", talker="cuda:1", token2wav="cuda:0"))


def test_cuda_without_a_cuda_device_is_refused(monkeypatch) -> None:
    cfg = placed(thinker="cuda", talker="cuda", token2wav="cuda")
    fake_gpus(monkeypatch, 0)
    with pytest.raises(ConfigError, match=r"stages\.thinker\.device is 'cuda', but torch sees no CUDA device") as err:
        check_devices(cfg)
    assert err.value.param == "stages.thinker.device"
    check_devices(placed(thinker="cpu", talker="cpu", token2wav="cpu"))


def test_the_stages_devices_each_once_in_stage_order() -> None:
    assert placed(thinker="cpu", talker="cpu", token2wav="cpu").devices == ("cpu",)
    assert placed(thinker="cuda:1", talker="cuda:0", token2wav="cuda:1").devices == ("cuda:1", "cuda:0")


@pytest.mark.parametrize(
    ("name", "talker", "kv_slots"),
    [
        ("qwen2_5_omni_split", "cuda:0", "auto"),  # the packaged setting, resolved at load
        ("bench_split_token2wav", "cuda:0", 64),
        ("bench_split_talker", "cuda:1", 64),
    ],
)
def test_the_split_examples_place_token2wav_on_the_second_gpu(name, talker, kv_slots) -> None:
    cfg = load_stage_config(CONFIGS / f"{name}.yaml")
    assert (cfg.thinker.device, cfg.talker.device, cfg.token2wav.device) == ("cuda:0", talker, "cuda:1")
    assert cfg.thinker.kv_slots == kv_slots  # the bench files keep the bench's workload (bench_forced.yaml)
    assert cfg.talker.overlap and cfg.token2wav.worker_thread and cfg.engine.process  # resolved for CUDA stages


def test_loaders_check_the_devices_before_building_anything(monkeypatch) -> None:
    from pipeline.hosting.loaders import PretrainedCheckpoint, RandomCheckpoint
    from pipeline.models.qwen2_5_omni.tiny import Qwen25OmniRandomModelSpec

    fake_gpus(monkeypatch, 2)
    cfg = placed(thinker="cuda:0", talker="cuda:0", token2wav="cuda:2")
    for loader in (RandomCheckpoint(Qwen25OmniRandomModelSpec.tiny()), PretrainedCheckpoint("/nonexistent/checkpoint")):
        with pytest.raises(ConfigError, match=r"stages\.token2wav\.device is 'cuda:2'"):
            loader.load(cfg)


def test_the_bench_refuses_device_over_a_split_config() -> None:
    from realtime.bench.models import BenchConfigError, bench_stage_config

    with pytest.raises(BenchConfigError, match="the stage config places them on cuda:0, cuda:1: leave --device out"):
        bench_stage_config(CONFIGS / "bench_split_token2wav.yaml", device="cuda", length=None)
    cfg = bench_stage_config(CONFIGS / "bench_split_token2wav.yaml", device=None, length=None)
    assert cfg.devices == ("cuda:0", "cuda:1")
    assert bench_stage_config(None, device="cpu", length=None).devices == ("cpu",)


def test_preflight_names_the_missing_device(tmp_path, monkeypatch) -> None:
    from realtime.cli.preflight import UsageError, check_stage_config

    fake_gpus(monkeypatch, 1)
    with pytest.raises(UsageError, match=r"--stage-config: stages\.token2wav\.device is 'cuda:1', but this host has 1"):
        check_stage_config(CONFIGS / "qwen2_5_omni_split.yaml")
