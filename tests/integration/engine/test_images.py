"""Image items end to end: the engine's greedy replies to messages with pictures equal transformers' thinker fed the
same pixel values, on the tiny checkpoint and on the sharpened one (where a wrong position changes the tokens);
incremental (pictures prefilled in the background, then text, then a reply) equals one-shot; a second turn after a
picture reuses the cache exactly; bad pictures are refused and the conversation carries on."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch
from transformers import AutoTokenizer, Qwen2_5OmniThinkerForConditionalGeneration

from conftest import greedy_stage_config
from pipeline.engine import OmniEngine
from pipeline.errors import InvalidImageError, UnsupportedInputError
from pipeline.response_events import ResponseStatus
from tests.helpers.image_reference import PICTURES, reference_inputs

pytestmark = pytest.mark.slow

MAX_TOKENS = 8
TEXT = frozenset({"text"})


@pytest.fixture(scope="module", params=["tiny_model_dir", "sharp_model_dir"], ids=["plain", "sharp"])
def setup(request):
    path = request.getfixturevalue(request.param)
    engine = OmniEngine.from_pretrained(path, greedy_stage_config(), seed=1234)
    thinker = Qwen2_5OmniThinkerForConditionalGeneration.from_pretrained(path, dtype=torch.float32).eval()
    yield engine, thinker, AutoTokenizer.from_pretrained(path)
    engine.close()


def reference_reply(engine, thinker, tokenizer, turns: list[tuple[list, list[int]]]) -> list[int]:
    """Greedy thinker reply to ``turns`` (as for :func:`reference_inputs`)."""
    special = engine.core.special
    inputs = reference_inputs(engine, tokenizer, turns)
    ids = inputs["input_ids"]
    with torch.inference_mode():
        out = thinker.generate(
            **inputs,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=MAX_TOKENS,
            do_sample=False,
            repetition_penalty=1.0,
        )
    reply = out[0, ids.shape[1] :].tolist()
    return [t for t in reply if t not in (special.im_end, special.endoftext)]


async def answer(conv, item_id: str):
    done = await conv.respond(item_id=item_id, modalities=TEXT, max_output_tokens=MAX_TOKENS).wait()
    assert done.status is not ResponseStatus.FAILED, done.error
    return done


async def test_image_messages_match_the_reference_over_two_turns(setup):
    engine, thinker, tokenizer = setup
    first = ["Look at this:", PICTURES[0], "and this one", PICTURES[1], "What do you see?"]
    second = [PICTURES[1], "Again?"]
    conv = engine.conversation()
    await conv.add_content("u1", tuple(first))
    done = await answer(conv, "a1")
    want = reference_reply(engine, thinker, tokenizer, [(first, [])])
    assert list(done.text_token_ids) == want
    image_tokens = sum(engine.vision.tokens(*p.shape[:2]) for p in PICTURES)
    assert done.usage.input_image_tokens == image_tokens
    await conv.add_content("u2", tuple(second))
    done2 = await answer(conv, "a2")
    assert done2.usage.cached_tokens > 0
    want2 = reference_reply(engine, thinker, tokenizer, [(first, list(done.text_token_ids)), (second, [])])
    assert list(done2.text_token_ids) == want2, "the second turn, on the cache of the first, equals a fresh one-shot"
    await conv.close()


async def test_background_prefill_then_text_equals_one_shot(setup):
    engine, _, _ = setup
    conv = engine.conversation()
    await conv.add_content("u1", ("Describe", PICTURES[0]))
    await engine.wait_idle()  # the picture is encoded and prefilled in the background
    state = engine.core.conversations.get(conv.id)
    assert len(state.cached_keys) > 0 and state.rope_shift < 0
    await conv.add_text("u2", "briefly, please")
    incremental = await answer(conv, "a1")
    assert incremental.usage.cached_tokens > engine.vision.tokens(*PICTURES[0].shape[:2])
    one_shot = engine.conversation()
    await one_shot.add_content("u1", ("Describe", PICTURES[0]))
    await one_shot.add_text("u2", "briefly, please")
    assert (await answer(one_shot, "a1")).text_token_ids == incremental.text_token_ids
    await conv.close()
    await one_shot.close()


async def test_insert_and_delete_around_pictures_recompute_positions(setup):
    """An item inserted before a picture and a deleted picture re-prefill from the first changed item; the reply
    equals a fresh conversation's with the same items."""
    engine, _, _ = setup
    conv = engine.conversation()
    await conv.add_content("u1", ("First", PICTURES[0]))
    await conv.add_content("u2", ("Second", PICTURES[1], "which?"))
    await engine.wait_idle()
    await conv.add_content("u0", (PICTURES[1], "before all"), previous_item_id="root")
    await conv.delete_item("u1")
    edited = await answer(conv, "a1")
    fresh = engine.conversation()
    await fresh.add_content("u0", (PICTURES[1], "before all"))
    await fresh.add_content("u2", ("Second", PICTURES[1], "which?"))
    assert (await answer(fresh, "a1")).text_token_ids == edited.text_token_ids
    await conv.close()
    await fresh.close()


async def test_bad_pictures_are_refused_and_the_conversation_carries_on(tiny_engine):
    conv = tiny_engine.conversation()
    for bad in (np.zeros((4, 4), np.uint8), np.zeros((0, 8, 3), np.uint8), np.zeros((8, 8, 3), np.float32), b"png"):
        with pytest.raises(InvalidImageError):
            await conv.add_content("u1", ("look", bad))
    await conv.add_content("u1", ("look", PICTURES[0]))
    done = await answer(conv, "a1")
    assert done.usage.input_image_tokens > 0
    await conv.close()


async def test_a_model_without_a_vision_tower_refuses_pictures(tiny_engine):
    conv = tiny_engine.conversation()
    vision = tiny_engine.vision
    tiny_engine.vision = None  # the handle's check; the core refuses as well
    try:
        with pytest.raises(UnsupportedInputError):
            await conv.add_content("u1", ("look", PICTURES[0]))
    finally:
        tiny_engine.vision = vision
    core = tiny_engine.core
    encodes, core.conversations.image_encodes = core.conversations.image_encodes, None
    try:
        with pytest.raises(UnsupportedInputError):
            await conv.add_content("u1", ("look", PICTURES[0]))
    finally:
        core.conversations.image_encodes = encodes
    await conv.add_text("u1", "hello")
    assert (await answer(conv, "a1")).status is not ResponseStatus.FAILED
    await conv.close()


async def test_on_the_sharpened_checkpoint_1d_positions_change_the_reply(sharp_model_dir, monkeypatch):
    """What makes the equivalence above a position check: with every picture's positions 1-D (rope = cache index),
    the sharpened model's greedy reply differs from the reference's."""
    engine = OmniEngine.from_pretrained(sharp_model_dir, greedy_stage_config(), seed=1234)
    thinker = Qwen2_5OmniThinkerForConditionalGeneration.from_pretrained(sharp_model_dir, dtype=torch.float32).eval()
    parts = ["Look at this:", PICTURES[0], "and this one", PICTURES[1], "What do you see?"]
    want = reference_reply(engine, thinker, AutoTokenizer.from_pretrained(sharp_model_dir), [(parts, [])])
    one_d = SimpleNamespace(rope_positions=lambda *args, **kwargs: None, rope_shift=lambda *args: 0)
    monkeypatch.setattr(engine.core.scheduler.prefill, "positions", one_d)
    try:
        conv = engine.conversation()
        await conv.add_content("u1", tuple(parts))
        assert list((await answer(conv, "a1")).text_token_ids) != want
    finally:
        engine.close()
