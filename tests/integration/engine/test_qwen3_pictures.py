"""Pictures on Qwen3-Omni in the streaming engine == transformers' reference ``generate`` (greedy), text ids and all 16
codebooks, on the sharpened tiny checkpoint (a wrong position or a missing deepstack feature changes its greedy
tokens): a user message with pictures answered with speech; the same with a picture split across two prefill chunks,
prefilled for the response or in the background while the conversation is idle (the talker following chunk by
chunk); and a second turn whose talker reuses the first turn's cache. The reference gets the pixel values and grids
from the engine's own preprocessor (no torchvision here). The last tests show what makes these position checks: on
this checkpoint the thinker without deepstack features, and the talker at 1-D positions, answer otherwise."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoTokenizer, Qwen3OmniMoeForConditionalGeneration

from conftest import greedy_stage_config
from pipeline.engine import OmniEngine
from pipeline.models.qwen3_omni.prompt import DEFAULT_SYSTEM_PROMPT
from tests.helpers.image_reference import OneDPositions, picture, reference_inputs
from tests.helpers.qwen3_reference import TALKER_MAX, THINKER_MAX, VOICE, check_reply, collect, run_reference

pytestmark = [
    pytest.mark.filterwarnings("ignore:Passing `repetition_penalty` with `inputs_embeds`:UserWarning"),
    pytest.mark.slow,
]

PICTURES = [picture(1, 100, 150), picture(2, 90, 60)]
PARTS = ["Look at this:", PICTURES[0], "What do you see?"]


def stage_config(**thinker):
    return greedy_stage_config(family="qwen3_omni", thinker=thinker, talker={"max_tokens": TALKER_MAX})


@pytest.fixture(scope="module")
def engine(qwen3_sharp_model_dir):
    engine = OmniEngine.from_pretrained(qwen3_sharp_model_dir, stage_config(), seed=1234)
    yield engine
    engine.close()


@pytest.fixture(scope="module")
def reference(qwen3_sharp_model_dir):
    model = Qwen3OmniMoeForConditionalGeneration.from_pretrained(qwen3_sharp_model_dir, dtype=torch.float32).eval()
    return model, AutoTokenizer.from_pretrained(qwen3_sharp_model_dir)


def reference_reply(engine, reference, turns) -> tuple[list[int], torch.Tensor]:
    """The reference's greedy reply (text ids, frames) to ``turns`` (as for :func:`reference_inputs`)."""
    model, tokenizer = reference
    inputs = reference_inputs(engine, tokenizer, turns, system_prompt=DEFAULT_SYSTEM_PROMPT)
    return run_reference(
        model,
        engine.ckpt.special,
        inputs["input_ids"],
        pixel_values=inputs["pixel_values"],
        image_grid_thw=inputs["image_grid_thw"],
    )


async def spoken_reply(engine, parts, item_id: str = "a1", conv=None, *, idle_first: bool = False):
    """A conversation (``conv`` or a new one) given ``parts`` as one user message, answered with speech; with
    ``idle_first`` the message is prefilled in the background (the talker following) before the response."""
    conv = conv or engine.conversation()
    await conv.add_content(f"u-{item_id}", tuple(parts))
    if idle_first:
        await engine.wait_idle()
    done, pcm = await collect(conv.respond(item_id=item_id, voice=VOICE, max_output_tokens=THINKER_MAX))
    return conv, done, pcm


async def test_a_spoken_reply_to_pictures_matches_the_reference(engine, reference):
    parts = ["Look at this:", PICTURES[0], "and this one", PICTURES[1], "What do you see?"]
    conv, done, pcm = await spoken_reply(engine, parts)
    ref_text, ref_frames = reference_reply(engine, reference, [(parts, [])])
    check_reply(engine, done, pcm, ref_text, ref_frames)
    assert done.usage.input_image_tokens == sum(engine.vision.tokens(*p.shape[:2]) for p in PICTURES)
    await conv.close()


def split_chunk_tokens(engine, reference) -> int:
    """A prefill chunk size that puts a chunk boundary in the middle of the first picture of :data:`PARTS`."""
    inputs = reference_inputs(engine, reference[1], [(PARTS, [])], system_prompt=DEFAULT_SYSTEM_PROMPT)
    ids = inputs["input_ids"][0].tolist()
    image = engine.ckpt.special.image_token
    at, n = ids.index(image), ids.count(image)
    assert n >= 4
    return at + n // 2


@pytest.mark.parametrize("idle_first", [False, True], ids=["response-prefill", "background-prefill"])
async def test_a_picture_split_across_prefill_chunks_matches_the_reference(
    qwen3_sharp_model_dir, engine, reference, idle_first
):
    chunk = split_chunk_tokens(engine, reference)
    split = OmniEngine.from_pretrained(qwen3_sharp_model_dir, stage_config(prefill_chunk_tokens=chunk), seed=1234)
    try:
        calls = []
        prefill_many = split.core.runner.thinker.prefill_many

        def recording(spans):
            calls.extend(sorted(int(rows.min()) for rows, _ in span.deepstack) for span in spans if span.deepstack)
            return prefill_many(spans)

        split.core.runner.thinker.prefill_many = recording
        conv, done, pcm = await spoken_reply(split, PARTS, idle_first=idle_first)
        assert len(calls) == 2, "the picture's deepstack rows went to two prefill chunks"
        assert calls[1] == [0, 0], "the second chunk starts inside the picture"
        ref_text, ref_frames = reference_reply(engine, reference, [(PARTS, [])])
        check_reply(split, done, pcm, ref_text, ref_frames)
        await conv.close()
    finally:
        split.close()


async def test_a_second_turn_after_a_picture_matches_the_reference(engine, reference):
    """The second turn's talker reuses the first turn's cache, the picture's 3-D positions included, and reads both
    user turns at the positions of its own sequence."""
    conv, first, _ = await spoken_reply(engine, PARTS)
    second = ["Tell me more."]
    conv, done, pcm = await spoken_reply(engine, second, "a2", conv)
    assert done.usage.cached_tokens > 0
    ref_text, ref_frames = reference_reply(engine, reference, [(PARTS, list(first.text_token_ids)), (second, [])])
    check_reply(engine, done, pcm, ref_text, ref_frames)
    await conv.close()


async def test_without_deepstack_features_the_reply_differs(engine, reference, monkeypatch):
    """The deepstack features change the sharpened model's reply: the equality above checks them."""
    import pipeline.runners.model_runner as model_runner

    monkeypatch.setattr(model_runner.ModelRunner, "_deepstack", staticmethod(lambda job, device: None))
    conv, done, _ = await spoken_reply(engine, PARTS)
    ref_text, ref_frames = reference_reply(engine, reference, [(PARTS, [])])
    assert (list(done.text_token_ids), [list(f) for f in done.audio_codes]) != (ref_text, ref_frames.tolist())
    await conv.close()


async def test_with_1d_talker_positions_the_codes_differ(engine, reference, monkeypatch):
    """The talker's 3-D positions over its own sequence change the sharpened model's codes (the text is the
    thinker's): the equality above checks them."""
    stage = engine.core.talker_stage
    monkeypatch.setattr(stage, "prompt_rope", lambda *args: None)
    monkeypatch.setattr(stage, "positions", OneDPositions(stage.positions))
    conv, done, _ = await spoken_reply(engine, PARTS)
    ref_text, ref_frames = reference_reply(engine, reference, [(PARTS, [])])
    assert list(done.text_token_ids) == ref_text
    assert [list(f) for f in done.audio_codes] != ref_frames.tolist()
    await conv.close()
