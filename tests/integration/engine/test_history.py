"""Conversation history beyond appending, on the tiny engine: items inserted before the end (at the start, in the
middle, and at the place of a deleted item) give the reply a one-shot prefill of the same final conversation gives,
and the KV cache keeps every position before the inserted item; a conversation's own context policy (``disabled``
truncation fails where the engine's default drops, a lower retention ratio drops further)."""

from __future__ import annotations

import asyncio
import threading

import pytest

from conftest import greedy_stage_config
from pipeline.api import ROOT_ITEM_ID, ContextPolicy
from pipeline.engine import OmniEngine
from pipeline.errors import ContextLimitError
from pipeline.response_events import ResponseStatus
from tests.helpers.one_shot import assert_same_reply, core_conv, reply_and_one_shot

pytestmark = pytest.mark.slow

INSTRUCTIONS = "Be brief."
TEXT = frozenset({"text"})


@pytest.fixture(scope="module")
def engine(tiny_model_dir):
    """One-shot comparisons prefill the whole conversation as one chunk; a 400-token context fills in a few turns."""
    thinker = {"prefill_chunk_tokens": 100_000, "max_context_tokens": 400}
    eng = OmniEngine.from_pretrained(tiny_model_dir, greedy_stage_config(thinker=thinker, talker={"max_tokens": 40}))
    yield eng
    eng.close()


async def two_turns(engine):
    """A conversation of two answered text turns, prefilled and idle."""
    conv = engine.conversation(instructions=INSTRUCTIONS)
    for turn, text in enumerate(["What is the capital of France?", "And of Spain?"]):
        await conv.add_text(f"u{turn}", text)
        done = await conv.respond(item_id=f"a{turn}", max_output_tokens=4).wait()
        assert done.status is not ResponseStatus.FAILED, done.error
    await engine.wait_idle()
    return conv


async def insert_and_respond(engine, conv, text: str, previous: str, reply_id: str, **respond):
    """Insert a user message and ask for the reply in one batch of engine requests (the engine thread is held
    meanwhile, so no background prefill runs between them): the reply's ``cached_tokens`` is what the insertion left
    of the cache."""
    entered, release = threading.Event(), threading.Event()

    def hold(core):
        entered.set()
        release.wait(30)

    held = engine._submit_nowait(hold)
    await asyncio.to_thread(entered.wait, 30)
    added = asyncio.ensure_future(conv.add_text(f"ins-{reply_id}", text, previous_item_id=previous))
    await asyncio.sleep(0)  # add_text has sent its request
    response = conv.respond(item_id=reply_id, **respond)
    release.set()
    await asyncio.wrap_future(held)
    await added
    return await response.wait()


def position_after(engine, conv_state, previous: str) -> int:
    """Where an item inserted after ``previous`` starts in the rendering, counted from the items' own renderings."""
    renderer = engine.core.renderer
    position = len(renderer.text_message("system", INSTRUCTIONS))
    if previous == ROOT_ITEM_ID:
        return position
    for item in conv_state.items:
        single = type(conv_state)("x", renderer, instructions="", max_context_tokens=10**6)
        single.items = [item]
        position += len(single.render().keys) - len(renderer.text_message("system", ""))
        if item.id == previous:
            return position
    raise AssertionError(f"{previous} is not in the conversation")


@pytest.mark.parametrize("previous", [ROOT_ITEM_ID, "u0", "a0"])
async def test_an_inserted_item_gives_the_reply_of_a_one_shot_prefill_and_keeps_the_cache_before_it(engine, previous):
    conv = await two_turns(engine)
    state = core_conv(engine, conv)
    start = position_after(engine, state, previous)
    header = len(engine.core.renderer.header("user"))
    first = await insert_and_respond(engine, conv, "Reply in one word.", previous, "a2", max_output_tokens=6)
    assert first.status is not ResponseStatus.FAILED, first.error
    order = [item.id for item in state.items]
    assert order.index("ins-a2") == (0 if previous == ROOT_ITEM_ID else order.index(previous) + 1)
    # everything before the inserted item stayed cached (and at most the header it shares with the displaced item)
    assert start <= first.usage.cached_tokens <= start + header
    _, again = await reply_and_one_shot(engine, conv, "a2", max_output_tokens=6)
    assert again.usage.cached_tokens == 0
    assert_same_reply(first, again)
    await conv.close()


async def test_delete_then_create_at_the_old_place_answers_the_edited_history(engine):
    """LiveKit's history edit: delete an item, then create its replacement after the item that preceded it."""
    conv = await two_turns(engine)
    await conv.delete_item("u1")
    await conv.add_text("u1-edited", "And of Italy?", previous_item_id="a0")
    assert [item.id for item in core_conv(engine, conv).items] == ["u0", "a0", "u1-edited", "a1"]
    first, again = await reply_and_one_shot(engine, conv, "a2", max_output_tokens=6)
    assert_same_reply(first, again)
    await conv.close()


async def test_an_insertion_after_a_reply_being_written_is_an_append(engine):
    conv = engine.conversation(instructions=INSTRUCTIONS)
    await conv.add_text("u0", "Hello")
    response = conv.respond(item_id="a0", modalities=TEXT, max_output_tokens=4)
    await conv.add_text("u1", "Go on", previous_item_id="a0")
    assert (await response.wait()).status is not ResponseStatus.FAILED
    assert [item.id for item in core_conv(engine, conv).items] == ["u0", "a0", "u1"]
    await conv.close()


async def history(engine, policy: ContextPolicy | None):
    """A conversation of seven items (over 300 positions) that does not fit the 400-token context beside a 100-token
    reply room; its policy set first."""
    conv = engine.conversation(instructions=INSTRUCTIONS)
    await conv.set_context_policy(policy)
    words = " ".join(f"word{i}" for i in range(16))
    for turn in range(3):
        await conv.add_text(f"u{turn}", words)
        await conv.add_text(f"a{turn}", "Noted.", role="assistant")
    await conv.add_text("u3", words)
    return conv


async def answer(conv):
    return await conv.respond(item_id="reply", modalities=TEXT, max_output_tokens=100).wait()


async def test_disabled_truncation_fails_where_the_engine_default_drops(engine):
    def kept(conv) -> list[str]:
        return [item.id for item in core_conv(engine, conv).items]

    auto = await history(engine, None)  # the engine's own policy: drop_oldest, retention 0.8
    done = await answer(auto)
    assert done.status is not ResponseStatus.FAILED, done.error
    assert kept(auto)[0] != "u0" and kept(auto)[0] != "u3", "the oldest turns were dropped, not every turn"

    disabled = await history(engine, ContextPolicy(drop_oldest=False))
    done = await answer(disabled)
    assert done.status is ResponseStatus.FAILED and isinstance(done.error, ContextLimitError)
    assert done.error.code == "context_length_exceeded"
    assert kept(disabled) == ["u0", "a0", "u1", "a1", "u2", "a2", "u3"], "nothing dropped, no reply item left"

    lower = await history(engine, ContextPolicy(drop_oldest=True, retention_ratio=0.3))
    assert (await answer(lower)).status is not ResponseStatus.FAILED
    assert len(kept(lower)) < len(kept(auto)), "a lower retention ratio drops further"
    for conv in (auto, disabled, lower):
        await conv.close()


async def test_a_history_limit_and_back_to_the_engine_policy(engine):
    conv = await history(engine, ContextPolicy(drop_oldest=False, max_history_tokens=50))
    done = await answer(conv)
    assert done.status is ResponseStatus.FAILED and "after the instructions, more than its limit of 50" in str(
        done.error
    )
    await conv.set_context_policy(None)  # auto again: the engine's drop_oldest
    done = await answer(conv)
    assert done.status is not ResponseStatus.FAILED, done.error
    await conv.close()
