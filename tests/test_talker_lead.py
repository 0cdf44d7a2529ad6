"""``talker.max_codes_ahead``: a reply's talker waits while its token2wav stream holds that many codes past what its
next chunk needs. Same codes, same audio (chunk boundaries depend on the chunk index only); the talker only steps
later, and it never runs ahead of the bound by more than one step's codes."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import yaml
from conftest import greedy_stage_config, run_spoken_reply

from pipeline.config import DEFAULT_STAGE_CONFIG, ConfigError, parse_stage_config


def make_core(tiny_model_dir, max_codes_ahead: int | None):
    from pipeline.core import EngineCore
    from pipeline.models.qwen2_5_omni.checkpoint import load_checkpoint

    cfg = greedy_stage_config(thinker={"min_tokens": 6, "max_tokens": 6},
                              talker={"min_tokens": 80, "max_tokens": 80, "max_codes_ahead": max_codes_ahead},
                              token2wav={"worker_thread": "off", "compile": "off"})  # fmt: skip
    return EngineCore(load_checkpoint(tiny_model_dir), cfg, seed=7)


def with_slow_token2wav(core, every: int = 6) -> list[int | None]:
    """Let token2wav make a chunk only every ``every`` engine steps (as a busy worker would); returns the list that
    records, after each step, how many codes the reply's stream holds past its next chunk's."""
    from pipeline.core import EngineCore

    steps, ahead = [0], []
    original_step = core.step

    def job(ready):
        return EngineCore._token2wav_job(core, ready) if steps[0] % every == 0 else ([], None)

    def step():
        steps[0] += 1
        progressed = original_step()
        r = core.responses.get("r-a")
        ahead.append(r.t2w.codes_ahead() if r is not None and r.t2w is not None else None)
        return progressed

    core._token2wav_job, core.step = job, step
    return ahead


@torch.inference_mode()
def test_the_talker_waits_past_the_bound_and_makes_the_same_codes_and_audio(tiny_model_dir) -> None:
    free, bound = make_core(tiny_model_dir, None), make_core(tiny_model_dir, 4)
    ahead_free, ahead_bound = with_slow_token2wav(free, 40), with_slow_token2wav(bound, 40)
    codes_free, audio_free, progress_free = run_spoken_reply(free)
    codes_bound, audio_bound, progress_bound = run_spoken_reply(bound)
    assert len(codes_bound) == 80 and codes_bound == codes_free
    np.testing.assert_array_equal(audio_bound, audio_free)
    assert max(a for a in ahead_free if a is not None) > 10  # unbounded, the talker runs far ahead of token2wav
    # one step past the bound at most (the step that reached it); a chain could add more, but steps here are single
    assert max(a for a in ahead_bound if a is not None) <= 4 + 1
    # the talker skipped steps: some steps made no code while the reply was still talking, none without the bound
    def waits(progress):
        return [b for b, a in zip(progress, progress[1:]) if a[1] == b[1] and 0 < b[1] < 80]

    assert waits(progress_bound) and not waits(progress_free)


def test_max_codes_ahead_is_a_positive_talker_integer_off_by_default() -> None:
    raw = yaml.safe_load(DEFAULT_STAGE_CONFIG.read_text())
    assert parse_stage_config(raw).talker.max_codes_ahead is None
    raw["stages"]["talker"]["max_codes_ahead"] = 50
    assert parse_stage_config(raw).talker.max_codes_ahead == 50
    raw["stages"]["talker"]["max_codes_ahead"] = 0
    with pytest.raises(ConfigError, match="talker.max_codes_ahead must be a positive integer"):
        parse_stage_config(raw)
    raw["stages"]["talker"]["max_codes_ahead"] = None
    raw["stages"]["token2wav"]["max_codes_ahead"] = 50
    with pytest.raises(ConfigError, match="token2wav.max_codes_ahead only applies to talker"):
        parse_stage_config(raw)
