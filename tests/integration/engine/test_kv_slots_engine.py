"""The engine with fewer KV slots than conversations: idle conversations lend their slots (and are prefilled again
at their next response, with the same reply), concurrent responses beyond the pool wait for a slot, and every
response of a batch gets the tokens it gets alone."""

from __future__ import annotations

import asyncio
import threading

import pytest

from conftest import greedy_stage_config
from pipeline.engine import OmniEngine
from pipeline.response_events import ResponseStatus

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def small_pool_engine(tiny_model_dir):
    cfg = greedy_stage_config(thinker={"kv_slots": 2}, talker={"kv_slots": 2, "max_tokens": 120})  # as tiny_engine
    engine = OmniEngine.from_pretrained(tiny_model_dir, cfg, seed=7)
    yield engine
    engine.close()


async def reply(conv, item_id: str, text: str):
    await conv.add_text(f"u-{item_id}", text)
    done = await conv.respond(item_id=item_id, max_output_tokens=6).wait()
    assert done.status is not ResponseStatus.FAILED, done.error
    return done.text_token_ids, done.audio_codes


async def test_idle_conversations_lend_their_slots_and_replies_do_not_change(small_pool_engine, tiny_engine):
    engine = small_pool_engine
    core = engine.core
    convs = [engine.conversation() for _ in range(3)]
    first = [await reply(c, "a1", f"Hello number {i}") for i, c in enumerate(convs)]
    owners = core.runner.thinker.pool.slots.lru_owners()
    assert len(owners) == 2 and convs[0].id not in owners, "the least recently used conversation was evicted"
    evicted = core.conversations.get(convs[0].id)
    assert evicted.slot is None and evicted.cached_keys == []
    # the evicted conversation answers its next turn after a full re-prefill, exactly as an engine with room does
    again = await reply(convs[0], "a2", "And again?")
    roomy = tiny_engine.conversation()
    want = [await reply(roomy, "a1", "Hello number 0"), await reply(roomy, "a2", "And again?")]
    assert [first[0], again] == want
    for c in (*convs, roomy):
        await c.close()
    await engine.wait_idle()
    assert core.runner.thinker.pool.slots.used == 0 and core.runner.talker.pool.slots.used == 0


async def test_wait_idle_returns_while_a_conversation_waits_for_a_slot_others_hold(small_pool_engine):
    """Three conversations with new input and two thinker slots: two are prefilled in the background, the third cannot
    be (a background prefill never evicts) and is not work that wait_idle waits for; it is prefilled once a slot is
    free."""
    engine = small_pool_engine
    core = engine.core
    convs = [engine.conversation() for _ in range(3)]
    for i, c in enumerate(convs):
        await c.add_text(f"u{i}", f"Waiting for a slot, number {i}")
    await asyncio.wait_for(engine.wait_idle(), timeout=60)
    waiting = [c for c in convs if core.conversations.get(c.id).slot is None]
    assert len(waiting) == 1 and core.conversations.get(waiting[0].id).dirty, "one conversation waits for a slot"
    held = next(c for c in convs if c is not waiting[0])
    await held.close()  # frees a slot: the waiting conversation's prefill is work again
    await asyncio.wait_for(engine.wait_idle(), timeout=60)
    assert not core.conversations.get(waiting[0].id).dirty and core.conversations.get(waiting[0].id).slot is not None
    for c in convs:
        if c is not held:
            await c.close()
    await engine.wait_idle()
    assert core.runner.thinker.pool.slots.used == 0


async def test_a_listening_conversation_prefills_its_talker_only_into_a_free_slot(tiny_model_dir, tiny_engine):
    """The talker's background prefill (while a conversation is idle) never takes another conversation's talker slot;
    a reply does, from the least recently used idle one, and answers as with room for everyone."""
    cfg = greedy_stage_config(thinker={"kv_slots": 3}, talker={"kv_slots": 2, "max_tokens": 120})
    engine = await asyncio.to_thread(OmniEngine.from_pretrained, tiny_model_dir, cfg, seed=7)
    core = engine.core
    convs = [engine.conversation() for _ in range(3)]
    for i, c in enumerate(convs[:2]):
        await reply(c, "a1", f"Hello number {i}")
    await convs[2].add_text("u-a1", "Hello number 2")
    await engine.wait_idle()
    held = [core.conversations.get(c.id) for c in convs]
    assert [s.talker_slot is not None for s in held] == [True, True, False], "both talker slots stay with their owners"
    assert held[2].cached_keys and held[2].talker_keys == [], "listening: thinker cache, no talker cache"
    done = await convs[2].respond(item_id="a1", max_output_tokens=6).wait()
    assert held[0].talker_slot is None and held[2].talker_slot is not None, "the reply took the LRU idle slot"
    roomy = tiny_engine.conversation()
    assert (done.text_token_ids, done.audio_codes) == await reply(roomy, "a1", "Hello number 2")
    for c in (*convs, roomy):
        await c.close()
    engine.close()


async def test_responses_beyond_the_pool_wait_for_a_slot_and_batching_changes_no_token(small_pool_engine, tiny_engine):
    engine = small_pool_engine
    convs = [engine.conversation() for _ in range(4)]
    texts = [f"Tell me about {w}" for w in ("cats", "the sea", "rain", "music")]
    for c, t in zip(convs, texts):
        await c.add_text("u1", t)
    dones = await asyncio.gather(*(c.respond(item_id="a1", max_output_tokens=6).wait() for c in convs))
    assert all(d.status is not ResponseStatus.FAILED for d in dones), [d.error for d in dones]
    for c, t, d in zip(convs, texts, dones):
        alone = tiny_engine.conversation()
        assert await reply(alone, "a1", t) == (d.text_token_ids, d.audio_codes)
        await alone.close()
        await c.close()


def t2w_engine(model_dir, worker_thread: str):
    cfg = greedy_stage_config(talker={"max_tokens": 120}, token2wav={"worker_thread": worker_thread})
    return OmniEngine.from_pretrained(model_dir, cfg, seed=1234)


@pytest.fixture(scope="module")
def threaded_t2w_engine(tiny_model_dir):
    engine = t2w_engine(tiny_model_dir, "on")
    yield engine
    engine.close()


async def test_token2wav_on_its_own_thread_makes_the_same_audio(tiny_model_dir):
    """Same seed, same requests in the same order: the same codes and the same samples, in order, before done."""
    import numpy as np

    from pipeline.response_events import AudioChunk, ResponseDone

    async def audio_of(engine, text):
        conv = engine.conversation()
        await conv.add_text("u1", text)
        pcm, done = [], None
        async for ev in conv.respond(item_id="a1", max_output_tokens=6):
            if isinstance(ev, AudioChunk):
                pcm.append(ev.pcm)
            elif isinstance(ev, ResponseDone):
                done = ev
        await conv.close()
        assert done is not None and done.status is not ResponseStatus.FAILED, done
        assert sum(len(p) for p in pcm) == done.audio_samples > 0, "every chunk arrives before response.done"
        return np.concatenate(pcm), done.audio_codes

    results = {}
    for mode in ("on", "off"):
        engine = t2w_engine(tiny_model_dir, mode)
        try:
            results[mode] = await asyncio.gather(*(audio_of(engine, t) for t in ("One", "Two words")))
            assert (engine.core.runner.worker is not None) == (mode == "on")
        finally:
            engine.close()
    for (pcm, codes), (ref_pcm, ref_codes) in zip(results["on"], results["off"]):
        assert codes == ref_codes
        np.testing.assert_allclose(pcm, ref_pcm, atol=1e-5)


async def test_a_response_cancelled_while_its_chunk_is_made_frees_its_stream(threaded_t2w_engine):
    from pipeline.response_events import AudioChunk

    engine = threaded_t2w_engine
    conv = engine.conversation()
    await conv.add_text("u1", "Talk for a while.")
    resp = conv.respond(item_id="a1", max_output_tokens=12)
    async for ev in resp:
        if isinstance(ev, AudioChunk):
            resp.cancel("client_cancelled")
            break
    done = await resp.wait()
    assert done.status is ResponseStatus.CANCELLED
    await conv.close()
    await engine.wait_idle()
    core = engine.core
    assert core.runner.worker.idle and core.stats().responses == 0


async def three_conversations(engine):
    """Three conversations with one short text message each, prefilled in the background."""
    convs = [engine.conversation() for _ in range(3)]
    texts = ["One", "Two words", "Three more words"]
    for c, t in zip(convs, texts):
        await c.add_text("u1", t)
    await engine.wait_idle()
    return convs, texts


async def test_the_prefill_budget_spreads_a_burst_of_turns_over_steps(tiny_model_dir, tiny_engine):
    budget = {"max_prefills_per_step": 1}
    cfg = greedy_stage_config(thinker=budget, talker={"max_tokens": 120, **budget})
    engine = OmniEngine.from_pretrained(tiny_model_dir, cfg, seed=1234)
    core = engine.core
    per_step, counts = [], {"thinker": 0, "talker": 0}
    schedule, talker_prefill, step = core.scheduler.schedule, core.runner.talker_prefill, core.step

    def counted_schedule(*args):
        plan = schedule(*args)
        counts["thinker"] += sum(job.response_id is not None for job in plan.prefills)  # responses' prompt chunks
        return plan

    def counted_talker_prefill(r, **kwargs):
        counts["talker"] += 1
        return talker_prefill(r, **kwargs)

    def counted_step():
        counts.update(thinker=0, talker=0)
        progressed = step()
        per_step.append(dict(counts))
        return progressed

    core.scheduler.schedule, core.runner.talker_prefill = counted_schedule, counted_talker_prefill
    core.step = counted_step
    try:
        convs, texts = await three_conversations(engine)
        dones = await asyncio.gather(*(c.respond(item_id="a1", max_output_tokens=6).wait() for c in convs))
    finally:
        engine.close()
    assert max(s["thinker"] for s in per_step) == 1 and max(s["talker"] for s in per_step) == 1
    for t, d in zip(texts, dones):
        alone = tiny_engine.conversation()
        assert await reply(alone, "a1", t) == (d.text_token_ids, d.audio_codes)
        await alone.close()


async def test_a_burst_of_turns_prefills_together_and_answers_as_each_alone(tiny_model_dir, tiny_engine):
    """The prompts of turns asked in one step run as one batch of chunks (on CUDA one graph replay); each reply is
    the one its conversation gets alone."""
    cfg = greedy_stage_config(thinker={"max_prefills_per_step": 16}, talker={"max_tokens": 120})
    engine = OmniEngine.from_pretrained(tiny_model_dir, cfg, seed=1234)
    core = engine.core
    batches = []
    prefill_many = core.runner.thinker.prefill_many

    def recording(spans):
        batches.append([span[3] for span in spans])
        return prefill_many(spans)

    core.runner.thinker.prefill_many = recording
    try:
        convs, texts = await three_conversations(engine)
        batches.clear()
        gate = threading.Event()
        engine._thread.submit(lambda _core: gate.wait(10))  # hold the engine thread: the turns start in one step
        tasks = [asyncio.create_task(c.respond(item_id="a1", max_output_tokens=6).wait()) for c in convs]
        await asyncio.sleep(0.2)
        gate.set()
        dones = await asyncio.gather(*tasks)
    finally:
        engine.close()
    assert [True, True, True] in batches, f"the three prompts' last chunks in one batch: {batches}"
    for t, d in zip(texts, dones):
        alone = tiny_engine.conversation()
        assert await reply(alone, "a1", t) == (d.text_token_ids, d.audio_codes)
        await alone.close()


async def test_a_failing_prefill_batch_is_retried_chunk_by_chunk_and_fails_only_its_faulty_turn(
    tiny_model_dir, tiny_engine
):
    """A batch that raises is retried one chunk at a time: the healthy turns answer as they would alone, the turn
    whose chunk fails on its own ends ``failed``, and its conversation answers its next turn."""
    cfg = greedy_stage_config(thinker={"max_prefills_per_step": 16}, talker={"max_tokens": 120})
    engine = OmniEngine.from_pretrained(tiny_model_dir, cfg, seed=1234)
    core = engine.core
    prefill_many = core.runner.thinker.prefill_many
    batches = []

    def flaky(spans):
        batches.append(len(spans))
        if len(spans) > 1 or spans[0][1] == core.conversations.get(faulty_id).slot and spans[0][3] and not healed:
            raise RuntimeError("prefill kernel fault")
        return prefill_many(spans)

    healed = False
    core.runner.thinker.prefill_many = flaky
    try:
        convs, texts = await three_conversations(engine)
        faulty_id = convs[1].id
        batches.clear()
        gate = threading.Event()
        engine._thread.submit(lambda _core: gate.wait(10))  # the three turns start in one step
        tasks = [asyncio.create_task(c.respond(item_id="a1", max_output_tokens=6).wait()) for c in convs]
        await asyncio.sleep(0.2)
        gate.set()
        dones = await asyncio.gather(*tasks)
        assert batches[:4] == [3, 1, 1, 1], "the batch, then each chunk alone"
        assert [d.status.value for d in dones] == ["incomplete", "failed", "incomplete"]
        healed = True
        again = await convs[1].respond(item_id="a2", max_output_tokens=6).wait()
        assert again.status.value == "incomplete"
    finally:
        engine.close()
    for i in (0, 2):
        alone = tiny_engine.conversation()
        assert await reply(alone, "a1", texts[i]) == (dones[i].text_token_ids, dones[i].audio_codes)
        await alone.close()
