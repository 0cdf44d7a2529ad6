"""The scripted test families' engines (tests/toy_family/scripted.py) as the function-calling and framework tests use
them: a tiny checkpoint's thinker replaying token scripts, greedy decoding on the CPU, the engine core on a thread; and
the token scripts of plain text and of a function call. A tiny Qwen2.5-Omni checkpoint gets the toy family's tone
token2wav (:data:`~toy_family.scripted.SCRIPTED`), a tiny Qwen3-Omni one its own talker and code2wav
(:data:`~toy_family.scripted.SCRIPTED_QWEN3`)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from toy_family.scripted import SCRIPTED, SCRIPTED_QWEN3, ScriptedThinker

from pipeline.config import PACKAGED_STAGE_CONFIGS, StageGraphConfig, load_stage_config, parse_stage_config
from pipeline.engine import OmniEngine
from pipeline.hosting.loaders import PretrainedCheckpoint
from pipeline.models import checkpoint_family, family_of, registered
from realtime.voices import DEFAULT_VOICE_ALIASES, OPENAI_VOICES, usable_aliases

GREEDY = {"device": "cpu", "dtype": "float32", "sampling": {"do_sample": False}}
SCRIPTED_FOR = {"qwen2_5_omni": SCRIPTED, "qwen3_omni": SCRIPTED_QWEN3}
"""The scripted family that serves a checkpoint of each family."""


def scripted_stage_config(scripted: ScriptedThinker, *, greedy_talker: bool = True) -> StageGraphConfig:
    """The stage graph of ``scripted`` (registered): talker replies of about 0.2 to 0.6 s of audio (9 to 30 tones of
    20 ms; 3 to 8 Qwen3-Omni frames of 80 ms), greedy, or sampled as packaged with ``greedy_talker`` False."""
    if scripted is SCRIPTED_QWEN3:
        talker = {"min_tokens": 3, "max_tokens": 8, "device": "cpu", "dtype": "float32"}
        if greedy_talker:
            talker |= {"sampling": {"do_sample": False}, "residual_sampling": {"do_sample": False}}
        overrides = {
            "model_family": scripted.name,
            "engine": {"process": "off"},
            "stages": {"thinker": GREEDY, "talker": talker, "token2wav": {"device": "cpu"}},
        }
        return load_stage_config(PACKAGED_STAGE_CONFIGS["qwen3_omni"], overrides=overrides)
    talker = {"input": "thinker", "connector": "toy_text_to_talker", "min_tokens": 9, "max_tokens": 30}
    return parse_stage_config(
        {
            "model_family": scripted.name,
            "engine": {"process": "off"},
            "stages": {
                "thinker": {"input": "request", **GREEDY},
                "talker": talker | GREEDY if greedy_talker else talker,
                "token2wav": {"input": "talker", "connector": "toy_codes_to_tones", "device": "cpu"},
            },
        }
    )


@contextmanager
def scripted_engine(model_dir: Path, *, greedy_talker: bool = True, seed: int = 5) -> Iterator[OmniEngine]:
    """An engine of the scripted family of ``model_dir``'s family (a tiny checkpoint), registered while it lives;
    :func:`scripted_family` gives the family that plays its scripts."""
    scripted = SCRIPTED_FOR[checkpoint_family(str(model_dir))]
    with registered(scripted):
        engine = OmniEngine.from_loader(
            PretrainedCheckpoint(str(model_dir)),
            scripted_stage_config(scripted, greedy_talker=greedy_talker),
            seed=seed,
        )
        try:
            yield engine
        finally:
            engine.close()


def scripted_family(engine: OmniEngine) -> ScriptedThinker:
    """The scripted family of ``engine`` (one of :func:`scripted_engine`'s), which plays its scripts."""
    family = family_of(engine.cfg.model_family)
    assert isinstance(family, ScriptedThinker), family
    return family


def openai_voice_aliases(engine: OmniEngine) -> tuple[tuple[str, str], ...]:
    """The server's voice aliases (``ServerConfig.voice_aliases``) that let a client ask ``engine`` for OpenAI's voice
    names, as a deployment would set them: the server's default table where it names the checkpoint's speakers
    (Qwen3-Omni's), else every OpenAI voice onto the engine's default speaker (the toy's ``low``)."""
    usable, _ = usable_aliases(DEFAULT_VOICE_ALIASES, tuple(engine.voices))
    if usable:
        return DEFAULT_VOICE_ALIASES
    return tuple((name, engine.default_voice) for name in OPENAI_VOICES)


def text(engine: OmniEngine, words: str) -> list[int]:
    """The token script of ``words``."""
    return engine.core.renderer.text(words)


def call(engine: OmniEngine, name: str, arguments: dict) -> list[int]:
    """The token script of a call of ``name`` with ``arguments``, in the family's function-call format."""
    return engine.core.renderer.tools.call(name, json.dumps(arguments))
