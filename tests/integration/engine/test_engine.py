"""Engine behaviour: cancellation, errors, multi-turn state."""

from __future__ import annotations

import asyncio
import logging
import shutil
import time

import numpy as np
import pytest

from conftest import greedy_stage_config
from pipeline.engine import OmniEngine, validate_pcm
from pipeline.errors import (
    CheckpointError,
    ContextLimitError,
    EmptyInputError,
    InvalidAudioError,
    ResponseActiveError,
    UnknownItemError,
    UnknownVoiceError,
)
from pipeline.response_events import AudioChunk, ResponseDone, ResponseStatus


async def test_cancel_mid_response_stops_every_stage_and_next_response_works(tiny_engine):
    conv = tiny_engine.conversation()
    await conv.add_text("u1", "Talk to me.")
    resp = conv.respond(item_id="a1", max_output_tokens=12)
    events = []
    async for ev in resp:
        events.append(ev)
        if isinstance(ev, AudioChunk):
            resp.cancel("turn_detected")
            break
    rest = [ev async for ev in resp]
    done = rest[-1]
    assert isinstance(done, ResponseDone) and done.status is ResponseStatus.CANCELLED
    assert done.reason == "turn_detected"
    # nothing but what the engine had already queued before the cancel landed; then done
    core = tiny_engine.core
    assert core.response(resp.id) is None
    assert core.conversations.get(conv.id).active_response is None
    # the partial reply stays in history; a new response works
    second = await conv.respond(item_id="a2", max_output_tokens=4).wait()
    assert second.status in (ResponseStatus.COMPLETED, ResponseStatus.INCOMPLETE)
    assert second.usage.cached_tokens > 0, "history was not prefilled again"
    await conv.close()


async def test_cancel_before_first_step(tiny_engine):
    conv = tiny_engine.conversation()
    await conv.add_text("u1", "Hi")
    resp = conv.respond(item_id="a1")
    resp.cancel()
    done = await resp.wait()
    assert done.status is ResponseStatus.CANCELLED and done.reason == "client_cancelled"
    await conv.close()


async def test_consumer_task_cancellation_cancels_the_response(tiny_engine):
    import asyncio

    conv = tiny_engine.conversation()
    await conv.add_text("u1", "Hi")
    resp = conv.respond(item_id="a1", max_output_tokens=12)

    async def consume():
        async for _ in resp:
            await asyncio.sleep(0)

    task = asyncio.create_task(consume())
    await asyncio.sleep(0.05)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    done = await resp.wait()
    assert done.status in (ResponseStatus.CANCELLED, ResponseStatus.COMPLETED, ResponseStatus.INCOMPLETE)
    assert tiny_engine.core.response(resp.id) is None
    await conv.close()


async def test_text_only_modality_has_no_audio(tiny_engine):
    conv = tiny_engine.conversation()
    await conv.add_text("u1", "Hi")
    events = [ev async for ev in conv.respond(item_id="a1", modalities=frozenset({"text"}), max_output_tokens=5)]
    assert not any(isinstance(e, AudioChunk) for e in events)
    assert events[-1].usage.output_audio_tokens == 0
    assert events[-1].status is ResponseStatus.INCOMPLETE or events[-1].text_token_ids
    await conv.close()


async def test_timings_place_the_response_on_the_host_clock(tiny_engine):
    conv = tiny_engine.conversation()
    await conv.add_text("u1", "Hi")
    before = time.monotonic()
    done = await conv.respond(item_id="a1", max_output_tokens=6).wait()
    after = time.monotonic()
    t = done.timings
    assert before <= t.started_at_s <= after  # time.monotonic(): comparable with the caller's clock
    assert 0 < t.prefill_done_ms <= t.token2wav_first_chunk_ms <= 1000 * (after - t.started_at_s)
    # the first chunk's codes are in, then its token2wav job starts, then its audio leaves
    assert t.talker_first_code_ms <= t.talker_first_chunk_ms <= t.token2wav_first_job_ms <= t.token2wav_first_chunk_ms
    await conv.close()


async def test_slow_engine_requests_are_logged(tiny_engine, monkeypatch, caplog):
    import pipeline.hosting.loop

    caplog.set_level(logging.INFO, logger="pipeline.hosting.loop")
    conv = tiny_engine.conversation()
    await conv.add_text("u0", "Hi")
    assert "slow engine request" not in caplog.text  # far below the threshold
    monkeypatch.setattr(pipeline.hosting.loop, "SLOW_REQUEST_MS", -1.0)
    await conv.add_text("u1", "Hi")
    assert "slow engine request: AddTextCommand took" in caplog.text
    await conv.close()


async def test_max_output_tokens_gives_incomplete(tiny_engine):
    conv = tiny_engine.conversation()
    await conv.add_text("u1", "Say a lot")
    done = await conv.respond(item_id="a1", modalities=frozenset({"text"}), max_output_tokens=1).wait()
    if done.text_token_ids:  # the tiny model may end its turn at once; then the reply is complete
        assert done.status is ResponseStatus.INCOMPLETE and done.reason == "max_output_tokens"
        assert len(done.text_token_ids) == 1
    await conv.close()


async def test_multi_turn_reuses_history_cache(tiny_engine):
    conv = tiny_engine.conversation()
    await conv.add_text("u1", "First question")
    first = await conv.respond(item_id="a1", modalities=frozenset({"text"}), max_output_tokens=4).wait()
    await conv.add_text("u2", "Second question")
    second = await conv.respond(item_id="a2", modalities=frozenset({"text"}), max_output_tokens=4).wait()
    assert second.usage.cached_tokens >= first.usage.input_tokens
    await conv.close()


async def test_unknown_voice(tiny_engine):
    conv = tiny_engine.conversation()
    await conv.add_text("u1", "Hi")
    with pytest.raises(UnknownVoiceError) as err:
        conv.respond(item_id="a1", voice="Nobody")
    assert "Chelsie" in str(err.value) and err.value.param == "voice"
    await conv.close()


async def test_empty_inputs(tiny_engine):
    conv = tiny_engine.conversation()
    with pytest.raises(EmptyInputError):
        await conv.add_text("u1", "   ")
    # with no user input the reply answers the instructions alone (a greeting)
    greeting = await conv.respond(item_id="a0", modalities=frozenset({"text"}), max_output_tokens=2).wait()
    assert greeting.status is not ResponseStatus.FAILED and greeting.text_token_ids, greeting.error
    await conv.add_text("u1", "Now something")
    ok = await conv.respond(item_id="a1", modalities=frozenset({"text"}), max_output_tokens=2).wait()
    assert ok.status is not ResponseStatus.FAILED
    assert ok.usage.cached_tokens >= greeting.usage.input_tokens, "the greeting stays in the cached history"
    await conv.close()


@pytest.mark.parametrize(
    "pcm, message",
    [
        (np.zeros(1600, np.int16), "float32"),
        (np.zeros((2, 1600), np.float32), "mono"),
        (np.array([0.0, np.nan] * 800, np.float32), "NaN"),
        (np.zeros(0, np.float32), "empty"),
    ],
)
async def test_malformed_audio(tiny_engine, pcm, message):
    conv = tiny_engine.conversation()
    with pytest.raises(InvalidAudioError, match=message):
        await conv.add_audio("u1", pcm)
    await conv.close()


def test_wrong_sample_rate():
    with pytest.raises(InvalidAudioError, match="16000 Hz"):
        validate_pcm(np.zeros(100, np.float32), sample_rate=24000)


async def test_too_short_audio_is_refused_not_crashing(tiny_engine):
    conv = tiny_engine.conversation()
    with pytest.raises(InvalidAudioError, match="too short"):
        await conv.add_audio("u1", np.zeros(100, np.float32))
    await conv.close()


async def test_context_limit(tiny_model_dir):
    cfg = greedy_stage_config(thinker={"max_context_tokens": 64})
    engine = OmniEngine.from_pretrained(tiny_model_dir, cfg)
    try:
        conv = engine.conversation(instructions="short")
        await conv.add_text("u1", "word " * 80)
        done = await conv.respond(item_id="a1", max_output_tokens=8).wait()
        assert done.status is ResponseStatus.FAILED and isinstance(done.error, ContextLimitError)
        assert "context limit of 64" in str(done.error)
        # the refused reply left no item behind; deleting the long message makes room again
        await conv.delete_item("u1")
        await conv.add_text("u2", "hi")
        ok = await conv.respond(item_id="a1", modalities=frozenset({"text"}), max_output_tokens=4).wait()
        assert ok.status is not ResponseStatus.FAILED
    finally:
        engine.close()


async def test_one_response_at_a_time_and_busy_mutations(tiny_engine):
    conv = tiny_engine.conversation()
    await conv.add_text("u1", "Hi")
    resp = conv.respond(item_id="a1", max_output_tokens=12)
    with pytest.raises(ResponseActiveError):
        conv.respond(item_id="a2")
    with pytest.raises(ResponseActiveError):
        await conv.delete_item("u1")
    resp.cancel()
    await resp.wait()
    with pytest.raises(UnknownItemError):
        await conv.delete_item("missing")
    await conv.close()


async def test_truncate_rolls_back_reply_text(tiny_engine):
    conv = tiny_engine.conversation()
    await conv.add_text("u1", "Hi there")
    done = await conv.respond(item_id="a1", max_output_tokens=10).wait()
    item = tiny_engine.core.conversations.get(conv.id).find("a1")
    total_ms = item.audio_ms
    assert total_ms > 0
    await conv.truncate_item("a1", int(total_ms / 2))
    assert len(item.reply_ids) == int(len(done.text_token_ids) * int(total_ms / 2) / total_ms)
    await conv.add_text("u2", "And?")
    again = await conv.respond(item_id="a2", modalities=frozenset({"text"}), max_output_tokens=3).wait()
    assert again.status is not ResponseStatus.FAILED
    await conv.close()


def test_missing_checkpoint_files(tiny_model_dir, tmp_path):
    broken = tmp_path / "broken"
    shutil.copytree(tiny_model_dir, broken)
    (broken / "spk_dict.pt").unlink()
    with pytest.raises(CheckpointError, match="spk_dict.pt"):
        OmniEngine.from_pretrained(broken, greedy_stage_config())
    with pytest.raises(CheckpointError):
        OmniEngine.from_pretrained(tmp_path / "nowhere", greedy_stage_config())


@pytest.mark.slow
async def test_two_conversations_interleave_independently(tiny_engine):
    import asyncio

    a, b = tiny_engine.conversation(), tiny_engine.conversation()
    await a.add_text("u1", "Hello from A")
    await b.add_text("u1", "Hello from B")
    solo = tiny_engine.conversation()
    await solo.add_text("u1", "Hello from A")
    ref = await solo.respond(item_id="a1", max_output_tokens=6).wait()
    da, db = await asyncio.gather(
        a.respond(item_id="a1", max_output_tokens=6).wait(), b.respond(item_id="a1", max_output_tokens=6).wait()
    )
    assert da.text_token_ids == ref.text_token_ids and da.audio_codes == ref.audio_codes
    assert db.status is not ResponseStatus.FAILED
    for conv in (a, b, solo):
        await conv.close()


async def test_stats_show_what_the_engine_holds(tiny_engine):
    before = await tiny_engine.stats()
    conv = tiny_engine.conversation()
    await conv.add_text("u1", "Hi")
    audio = conv.open_audio("u2")
    audio.append(np.zeros(1600, np.float32))
    await tiny_engine.wait_idle()
    during = await tiny_engine.stats()
    assert during.conversations == before.conversations + 1
    assert during.open_audio_messages == before.open_audio_messages + 1
    assert during.cached_tokens > before.cached_tokens
    await conv.close()
    after = await tiny_engine.stats()
    assert after.conversations == before.conversations and after.cached_tokens == before.cached_tokens
    assert after.responses == 0 and after.open_audio_messages == before.open_audio_messages


def test_audio_positions_are_copied_block_by_block():
    import torch

    from pipeline.scheduler.prefill_plan import audio_runs

    a, b = torch.zeros(4, 2), torch.ones(3, 2)
    audio = {2: (a, 0), 3: (a, 1), 4: (a, 2), 5: (a, 3), 6: (b, 0), 7: (b, 1), 9: (b, 2)}
    runs = [(offset, t is a, r) for offset, t, r in audio_runs(audio, 3, 10)]  # offsets from the chunk's start (3)
    assert runs == [(0, True, range(1, 4)), (3, False, range(0, 2)), (6, False, range(2, 3))]


async def test_a_step_that_raises_fails_the_live_responses_and_the_engine_serves_on(tiny_engine, monkeypatch, caplog):
    """A bug outside any one response's isolation (here the token2wav job policy) must not kill the engine thread."""
    from pipeline.scheduler.plan import AudioRule

    def broken(rule, candidates):
        raise RuntimeError("injected scheduler bug")

    monkeypatch.setattr(AudioRule, "pick", broken)
    conv = tiny_engine.conversation()
    await conv.add_text("u1", "Hello")
    done = await asyncio.wait_for(conv.respond(item_id="a1", max_output_tokens=4).wait(), 60)
    assert done.status is ResponseStatus.FAILED and "engine step failed" in caplog.text
    monkeypatch.undo()
    again = await asyncio.wait_for(conv.respond(item_id="a2", max_output_tokens=4).wait(), 60)
    assert again.status in (ResponseStatus.COMPLETED, ResponseStatus.INCOMPLETE)
    await conv.close()


@pytest.mark.slow
async def test_tiny_model_replies_end_on_their_own_with_the_packaged_sampling(tiny_model_dir):
    """A newcomer's first replies: sampled as packaged, with no length asked for, each tiny reply ends by itself
    (``completed``) after a few seconds of speech, never at the engine's cap."""
    engine = OmniEngine.from_pretrained(tiny_model_dir, seed=7)
    try:
        seconds = []
        for i, text in enumerate(["Hello there, how are you?", "What is the capital of France?", "Tell me a story."]):
            conv = engine.conversation()
            await conv.add_text(f"u{i}", text)
            samples, done = 0, None
            async for ev in conv.respond(item_id=f"r{i}"):
                if isinstance(ev, AudioChunk):
                    samples += len(ev.pcm)
                elif isinstance(ev, ResponseDone):
                    done = ev
            await conv.close()
            assert done is not None and done.status is ResponseStatus.COMPLETED, done
            assert done.usage.output_text_tokens < engine.max_output_tokens
            seconds.append(samples / 24_000)
        # Some two seconds on average; a reply rarely passes ten (about 500 text tokens before its end is sampled).
        assert all(0 < s < 30 for s in seconds), seconds
    finally:
        engine.close()
