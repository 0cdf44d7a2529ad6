"""``talker.catch_up_steps``: in engine steps where the thinker ran, replies whose talker needs no new text get extra
talker steps. Scheduling only: the codes and the audio are those of the engine without catch-up steps."""

from __future__ import annotations

import pytest
import torch

from pipeline.config import parse_stage_config
from pipeline.errors import ConfigError
from pipeline.outputs import AudioChunk
from pipeline.request import ResponseSpec
from conftest import greedy_stage_config

TEXT_TOKENS = 6
CODES = 40


def make_core(tiny_model_dir, catch_up: int):
    from pipeline.core import EngineCore
    from pipeline.models.qwen2_5_omni.checkpoint import load_checkpoint

    cfg = greedy_stage_config(thinker={"min_tokens": TEXT_TOKENS, "max_tokens": TEXT_TOKENS},
                              talker={"min_tokens": CODES, "max_tokens": CODES, "catch_up_steps": catch_up})
    return EngineCore(load_checkpoint(tiny_model_dir), cfg, seed=7)


def start(core, name: str, events: list) -> ResponseSpec:
    core.open_conversation(name, "You are a test.")
    core.add_text(name, f"{name}-u", "user", f"Hello from {name}")
    spec = ResponseSpec(id=f"r-{name}", conv_id=name, item_id=f"{name}-a", audio=True, voice="Chelsie",
                        max_text_tokens=TEXT_TOKENS, sink=events.append)  # fmt: skip
    core.start_response(spec)
    return spec


def run(core, steps_between: int) -> tuple[dict[str, list[int]], dict[str, int], list[int]]:
    """Reply A alone for ``steps_between`` engine steps (past its text), then B beside it. Returns each reply's
    codes, its audio samples, and A's code count after each engine step while B writes its text."""
    events_a, events_b = [], []
    start(core, "a", events_a)
    for _ in range(steps_between):
        core.step()
    a = core.responses["r-a"]
    assert a.thinker_done and not a.talker_done, "A must be past its text and still speaking"
    start(core, "b", events_b)
    b = core.responses["r-b"]
    a_codes = []
    codes = {"a": a.codes, "b": b.codes}
    while core.responses:
        core.step()
        if not b.thinker_done:
            a_codes.append(len(a.codes))
    samples = {name: sum(len(e.pcm) for e in ev if isinstance(e, AudioChunk))
               for name, ev in (("a", events_a), ("b", events_b))}  # fmt: skip
    return codes, samples, a_codes


@torch.inference_mode()
def test_a_reply_past_its_text_catches_up_while_another_writes_and_the_output_is_unchanged(tiny_model_dir):
    plain = run(make_core(tiny_model_dir, 0), steps_between=TEXT_TOKENS + 4)
    fast = run(make_core(tiny_model_dir, 2), steps_between=TEXT_TOKENS + 4)
    assert plain[0] == fast[0], "catch-up steps change when codes are made, not which"
    assert plain[1] == fast[1] and fast[1]["a"] > 0
    steps = [after - before for before, after in zip(plain[2], plain[2][1:])]
    assert steps and set(steps) <= {1}, "without catch-up: one code per engine step"
    fast_steps = [after - before for before, after in zip(fast[2], fast[2][1:])]
    assert fast_steps and max(fast_steps) == 3, "two catch-up steps: three codes per step while B writes"


def stages(**extra) -> dict:
    stages = {"thinker": {"input": "request"}, "talker": {"input": "thinker", "connector": "thinker_to_talker"},
              "token2wav": {"input": "talker", "connector": "talker_to_token2wav"}}
    for name, values in extra.items():
        stages[name] |= values
    return {"model_family": "qwen2_5_omni", "stages": stages}


def test_catch_up_steps_is_a_talker_setting():
    assert parse_stage_config(stages()).talker.catch_up_steps == 0
    assert parse_stage_config(stages(talker={"catch_up_steps": 2})).talker.catch_up_steps == 2
    with pytest.raises(ConfigError, match="catch_up_steps only applies to the talker"):
        parse_stage_config(stages(thinker={"catch_up_steps": 1}))
    for bad in (-1, 1.5, True):
        with pytest.raises(ConfigError, match="catch_up_steps must be an integer >= 0"):
            parse_stage_config(stages(talker={"catch_up_steps": bad}))
