"""Model families (pipeline/models): the interface, the registry, and a second family (tests/toy_family) served end to
end by the engine."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import numpy as np
import pytest
from toy_family import FAMILY as TOY
from toy_family import TONE_SAMPLES, tone

from pipeline.config import load_stage_config, parse_stage_config
from pipeline.engine import OmniEngine
from pipeline.errors import ConfigError
from pipeline.hosting.loaders import PretrainedCheckpoint
from pipeline.models import DEFAULT_FAMILY, FAMILIES, family_of, registered
from pipeline.models.family import ModelFamily
from pipeline.response_events import AudioChunk, ResponseDone, ResponseStatus
from tests.helpers.paths import REPO

MODELS = REPO / "pipeline" / "models"
ENGINE_MODULES = ("runners", "scheduler", "core", "engine", "hosting", "step")


def _members(cls) -> set[str]:
    return {name for name in vars(cls) if not name.startswith("_")} | set(cls.__annotations__)


@pytest.mark.parametrize("family", [family_of("qwen2_5_omni"), TOY], ids=["qwen2_5_omni", "toy"])
def test_each_family_has_every_member_of_the_protocol(family):
    assert isinstance(family, ModelFamily)
    for name in _members(ModelFamily):
        member = getattr(family, name)
        if callable(member):
            wanted = inspect.signature(getattr(ModelFamily, name))
            assert list(inspect.signature(member).parameters) == list(wanted.parameters)[1:], name
    assert {c.target for c in family.connectors.values()} == {"talker", "token2wav"}


def test_unknown_family_is_a_config_error_naming_the_known_ones():
    with pytest.raises(ConfigError, match="qwen2_5_omni") as caught:
        family_of("llama")
    assert caught.value.param == "model_family"
    with pytest.raises(ConfigError, match="model_family must be one of"):
        parse_stage_config({"model_family": "llama", "stages": {}})


def test_a_registered_family_is_known_only_inside_its_block():
    with registered(TOY):
        assert family_of("toy") is TOY
        with pytest.raises(ValueError, match="already known"), registered(TOY):
            pass
    with pytest.raises(ConfigError, match="toy"):
        family_of("toy")


def test_connectors_are_checked_against_the_config_family():
    with registered(TOY), pytest.raises(ConfigError, match="toy_text_to_talker") as caught:
        parse_stage_config(_toy_config(talker_connector="thinker_to_talker"))
    assert caught.value.param == "stages.talker.connector"


def test_the_packaged_stage_config_names_the_default_family():
    assert load_stage_config().model_family == DEFAULT_FAMILY and DEFAULT_FAMILY in FAMILIES


def test_the_token2wav_section_holds_the_engine_keys_and_the_family_keys():
    """The engine parses its own keys of ``stages.token2wav``, the family its own (``token2wav_config``): the toy
    family has none, so Qwen2.5-Omni's DiT keys are unknown to it."""
    assert family_of("qwen2_5_omni").token2wav_keys == {
        "tf32_matmul",
        "dit_dtype",
        "compile",
        "dit_attention",
        "chunking",
    }
    with registered(TOY):
        assert parse_stage_config(_toy_config()).token2wav.settings is None
        doc = _toy_config()
        doc["stages"]["token2wav"]["compile"] = "on"
        with pytest.raises(ConfigError, match="unknown field 'stages.token2wav.compile'") as caught:
            parse_stage_config(doc)
        assert "max_batch" in str(caught.value) and "chunking" not in str(caught.value)


def _toy_config(talker_connector: str = "toy_text_to_talker") -> dict:
    greedy = {"device": "cpu", "dtype": "float32", "sampling": {"do_sample": False}}
    return {
        "model_family": "toy",
        "engine": {"process": "off"},
        "stages": {
            "thinker": {"input": "request", **greedy},
            "talker": {"input": "thinker", "connector": talker_connector, "min_tokens": 9, "max_tokens": 30, **greedy},
            "token2wav": {"input": "talker", "connector": "toy_codes_to_tones", "device": "cpu"},
        },
    }


async def test_the_toy_family_serves_a_text_turn_and_a_spoken_reply(tiny_model_dir):
    with registered(TOY):
        cfg = parse_stage_config(_toy_config())
        engine = OmniEngine.from_loader(PretrainedCheckpoint(str(tiny_model_dir)), cfg, seed=3)
        try:
            assert engine.voices == ("low", "high") and engine.default_voice == "low"
            assert engine.default_instructions == TOY.default_instructions
            assert engine.transcription_prompt is TOY.transcription_prompt
            core = engine.core
            assert core.family is TOY
            conv = engine.conversation()
            await conv.add_text("u1", "Hello toy")
            rendered = core.renderer.decode(core.conversations.get(conv.id).render().token_ids)
            assert "[system]: You are a toy." in rendered and "[user]: Hello toy" in rendered
            text = await conv.respond(item_id="a1", modalities=frozenset({"text"}), max_output_tokens=5).wait()
            assert text.status in (ResponseStatus.COMPLETED, ResponseStatus.INCOMPLETE) and text.text_token_ids
            assert text.audio_samples == 0

            await conv.add_text("u2", "Now say something")
            events = [ev async for ev in conv.respond(item_id="a2", voice="high", max_output_tokens=4)]
            done = events[-1]
            assert isinstance(done, ResponseDone) and done.status is not ResponseStatus.FAILED, done.error
            assert len(done.audio_codes) >= 9
            pcm = np.concatenate([e.pcm for e in events if isinstance(e, AudioChunk)])
            expected = np.concatenate([tone(c, "high") for c in done.audio_codes])
            assert len(pcm) == done.audio_samples == TONE_SAMPLES * len(done.audio_codes)
            np.testing.assert_array_equal(pcm, expected)
            await conv.close()
        finally:
            engine.close()


def _imports(path: Path) -> list[str]:
    names = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.append(node.module)
    return names


def test_model_code_never_imports_the_engine():
    files = sorted(MODELS.rglob("*.py"))
    assert len(files) > 10 and {n.split(":")[0].split(".")[2] for n in FAMILIES.values()} <= {
        p.name for p in MODELS.iterdir()
    }
    offending = [
        f"{path.relative_to(MODELS)}: {name}"
        for path in files
        for name in _imports(path)
        if any(name == f"pipeline.{m}" or name.startswith(f"pipeline.{m}.") for m in ENGINE_MODULES)
    ]
    assert not offending, offending
