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

from pathlib import Path  # noqa: E402

import pytest  # noqa: E402


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> Path:
    """The default tiny random Qwen2.5-Omni checkpoint, built once per test session (seconds)."""
    from pipeline.models.qwen2_5_omni.tiny import make_random_checkpoint

    return make_random_checkpoint(tmp_path_factory.mktemp("tiny-omni"))


@pytest.fixture(scope="session")
def sharp_model_dir(tmp_path_factory) -> Path:
    """The tiny checkpoint with sharpened thinker attention (``Qwen25OmniRandomModelSpec.sharpened``), built once per
    session: on it a wrong position changes greedy tokens, so equivalence tests on it catch position bugs."""
    from pipeline.models.qwen2_5_omni.tiny import Qwen25OmniRandomModelSpec, make_random_checkpoint

    return make_random_checkpoint(tmp_path_factory.mktemp("sharp-omni"), Qwen25OmniRandomModelSpec.sharpened())


@pytest.fixture(scope="session")
def qwen3_model_dir(tmp_path_factory) -> Path:
    """The tiny random Qwen3-Omni checkpoint, built once per test session (seconds)."""
    from pipeline.models.qwen3_omni.tiny import make_random_checkpoint

    return make_random_checkpoint(tmp_path_factory.mktemp("tiny-qwen3-omni"))


@pytest.fixture(scope="session")
def qwen3_text_model_dir(tmp_path_factory) -> Path:
    """The tiny random Qwen3-Omni checkpoint without talker and code2wav (``enable_audio_output`` false, like the
    released -Thinking ones), built once per test session (seconds)."""
    import dataclasses

    from pipeline.models.qwen3_omni.tiny import Qwen3OmniRandomModelSpec, make_random_checkpoint

    spec = dataclasses.replace(Qwen3OmniRandomModelSpec.tiny(), enable_audio_output=False)
    return make_random_checkpoint(tmp_path_factory.mktemp("tiny-qwen3-omni-text"), spec)


@pytest.fixture(scope="session")
def qwen3_sharp_model_dir(tmp_path_factory) -> Path:
    """The tiny Qwen3-Omni checkpoint with sharpened attention: a wrong position changes its greedy tokens."""
    from pipeline.models.qwen3_omni.tiny import Qwen3OmniRandomModelSpec, make_random_checkpoint

    return make_random_checkpoint(tmp_path_factory.mktemp("sharp-qwen3-omni"), Qwen3OmniRandomModelSpec.sharpened())


def pytest_collection_finish(session) -> None:
    """Start the background tasks of the selected tests (tests/helpers/background.py)."""
    from tests.helpers.background import start_marked

    start_marked(session.config, session.items)


def pytest_sessionfinish(session) -> None:
    from tests.helpers.background import stop_all

    stop_all()


def load_script(name: str):
    """``scripts/<name>.py`` as a module (the scripts folder is not a package); registered in ``sys.modules`` so
    dataclasses resolve the module's annotations."""
    import importlib.util
    import sys

    spec = importlib.util.spec_from_file_location(
        name, Path(__file__).resolve().parent.parent / "scripts" / f"{name}.py"
    )
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def greedy_stage_config(device: str = "cpu", family: str = "qwen2_5_omni", **overrides):
    """The packaged stage graph of ``family`` on ``device`` (CPU by default) with greedy sampling in both LM stages (and
    a frame talker's residual codebooks) for equivalence tests, each stage's ``overrides`` (YAML values) merged in
    before ``auto`` values are resolved. The thinker keeps no repetition penalty; the talker keeps the reference's
    1.05."""
    from pipeline.config import PACKAGED_STAGE_CONFIGS, SamplingConfig, load_stage_config

    lm = {"device": device, "dtype": "float32"}
    stages = {
        "thinker": {**lm, "sampling": SamplingConfig(do_sample=False), **overrides.pop("thinker", {})},
        "talker": {
            **lm,
            "sampling": SamplingConfig(do_sample=False, repetition_penalty=1.05),
            **({"residual_sampling": SamplingConfig(do_sample=False)} if family == "qwen3_omni" else {}),
            **overrides.pop("talker", {}),
        },
        "token2wav": {"device": device, **overrides.pop("token2wav", {})},
    }
    engine = overrides.pop("engine", {})
    assert not overrides, overrides
    return load_stage_config(PACKAGED_STAGE_CONFIGS[family], overrides={"stages": stages, "engine": engine})


def start_spoken_reply(core, name: str, max_text_tokens: int = 4) -> list:
    """Open conversation ``name`` on an ``EngineCore`` driven by the test, add a user text and start a spoken reply
    ``r-<name>``; returns the list its events are appended to."""
    from pipeline.core.commands import AddTextCommand, OpenConversationCommand, StartResponseCommand
    from pipeline.core.response_state import ResponseSpec

    events: list = []
    core.handle(OpenConversationCommand(name, "You are a test."))
    core.handle(AddTextCommand(name, f"{name}-u", "user", f"Hello from {name}"))
    core.handle(
        StartResponseCommand(
            ResponseSpec(
                id=f"r-{name}",
                conv_id=name,
                item_id=f"{name}-a",
                audio=True,
                voice="Chelsie",
                max_text_tokens=max_text_tokens,
                sink=events.append,
            )
        )
    )
    return events


def run_spoken_reply(core, max_text_tokens: int = 6):
    """Start a spoken reply (:func:`start_spoken_reply`, conversation "a") on an ``EngineCore`` and step it to the end;
    returns its codes, its audio (float32 numpy) and (text tokens, codes, audio chunks) after every step."""
    import numpy as np

    from pipeline.response_events import AudioChunk, ResponseDone

    events = start_spoken_reply(core, "a", max_text_tokens=max_text_tokens)
    response = core.response("r-a")
    progress = []
    for _ in range(400):
        if any(isinstance(e, ResponseDone) for e in events):
            break
        core.step()
        chunks = sum(isinstance(e, AudioChunk) for e in events)
        progress.append((len(response.item.reply_ids), len(response.talker.codes), chunks))
    assert any(isinstance(e, ResponseDone) for e in events)
    audio = np.concatenate([e.pcm for e in events if isinstance(e, AudioChunk)])
    return list(response.talker.codes), audio, progress


@pytest.fixture(scope="session")
def tiny_engine(tiny_model_dir):
    """A greedy engine on the tiny checkpoint, shared by the tests of a session (each test opens
    its own conversations). Deterministic: greedy decoding, fixed token2wav noise seed."""
    from pipeline.engine import OmniEngine

    engine = OmniEngine.from_pretrained(tiny_model_dir, greedy_stage_config(talker={"max_tokens": 120}), seed=1234)
    yield engine
    engine.close()


@pytest.fixture(scope="session")
def qwen3_engine(qwen3_model_dir):
    """A greedy engine on the tiny Qwen3-Omni checkpoint, shared as :func:`tiny_engine` is; replies of at most 30
    frames, 2.4 s of audio as tiny_engine's 120 codes."""
    from pipeline.engine import OmniEngine

    cfg = greedy_stage_config(family="qwen3_omni", talker={"max_tokens": 30})
    engine = OmniEngine.from_pretrained(qwen3_model_dir, cfg, seed=1234)
    yield engine
    engine.close()


@pytest.fixture(scope="module", params=["qwen2_5", "qwen3"])
def family(request):
    """The model family a test runs on (tests/helpers/families.py): a test that asks for it, or for
    :func:`family_model_dir` or :func:`family_engine`, runs once per family. Module-scoped, so that a module's tests
    run family by family and share what they build on each."""
    from tests.helpers.families import FAMILIES

    return FAMILIES[request.param]


@pytest.fixture(scope="module")
def family_model_dir(family, request) -> Path:
    """The tiny checkpoint folder of :func:`family`."""
    from pipeline.models import checkpoint_family

    model_dir = request.getfixturevalue(family.model_dir)
    assert checkpoint_family(str(model_dir)) == family.family
    return model_dir


@pytest.fixture(scope="module")
def family_engine(family, request):
    """The shared greedy engine on :func:`family`'s tiny checkpoint (:func:`tiny_engine` or :func:`qwen3_engine`)."""
    engine = request.getfixturevalue(family.engine)
    assert (engine.cfg.model_family, engine.voices) == (family.family, family.voices)
    return engine
