"""Pictures and camera video off the engine thread, on both families' tiny checkpoints: with the vision tower on its
worker (``thinker.vision_worker: on``, what CUDA gets by default) the replies to pictures and to camera video equal
the engine's without it (the shared engine, which encodes on its thread); the preprocessing runs on the pool's
threads and the tower on the worker's, never on the engine thread; a picture whose preprocessing or encode fails
fails only the response that reads it, and its conversation carries on."""

from __future__ import annotations

import asyncio
import threading

import numpy as np
import pytest

from conftest import greedy_stage_config
from pipeline.engine import OmniEngine
from pipeline.response_events import ResponseStatus
from tests.helpers.camera_clips import camera, speak, speech
from tests.helpers.image_reference import PICTURES, picture

pytestmark = pytest.mark.slow

MAX_TOKENS = 8
TEXT = frozenset({"text"})
CLIP = (speech(3.2, 5), camera(7, 6))
"""3.2 s of audio, 7 frames: 4 frame pairs (the last one its frame twice)."""
ENGINE_THREAD = "omni-engine"


@pytest.fixture(scope="module")
def worker_engine(family, family_model_dir):
    """A greedy engine on the family's tiny checkpoint whose vision tower runs on its worker."""
    cfg = greedy_stage_config(family=family.family, thinker={"vision_worker": "on"})
    assert cfg.thinker.vision_worker
    engine = OmniEngine.from_pretrained(family_model_dir, cfg, seed=1234)
    yield engine
    engine.close()


async def answer(conv, item_id: str):
    return await conv.respond(item_id=item_id, modalities=TEXT, max_output_tokens=MAX_TOKENS).wait()


async def replies(engine) -> list:
    """Replies to a message with two pictures, then to spoken messages with camera video (all at once, then streamed
    with the engine idle between pieces, so chunks are prefilled in the background)."""
    out = []
    conv = engine.conversation()
    await conv.add_content("u1", ("Look at this:", PICTURES[0], "and this one", PICTURES[1], "What do you see?"))
    out.append(await answer(conv, "a1"))
    await conv.close()
    for incremental in (False, True):
        conv = engine.conversation()
        await speak(engine, conv, "u1", CLIP, incremental=incremental)
        out.append(await answer(conv, "a1"))
        await conv.close()
    return out


async def test_pictures_and_camera_video_answer_the_same_with_the_vision_worker(family_engine, worker_engine):
    assert not family_engine.cfg.thinker.vision_worker, "the shared engine encodes on its thread (CPU)"
    want, got = await replies(family_engine), await replies(worker_engine)
    for a, b in zip(want, got):
        assert a.status is not ResponseStatus.FAILED and b.status is not ResponseStatus.FAILED, (a.error, b.error)
        assert b.usage.input_image_tokens == a.usage.input_image_tokens > 0
        assert list(b.text_token_ids) == list(a.text_token_ids)


@pytest.mark.parametrize("worker", [False, True], ids=["inline", "worker"])
async def test_the_preprocessing_and_the_tower_run_off_the_engine_thread(family_engine, worker_engine, worker):
    engine = worker_engine if worker else family_engine
    core = engine.core
    prep, thinker = core.image_encodes.prep, core.runner.thinker
    preprocess, encode_images = prep.preprocess, thinker.encode_images
    prepared, encoded = [], []

    def preprocess_spy(frames, **kwargs):
        prepared.append(threading.current_thread().name)
        return preprocess(frames, **kwargs)

    def encode_spy(items):
        encoded.append(threading.current_thread().name)
        return encode_images(items)

    prep.preprocess, thinker.encode_images = preprocess_spy, encode_spy
    try:
        done = await replies(engine)
    finally:
        prep.preprocess, thinker.encode_images = preprocess, encode_images
    assert all(d.status is not ResponseStatus.FAILED for d in done)
    assert len(prepared) >= 2 + 2 * 4, "two pictures, four frame pairs twice"
    assert all(name.startswith("omni-picture-prep") for name in prepared), set(prepared)
    assert encoded and set(encoded) == ({"omni-vision"} if worker else {ENGINE_THREAD}), set(encoded)


async def test_a_faulty_picture_fails_only_its_response(worker_engine):
    """One picture's preprocessing raises, another's encode raises (the batched encode fails, then each picture is
    encoded alone): only the responses that read them fail; the other conversation's reply and the next reply of a
    failed conversation, its picture deleted, go on."""
    core = worker_engine.core
    prep, thinker = core.image_encodes.prep, core.runner.thinker
    preprocess, encode_images = prep.preprocess, thinker.encode_images
    unprepared, unencodable = picture(7, 77, 91), picture(8, 150, 30)
    bad_grid = prep.grid([unencodable])

    def preprocess_failing(frames, **kwargs):
        if frames[0].shape == unprepared.shape and np.array_equal(frames[0], unprepared):
            raise MemoryError("no room for this picture")
        return preprocess(frames, **kwargs)

    def encode_failing(items):
        if any(tuple(grid) == bad_grid for _, grid in items):
            raise RuntimeError("the tower broke on this picture")
        return encode_images(items)

    prep.preprocess, thinker.encode_images = preprocess_failing, encode_failing
    try:
        convs = [worker_engine.conversation() for _ in range(3)]
        for conv, shot in zip(convs, (unprepared, PICTURES[0], unencodable)):
            await conv.add_content("u1", ("Look:", shot))
        done = await asyncio.gather(*(answer(conv, "a1") for conv in convs))
        assert [d.status is ResponseStatus.FAILED for d in done] == [True, False, True], [d.error for d in done]
        assert done[1].usage.input_image_tokens > 0
        for conv in (convs[0], convs[2]):
            await conv.delete_item("u1")
            await conv.add_content("u2", ("Look again:", PICTURES[1]))
            again = await answer(conv, "a2")
            assert again.status is not ResponseStatus.FAILED and again.usage.input_image_tokens > 0, again.error
        for conv in convs:
            await conv.close()
    finally:
        prep.preprocess, thinker.encode_images = preprocess, encode_images
