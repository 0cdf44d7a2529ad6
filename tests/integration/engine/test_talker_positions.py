"""The talker's TMRoPE positions: a spoken reply to a conversation with pictures, or with camera video interleaved with
its audio, has the codec codes of transformers' ``Qwen2_5OmniForConditionalGeneration.generate`` (greedy thinker and
talker) fed the same inputs, on the tiny checkpoint and on the sharpened one; over two turns (the talker's slot keeps
the first turn's prompt); and on the sharpened checkpoint 1-D talker positions change the codes, so the equality is
a position check."""

from __future__ import annotations

import pytest
import torch
from test_pipeline_reference import TALKER_MAX, THINKER_MAX, run_reference
from test_video import CLIP, CLIP2, Reference, speak
from transformers import AutoTokenizer, Qwen2_5OmniForConditionalGeneration

from conftest import greedy_stage_config
from pipeline.engine import OmniEngine
from pipeline.response_events import ResponseStatus
from tests.helpers.image_reference import PICTURES, reference_inputs

pytestmark = pytest.mark.slow

FIRST = ("Look at this:", PICTURES[0], "and this one", PICTURES[1], "What do you see?")
SECOND = (PICTURES[1], "Again?")


def engine_for(path) -> OmniEngine:
    cfg = greedy_stage_config(thinker={"audio_floor": "exact"}, talker={"max_tokens": TALKER_MAX})
    return OmniEngine.from_pretrained(path, cfg, seed=1234)


@pytest.fixture(scope="module", params=["tiny_model_dir", "sharp_model_dir"], ids=["plain", "sharp"])
def setup(request):
    path = request.getfixturevalue(request.param)
    engine = engine_for(path)
    model = Qwen2_5OmniForConditionalGeneration.from_pretrained(path, dtype=torch.float32).eval()
    yield engine, model, path
    engine.close()


async def spoken(conv, item_id: str):
    done = await conv.respond(item_id=item_id, max_output_tokens=THINKER_MAX).wait()
    assert done.status in (ResponseStatus.COMPLETED, ResponseStatus.INCOMPLETE), done.error
    return done


def image_reference(engine, model, path, turns) -> tuple[list[int], list[int]]:
    inputs = reference_inputs(engine, AutoTokenizer.from_pretrained(path), turns)
    pixels = inputs.pop("pixel_values")  # the thinker's alone: the talker's generate refuses it
    return run_reference(model, engine.core.special, inputs.pop("input_ids"), thinker_pixel_values=pixels, **inputs)


def video_reference(engine, model, path, turns) -> tuple[list[int], list[int]]:
    inputs = Reference(engine, model.thinker, path).inputs(turns)
    del inputs["attention_mask"]  # run_reference makes its own (left padding)
    pixels = inputs.pop("pixel_values_videos")
    return run_reference(
        model, engine.core.special, inputs.pop("input_ids"), thinker_pixel_values_videos=pixels, **inputs
    )


async def test_spoken_replies_to_pictures_match_the_reference_over_two_turns(setup):
    engine, model, path = setup
    conv = engine.conversation()
    await conv.add_content("u1", FIRST)
    done = await spoken(conv, "a1")
    ref_text, ref_codes = image_reference(engine, model, path, [(list(FIRST), [])])
    assert list(done.text_token_ids) == ref_text
    assert len(ref_codes) > 30
    assert list(done.audio_codes) == ref_codes

    await conv.add_content("u2", SECOND)
    done2 = await spoken(conv, "a2")
    turns = [(list(FIRST), list(done.text_token_ids)), (list(SECOND), [])]
    ref_text2, ref_codes2 = image_reference(engine, model, path, turns)
    assert list(done2.text_token_ids) == ref_text2
    assert list(done2.audio_codes) == ref_codes2, "the second turn's talker, on its kept prompt, equals a fresh one"
    await conv.close()


async def test_spoken_replies_to_video_with_audio_match_the_reference(setup, monkeypatch):
    """The message is spoken with the engine idle between steps: the talker's cache follows the thinker's while the
    user speaks (``listen``, at 3-D positions), and the reply's talker prefill covers only the rest."""
    engine, model, path = setup
    talker, listened = engine.core.runner.talker, []
    prefill_prompt = talker.prefill_prompt

    def spy(vectors, **kwargs):
        listened.append(kwargs.get("rope") is not None)
        return prefill_prompt(vectors, **kwargs)

    monkeypatch.setattr(talker, "prefill_prompt", spy)
    conv = engine.conversation()
    await speak(engine, conv, "u1", CLIP)
    assert any(listened), "the talker listened at explicit positions while the user spoke"
    done = await spoken(conv, "a1")
    ref_text, ref_codes = video_reference(engine, model, path, [(*CLIP, [])])
    assert list(done.text_token_ids) == ref_text
    assert len(ref_codes) > 30
    assert list(done.audio_codes) == ref_codes

    await speak(engine, conv, "u2", CLIP2)
    done2 = await spoken(conv, "a2")
    ref_text2, ref_codes2 = video_reference(engine, model, path, [(*CLIP, list(done.text_token_ids)), (*CLIP2, [])])
    assert list(done2.text_token_ids) == ref_text2
    assert list(done2.audio_codes) == ref_codes2
    await conv.close()


def flatten_talker_positions(engine) -> None:
    """Make the engine's talker run every position at its cache index (1-D), the thinker untouched."""
    talker = engine.core.runner.talker
    for name, arg in (("prefill", "rope"), ("prefill_prompt", "rope"), ("decode", "rope_shifts")):
        method = getattr(talker, name)
        setattr(talker, name, lambda *a, _m=method, _arg=arg, **k: _m(*a, **{**k, _arg: None}))
    chain = talker.decode_chain
    talker.decode_chain = lambda *a, **k: chain(*a, **{**k, "rope_shifts": None})


async def test_on_the_sharpened_checkpoint_1d_talker_positions_change_the_codes(sharp_model_dir):
    """What makes the equivalences above a talker position check: with the talker's positions 1-D (the thinker's
    still exact), the sharpened model's text equals the reference's and its codes do not."""
    engine = engine_for(sharp_model_dir)
    model = Qwen2_5OmniForConditionalGeneration.from_pretrained(sharp_model_dir, dtype=torch.float32).eval()
    flatten_talker_positions(engine)
    try:
        conv = engine.conversation()
        await conv.add_content("u1", FIRST)
        done = await spoken(conv, "a1")
        ref_text, ref_codes = image_reference(engine, model, sharp_model_dir, [(list(FIRST), [])])
        assert list(done.text_token_ids) == ref_text
        assert list(done.audio_codes) != ref_codes
        await conv.close()
        conv = engine.conversation()
        await speak(engine, conv, "u1", CLIP)
        done = await spoken(conv, "a1")
        ref_text, ref_codes = video_reference(engine, model, sharp_model_dir, [(*CLIP, [])])
        assert list(done.text_token_ids) == ref_text
        assert list(done.audio_codes) != ref_codes
        await conv.close()
    finally:
        engine.close()
