"""Listen while the user speaks: incremental prefill and conversation KV state (issue 4).

Every reply of a conversation built incrementally (audio streamed in 20 ms pieces and prefilled
block by block in the background, history kept in the KV caches across turns, rolled back on
truncate and cancel) is token-identical, text and codec, to the reply computed from a one-shot
prefill of the same conversation (all caches dropped first, the whole context in one chunk).
"""

from __future__ import annotations

import numpy as np
import pytest
import soundfile as sf
import soxr
import torch

from conftest import greedy_stage_config
from pipeline.engine import OmniEngine
from pipeline.response_events import AudioChunk, ResponseStatus
from tests.helpers.one_shot import assert_same_reply, core_conv, reply_and_one_shot
from tests.helpers.paths import TESTS

pytestmark = pytest.mark.slow

FIXTURES = TESTS / "fixtures" / "speech"


def speech_16k(name: str, repeat: int = 1) -> np.ndarray:
    pcm, rate = sf.read(FIXTURES / name, dtype="float32")
    pcm = soxr.resample(pcm, rate, 16000).astype(np.float32)
    return np.concatenate([pcm] * repeat)


@pytest.fixture(scope="module", params=["streaming", "exact"])
def engine(tiny_model_dir, request):
    """Both audio-floor policies; one-shot comparisons prefill the whole conversation as one chunk."""
    thinker = {"prefill_chunk_tokens": 100_000, "audio_floor": request.param}
    eng = OmniEngine.from_pretrained(
        tiny_model_dir, greedy_stage_config(thinker=thinker, talker={"max_tokens": 60}), seed=7
    )
    yield eng
    eng.close()


async def stream_audio(engine, conv, item_id: str, pcm: np.ndarray, *, piece: int = 320) -> None:
    """Append in 20 ms pieces, letting the engine work between them, as a live microphone would."""
    audio = conv.open_audio(item_id)
    for start in range(0, len(pcm), piece):
        audio.append(pcm[start : start + piece])
        if start % (piece * 25) == 0:
            await engine.wait_idle()
    await engine.wait_idle()
    await audio.commit()


async def test_streamed_audio_is_prefilled_before_commit(engine):
    conv = engine.conversation()
    pcm = speech_16k("capital_of_france.wav", repeat=2)  # ~5.8 s: two complete 2 s blocks + a tail
    audio = conv.open_audio("u1")
    audio.append(pcm[: 16000 * 5])
    await engine.wait_idle()
    state = core_conv(engine, conv)
    # two full blocks (50 tokens each) are in the thinker cache while the user is still speaking
    assert sum(1 for k in state.cached_keys if isinstance(k, tuple) and k[0] == "u1") == 100
    audio.append(pcm[16000 * 5 :])
    await audio.commit()
    # the engine encodes and prefills the tail in the background when it has a step before the response starts (a
    # response asked at once, as the server does, starts in that step and prefills the tail itself)
    await engine.wait_idle()
    done = await conv.respond(item_id="a1", max_output_tokens=6).wait()
    assert done.usage.cached_tokens >= 100
    assert done.usage.input_tokens - done.usage.cached_tokens < 50, "only the tail was left to prefill at commit"
    await conv.close()


async def test_exact_floor_features_equal_the_reference_processor(engine):
    """With ``audio_floor: exact`` the encoded message equals the reference features of the whole
    signal (speech that gets louder later changes early blocks); ``streaming`` keeps early blocks."""
    from pipeline.models.common.log_mel import IncrementalLogMel

    pcm = np.concatenate([0.05 * speech_16k("short_joke.wav"), speech_16k("long_story.wav")[: 16000 * 3]])
    conv = engine.conversation()
    await stream_audio(engine, conv, "u1", pcm)
    # A commit queues the re-encodes; their embeddings are filled at the start of the engine's next step. Reading them
    # before that step raced the engine thread (uninitialised memory when it was late, as under a loaded machine).
    await engine.wait_idle()
    assert engine.core.runner.audio_encodes.pending == 0
    core = engine.core
    item = core_conv(engine, conv).find("u1")
    one_shot = IncrementalLogMel(core.ckpt.feature_extractor)
    one_shot.append(pcm)
    one_shot.finish()
    reference = core.runner.thinker.encode_features(one_shot.one_shot_features()[:, :200])
    first_block = item.audio_blocks[0].embeds
    if core.cfg.thinker.audio_floor == "exact":
        assert item.audio_blocks[0].version == 1, "the first block was re-encoded at commit"
        assert torch.allclose(first_block, reference, atol=1e-5)
    else:
        assert item.audio_blocks[0].version == 0
        assert not torch.allclose(first_block, reference, atol=1e-5)
    await conv.close()


async def test_multi_turn_incremental_equals_one_shot(engine):
    conv = engine.conversation()
    await stream_audio(engine, conv, "u1", speech_16k("pair_turn1_name.wav"))
    a, b = await reply_and_one_shot(engine, conv, "a1", max_output_tokens=8)
    assert_same_reply(a, b)

    await conv.add_text("u2", "And what else?")
    a, b = await reply_and_one_shot(engine, conv, "a2", max_output_tokens=8)
    assert_same_reply(a, b)
    assert a.usage.cached_tokens > 0

    # a cancelled reply, then a truncate of what was heard, then a new spoken turn
    await stream_audio(engine, conv, "u3", speech_16k("weather_today.wav", repeat=3))
    resp = conv.respond(item_id="a3", max_output_tokens=12)
    async for ev in resp:
        if isinstance(ev, AudioChunk):
            resp.cancel("turn_detected")
    assert resp.done.status is ResponseStatus.CANCELLED
    await conv.truncate_item("a3", 100)
    await stream_audio(engine, conv, "u4", speech_16k("pair_turn2_recall.wav"))
    a, b = await reply_and_one_shot(engine, conv, "a4", max_output_tokens=8)
    assert_same_reply(a, b)
    await conv.close()


async def test_delete_rolls_cache_back_and_history_is_not_prefilled_twice(engine):
    conv = engine.conversation()
    await conv.add_text("u1", "first")
    first = await conv.respond(item_id="a1", modalities=frozenset({"text"}), max_output_tokens=4).wait()
    await engine.wait_idle()
    state = core_conv(engine, conv)
    history = len(state.cached_keys)
    await conv.add_text("u2", "second")
    second = await conv.respond(item_id="a2", modalities=frozenset({"text"}), max_output_tokens=4).wait()
    # the history and the new message were prefilled before the response: only its header is left
    assert second.usage.cached_tokens > history
    header = len(engine.core.renderer.header("assistant"))
    assert second.usage.input_tokens - second.usage.cached_tokens == header
    await conv.delete_item("u2")
    await conv.delete_item("a2")
    await engine.wait_idle()
    assert len(state.cached_keys) == history
    assert first.status is not ResponseStatus.FAILED
    await conv.close()


async def test_talker_prompt_cache_is_reused_across_turns(engine, monkeypatch):
    """The talker's cache follows the conversation as the thinker's does: prefilled in the background while the
    conversation is idle, kept across turns, so that a reply's talker prefill covers only what the background had not
    (+ speaker bos and the first reply vector)."""
    talker = engine.core.runner.talker
    spans = []  # (start, positions, at a reply's start)
    prefill, prefill_prompt = talker.prefill, talker.prefill_prompt

    def spy(vectors, **kwargs):
        spans.append((kwargs["start"], vectors.shape[0] - 2, True))
        return prefill(vectors, **kwargs)

    def spy_prompt(vectors, **kwargs):
        spans.append((kwargs["start"], vectors.shape[0], False))
        return prefill_prompt(vectors, **kwargs)

    monkeypatch.setattr(talker, "prefill", spy)
    monkeypatch.setattr(talker, "prefill_prompt", spy_prompt)
    conv = engine.conversation()
    await conv.add_text("u1", "hello")
    await engine.wait_idle()
    state = core_conv(engine, conv)
    assert state.talker_keys == state.cached_keys and spans and not any(reply for *_, reply in spans)

    def snapshot(core):
        """The talker cache's length and the spans so far, taken on the engine thread between two steps (a background
        prefill of the finished reply may follow it at any time), the spans then cleared."""
        taken = len(state.talker_keys), list(spans)
        spans.clear()
        return taken

    await conv.respond(item_id="a1", max_output_tokens=5).wait()
    (first_prompt, turn1), slot = await engine._call(snapshot), state.talker_slot
    assert first_prompt > 0 and slot is not None
    await conv.add_text("u2", "again")
    await conv.respond(item_id="a2", max_output_tokens=5).wait()
    second, turn2 = await engine._call(snapshot)
    assert state.talker_slot == slot
    assert state.talker_keys[:first_prompt] == state.cached_keys[:first_prompt]
    assert second > first_prompt
    for turn, (begin, end) in ((turn1, (0, first_prompt)), (turn2, (first_prompt, second))):
        covered = begin  # each prefill starts where the cache ended: nothing prefilled twice, turn 2 reuses turn 1's
        for start, positions, _ in turn:
            assert start == covered
            covered += positions
        assert covered == end
        assert [reply for *_, reply in turn].count(True) == 1, "one reply prefill per turn (background ones around it)"
    before_reply = [positions for _, positions, reply in turn1[: [r for *_, r in turn1].index(True)]]
    reply_positions = next(positions for _, positions, reply in turn1 if reply)
    assert reply_positions < sum(before_reply), "the turn's end left less to the reply than the background did"
    await conv.close()


async def test_discarded_audio_leaves_no_trace(engine):
    conv = engine.conversation()
    await conv.add_text("u1", "hi")
    await engine.wait_idle()
    state = core_conv(engine, conv)
    before = list(state.cached_keys)
    audio = conv.open_audio("u2")
    audio.append(speech_16k("short_joke.wav", repeat=2))
    await engine.wait_idle()
    assert len(state.cached_keys) > len(before)
    await audio.discard()
    await engine.wait_idle()
    assert state.cached_keys == before
    await conv.close()


async def test_context_policy_drop_oldest(tiny_model_dir):
    cfg = greedy_stage_config(thinker={"max_context_tokens": 160, "context_policy": "drop_oldest"})
    eng = OmniEngine.from_pretrained(tiny_model_dir, cfg)
    try:
        conv = eng.conversation(instructions="short")
        for i in range(6):
            await conv.add_text(f"u{i}", "some words to fill the context " * 2)
            done = await conv.respond(item_id=f"a{i}", modalities=frozenset({"text"}), max_output_tokens=8).wait()
            assert done.status is not ResponseStatus.FAILED, done.error
        state = eng.core.conversations.get(conv.id)
        assert state.items[0].id != "u0", "the oldest turns were dropped"
        assert len(state.cached_keys) <= 160
    finally:
        eng.close()
