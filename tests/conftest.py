"""Shared fixtures. torch runs on one thread: on 2 shared cores OpenMP spinning makes it ~100x slower."""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("MKL_NUM_THREADS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402

torch.set_num_threads(1)
torch.set_num_interop_threads(1)

from dataclasses import replace  # noqa: E402
from pathlib import Path  # noqa: E402

import pytest  # noqa: E402


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> Path:
    """The default tiny random Qwen2.5-Omni checkpoint, built once per test session (seconds)."""
    from pipeline.models.qwen2_5_omni.tiny import make_random_checkpoint

    return make_random_checkpoint(tmp_path_factory.mktemp("tiny-omni"))


def load_script(name: str):
    """``scripts/<name>.py`` as a module (the scripts folder is not a package); registered in ``sys.modules`` so
    dataclasses resolve the module's annotations."""
    import importlib.util
    import sys

    spec = importlib.util.spec_from_file_location(name, Path(__file__).resolve().parent.parent / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def greedy_stage_config(**overrides):
    """The packaged stage graph on CPU with greedy sampling in both LM stages (for equivalence tests).
    The thinker keeps no repetition penalty; the talker keeps the reference's 1.05."""
    from pipeline.config import SamplingConfig, load_stage_config

    cfg = load_stage_config()
    thinker = replace(cfg.thinker, device="cpu", dtype="float32", sampling=SamplingConfig(do_sample=False),
                      **overrides.pop("thinker", {}))
    talker = replace(cfg.talker, device="cpu", dtype="float32",
                     sampling=SamplingConfig(do_sample=False, repetition_penalty=1.05), **overrides.pop("talker", {}))
    token2wav = replace(cfg.token2wav, device="cpu", **overrides.pop("token2wav", {}))
    assert not overrides, overrides
    return replace(cfg, thinker=thinker, talker=talker, token2wav=token2wav)


@pytest.fixture(scope="session")
def tiny_engine(tiny_model_dir):
    """A greedy engine on the tiny checkpoint, shared by the tests of a session (each test opens
    its own conversations). Deterministic: greedy decoding, fixed token2wav noise seed."""
    from pipeline.engine import OmniEngine

    engine = OmniEngine.from_pretrained(tiny_model_dir, greedy_stage_config(talker={"max_tokens": 120}), seed=1234)
    yield engine
    engine.close()
