"""The engine gives a reply the quick first chunk (``chunking.quick_first_chunk_frames``) only while token2wav has at
most ``quick_first_chunk_max_open`` other replies' audio to make; the others start with the packaged first chunk."""

from __future__ import annotations

import pytest
import torch

from conftest import greedy_stage_config, start_spoken_reply
from pipeline.config import load_stage_config
from pipeline.response_events import AudioChunk

pytestmark = pytest.mark.slow

HOP = 240
"""24 kHz samples per mel frame."""


def make_core(tiny_model_dir, **chunking):
    from pipeline.core.engine_core import EngineCore
    from pipeline.models.qwen2_5_omni.checkpoint import load_checkpoint

    packaged = load_stage_config().token2wav.settings.chunking
    cfg = greedy_stage_config(
        thinker={"min_tokens": 4, "max_tokens": 4},
        talker={"min_tokens": 60, "max_tokens": 60},
        token2wav={"chunking": packaged | chunking},
    )
    return EngineCore(load_checkpoint(tiny_model_dir), cfg, seed=3)


def start(core, name: str) -> list:
    return start_spoken_reply(core, name)


def first_chunk(events: list) -> AudioChunk:
    return next(e for e in events if isinstance(e, AudioChunk))


@torch.inference_mode()
def test_only_a_reply_that_finds_token2wav_idle_gets_the_quick_first_chunk(tiny_model_dir):
    core = make_core(tiny_model_dir, quick_first_chunk_frames=24, quick_first_chunk_max_open=0)
    alone = start(core, "a")
    while core.response("r-a").audio.stream is None:
        core.step()
    beside = start(core, "b")  # its talker starts while a's audio is still being made
    while core.stats().responses:
        core.step()
    quick, packaged = first_chunk(alone), first_chunk(beside)
    assert (len(quick.pcm), quick.codec_tokens_so_far) == (24 * HOP, 24), "240 ms of audio after 24 codes"
    assert (len(packaged.pcm), packaged.codec_tokens_so_far) == (48 * HOP, 36), "the packaged 480 ms after 36"
    again = start(core, "c")  # token2wav idle again
    while core.stats().responses:
        core.step()
    assert first_chunk(again).codec_tokens_so_far == 24
    assert sum(len(e.pcm) for e in alone if isinstance(e, AudioChunk)) == 60 * 2 * HOP, "every frame once"


@torch.inference_mode()
def test_without_the_setting_every_reply_starts_with_the_packaged_first_chunk(tiny_model_dir):
    assert load_stage_config().token2wav.settings.chunking["quick_first_chunk_frames"] == 24, (
        "the packaged config has it"
    )
    core = make_core(tiny_model_dir, quick_first_chunk_frames=None)
    events = start(core, "a")
    while core.stats().responses:
        core.step()
    assert first_chunk(events).codec_tokens_so_far == 36
