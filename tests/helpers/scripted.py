"""The scripted test family's engine (tests/toy_family/scripted.py) as the function-calling and framework tests use
it: the tiny checkpoint's thinker replaying token scripts, the toy family's tone token2wav, greedy decoding on the
CPU, the engine core on a thread; and the token scripts of plain text and of a function call."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from toy_family.scripted import SCRIPTED

from pipeline.config import parse_stage_config
from pipeline.engine import OmniEngine
from pipeline.loaders import PretrainedCheckpoint
from pipeline.models import registered

GREEDY = {"device": "cpu", "dtype": "float32", "sampling": {"do_sample": False}}


def scripted_stage_config(*, greedy_talker: bool = True) -> dict:
    """The stage graph: talker replies of 9 to 30 codes (greedy, or sampled as packaged with ``greedy_talker``
    False)."""
    talker = {"input": "thinker", "connector": "toy_text_to_talker", "min_tokens": 9, "max_tokens": 30}
    return {
        "model_family": "scripted",
        "engine": {"process": "off"},
        "stages": {
            "thinker": {"input": "request", **GREEDY},
            "talker": talker | GREEDY if greedy_talker else talker,
            "token2wav": {"input": "talker", "connector": "toy_codes_to_tones", "device": "cpu"},
        },
    }


@contextmanager
def scripted_engine(model_dir: Path, *, greedy_talker: bool = True, seed: int = 5) -> Iterator[OmniEngine]:
    """An engine of the scripted family on ``model_dir`` (the tiny checkpoint), registered while it lives."""
    with registered(SCRIPTED):
        engine = OmniEngine.from_loader(
            PretrainedCheckpoint(str(model_dir)),
            parse_stage_config(scripted_stage_config(greedy_talker=greedy_talker)),
            seed=seed,
        )
        try:
            yield engine
        finally:
            engine.close()


def text(engine: OmniEngine, words: str) -> list[int]:
    """The token script of ``words``."""
    return engine.core.renderer.text(words)


def call(engine: OmniEngine, name: str, arguments: dict) -> list[int]:
    """The token script of a call of ``name`` with ``arguments``, in the family's function-call format."""
    return engine.core.renderer.tools.call(name, json.dumps(arguments))
