"""A session that lasts: with the packaged context policy (``drop_oldest``) a long spoken conversation answers every
turn, a drop keeps the instructions and the turn being answered, and what the model says after a drop is exactly what
it says to a fresh conversation holding the same kept history (the KV cache is rebuilt from the first changed
position, nothing stale survives).
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import soundfile as sf
import soxr

from conftest import greedy_stage_config
from pipeline.engine import OmniEngine
from pipeline.errors import ContextLimitError
from pipeline.response_events import ResponseStatus
from tests.helpers.paths import TESTS

pytestmark = pytest.mark.slow

SPEECH = TESTS / "fixtures" / "speech"


@pytest.fixture(scope="module")
def story_16k() -> np.ndarray:
    pcm, rate = sf.read(SPEECH / "long_story.wav", dtype="float32")  # ~20 s of speech
    return soxr.resample(pcm, rate, 16000).astype(np.float32)


def turn_audio(story: np.ndarray, turn: int, seconds: float) -> np.ndarray:
    """``seconds`` of the story, starting one second further for each turn (wrapping around)."""
    start = (turn % 8) * 16000
    return story[start : start + int(seconds * 16000)]


async def state_of(engine: OmniEngine, conv):
    """The engine's state of ``conv`` (the engine thread runs one response at a time here: read between them)."""
    return await engine._call(lambda core: core.conversations.get(conv.id))


async def fresh_reply(engine: OmniEngine, instructions: str, items, item_id: str, **respond):
    """The reply of a new conversation (no cache) given copies of ``items`` as its history."""
    conv = engine.conversation(instructions=instructions)
    copies = [
        dataclasses.replace(item, reply_ids=list(item.reply_ids), audio_blocks=list(item.audio_blocks))
        for item in items
    ]

    def seed(core):
        state = core.conversations.get(conv.id)
        state.items.extend(copies)
        state.dirty = True

    await engine._call(seed)
    done = await conv.respond(item_id=item_id, **respond).wait()
    await conv.close()
    return done


async def test_a_reply_after_a_drop_equals_a_fresh_conversation_with_the_kept_history(tiny_model_dir, story_16k):
    thinker = {"max_context_tokens": 400, "context_retention_ratio": 0.6}
    engine = OmniEngine.from_pretrained(tiny_model_dir, greedy_stage_config(thinker=thinker, talker={"max_tokens": 40}))
    respond = {"modalities": frozenset({"text", "audio"}), "max_output_tokens": 6}
    try:
        conv = engine.conversation(instructions="Be brief.")
        state = await state_of(engine, conv)
        renderer = engine.core.renderer
        # what the renderings before and after a drop share: the instructions, then a user audio message's start
        kept_prefix = len(renderer.text_message("system", "Be brief.") + renderer.header("user")) + 1
        drop_turn, checked = None, 0
        for turn in range(12):
            await conv.add_audio(f"u{turn}", turn_audio(story_16k, turn, 2.5))  # ~70 positions a turn
            done = await conv.respond(item_id=f"a{turn}", **respond).wait()
            assert done.status is ResponseStatus.INCOMPLETE, done.error
            dropped = bool(state.dropped) and drop_turn is None
            if dropped:  # the instructions stay cached; the kept turns are prefilled again after them
                drop_turn = turn
                assert state.items[-2].id == f"u{turn}" and state.items[0].role == "user"
                assert done.usage.cached_tokens == kept_prefix
            elif drop_turn is not None and checked == 0:  # the turn after a drop extends the cache
                assert done.usage.cached_tokens >= len(state.render().keys) - len(done.text_token_ids) - 90
            if drop_turn is not None and checked < 2:
                again = await fresh_reply(engine, "Be brief.", state.items[:-1], f"a{turn}", **respond)
                assert (done.text_token_ids, done.audio_codes) == (again.text_token_ids, again.audio_codes)
                assert again.usage.input_tokens == done.usage.input_tokens
                checked += 1
        assert drop_turn is not None and checked == 2
        assert len(state.cached_keys) <= 400
    finally:
        engine.close()


async def test_a_forty_turn_spoken_conversation_on_the_packaged_config_answers_every_turn(
    tiny_model_dir, story_16k, caplog
):
    """12-second spoken turns fill the packaged 8192-token context; every turn is answered, the instructions stay
    cached through every drop (the background prefill of a turn that overflows stops at the slot's end, it does not
    fail and lose the cache), and a drop leaves room for the next turns (drops are rare, not one per turn)."""
    engine = OmniEngine.from_pretrained(tiny_model_dir, greedy_stage_config())
    assert engine.core.max_context == 8192
    instructions = "You are a patient listener."
    head = len(engine.core.renderer.text_message("system", instructions))
    try:
        conv = engine.conversation(instructions=instructions)
        state = await state_of(engine, conv)
        drops, input_tokens = [], []
        for turn in range(40):
            before = len(state.dropped)
            await conv.add_audio(f"u{turn}", turn_audio(story_16k, turn, 12.0))
            await engine.wait_idle()  # prefilled in the background before the response, as while the user speaks
            done = await conv.respond(item_id=f"a{turn}", modalities=frozenset({"text"}), max_output_tokens=8).wait()
            assert done.status in (ResponseStatus.COMPLETED, ResponseStatus.INCOMPLETE), (turn, done.error)
            input_tokens.append(done.usage.input_tokens)
            if len(state.dropped) > before:
                drops.append((turn, done.usage.input_tokens - done.usage.cached_tokens))
                assert done.usage.cached_tokens >= head, "the instructions stayed cached"
        assert not [r for r in caplog.records if r.levelname == "ERROR"], "no prefill failed"
        assert max(input_tokens) + 8 <= 8192 and sum(input_tokens) > 3 * 8192
        assert 2 <= len(drops) <= 6, drops  # the context filled, and each drop freed room for several turns
        assert state.items[0].role == "user" and len(state.cached_keys) <= 8192
        # the client may still delete or truncate a turn the model forgot: nothing happens, nothing fails
        await conv.truncate_item("a0", 0)
        await conv.delete_item("u0")
        # an input that alone cannot fit is still refused, naming the sizes
        await conv.add_text("huge", "word " * 9000)
        done = await conv.respond(item_id="refused", modalities=frozenset({"text"}), max_output_tokens=8).wait()
        assert done.status is ResponseStatus.FAILED and isinstance(done.error, ContextLimitError)
        assert "context limit of 8192" in str(done.error) and "input being answered" in str(done.error)
    finally:
        engine.close()
