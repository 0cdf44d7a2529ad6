"""While the token2wav worker makes the first chunk of every reply still talking, the talker does not step (nothing
else needs the device, and its steps would slow that chunk), nor the thinker of a reply still writing its text; with
any other reply decoding, everyone steps."""

from __future__ import annotations

import threading
import time

import pytest
import torch

from conftest import greedy_stage_config, start_spoken_reply
from pipeline.response_events import AudioChunk

pytestmark = pytest.mark.slow


def make_core(tiny_model_dir, text_tokens: int = 4):
    from pipeline.core.engine_core import EngineCore
    from pipeline.models.qwen2_5_omni.checkpoint import load_checkpoint

    cfg = greedy_stage_config(
        thinker={"min_tokens": text_tokens, "max_tokens": text_tokens},
        talker={"min_tokens": 60, "max_tokens": 60},
        token2wav={"worker_thread": "on"},
    )
    core = EngineCore(load_checkpoint(tiny_model_dir), cfg, seed=5)
    assert core.runner.worker is not None
    return core


def hold_jobs(core) -> threading.Event:
    """Make the worker's jobs wait for the returned event (so the test decides when a chunk is done)."""
    release = threading.Event()
    run = core.runner.worker._run

    def held(*args):
        release.wait(30)
        return run(*args)

    core.runner.worker._run = held
    return release


def start(core, name: str, text_tokens: int = 4) -> list:
    return start_spoken_reply(core, name, max_text_tokens=text_tokens)


def until_first_chunk_submitted(core, name: str) -> None:
    r = core.response(f"r-{name}")
    for _ in range(500):
        if r.audio.stream is not None and core.runner.worker.busy_with(r.audio.stream):
            return
        core.step()
    raise AssertionError("no first-chunk job")


def beside_a_second_reply(core, text_tokens: int = 4):
    """Reply "a" gets its first-chunk job in the worker, then reply "b" starts its talker; returns both states."""
    start(core, "a", text_tokens=text_tokens)
    until_first_chunk_submitted(core, "a")
    start(core, "b", text_tokens=text_tokens)
    a, b = core.response("r-a"), core.response("r-b")
    while not b.talker.started:
        core.step()
    return a, b


def until_first_audio(core, events: list) -> None:
    deadline = time.monotonic() + 60
    while not any(isinstance(e, AudioChunk) for e in events):
        assert time.monotonic() < deadline, "the first chunk never came"
        if not core.step():
            time.sleep(0.005)  # the engine's loop would wait for the worker's wake-up


@torch.inference_mode()
def test_a_lone_reply_talks_again_once_its_first_chunk_is_out(tiny_model_dir):
    core = make_core(tiny_model_dir)
    try:
        release = hold_jobs(core)
        events = start(core, "a")
        until_first_chunk_submitted(core, "a")
        codes = core.stats().talker_tokens_total
        for _ in range(5):
            assert core.step() is False, "nothing to do but wait for the chunk"
        assert core.stats().talker_tokens_total == codes
        release.set()
        until_first_audio(core, events)
        for _ in range(3):
            core.step()
        assert core.stats().talker_tokens_total > codes, "the talker resumes after the first chunk"
    finally:
        release.set()
        core.close()


@torch.inference_mode()
def test_a_reply_still_writing_waits_for_its_first_chunk_too(tiny_model_dir):
    core = make_core(tiny_model_dir, text_tokens=50)
    try:
        release = hold_jobs(core)
        events = start(core, "a", text_tokens=50)
        until_first_chunk_submitted(core, "a")
        a = core.response("r-a")
        assert not a.thinker.done, "the text goes on past the first chunk's codes"
        progress = len(a.item.reply_ids), core.stats().talker_tokens_total, core.stats().decode_steps_total
        for _ in range(5):
            assert core.step() is False
        assert (len(a.item.reply_ids), core.stats().talker_tokens_total, core.stats().decode_steps_total) == progress, (
            "neither the thinker nor the talker stepped"
        )
        release.set()
        until_first_audio(core, events)
        core.step()
        assert len(a.item.reply_ids) > progress[0], "the text resumes after the first chunk"
    finally:
        release.set()
        core.close()


@pytest.mark.parametrize("text_tokens", [4, 50])
@torch.inference_mode()
def test_with_another_reply_decoding_everyone_steps(tiny_model_dir, text_tokens):
    """Beside reply "b", reply "a" waiting for its first chunk keeps stepping: its talker, and (50 tokens) its thinker
    still writing."""
    core = make_core(tiny_model_dir, text_tokens=text_tokens)
    try:
        release = hold_jobs(core)
        a, b = beside_a_second_reply(core, text_tokens=text_tokens)
        before = len(a.talker.codes), len(b.talker.codes), len(a.item.reply_ids)
        core.step()
        assert (len(a.talker.codes), len(b.talker.codes)) == (before[0] + 1, before[1] + 1)
        if text_tokens == 50:
            assert len(a.item.reply_ids) == before[2] + 1, "the thinker of a reply still writing steps"
    finally:
        release.set()
        core.close()
