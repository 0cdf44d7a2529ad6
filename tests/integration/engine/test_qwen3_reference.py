"""The streaming engine on Qwen3-Omni == transformers' reference ``generate`` (greedy), token for token and frame for
frame (all 16 codebooks), on the tiny random checkpoint and on the sharpened one, whose greedy tokens change when a
position is wrong; the streamed code2wav audio equals the reference's one-shot decode of the same frames."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
import torch
from transformers import AutoTokenizer, Qwen3OmniMoeForConditionalGeneration, WhisperFeatureExtractor

from conftest import greedy_stage_config
from pipeline.engine import OmniEngine
from pipeline.models.qwen3_omni.prompt import DEFAULT_SYSTEM_PROMPT
from tests.helpers.qwen3_reference import (
    TALKER_MAX,
    THINKER_MAX,
    VOICE,
    check_reply,
    collect,
    run_reference,
    template_ids,
)

pytestmark = [
    pytest.mark.filterwarnings("ignore:Passing `repetition_penalty` with `inputs_embeds`:UserWarning"),
    pytest.mark.slow,
]


@pytest.fixture(scope="module", params=["qwen3_model_dir", "qwen3_sharp_model_dir"], ids=["plain", "sharp"])
def model_dir(request):
    return request.getfixturevalue(request.param)


@pytest.fixture(scope="module")
def engine(model_dir):
    config = greedy_stage_config(family="qwen3_omni", talker={"max_tokens": TALKER_MAX})
    engine = OmniEngine.from_pretrained(model_dir, config, seed=1234)
    yield engine
    engine.close()


@pytest.fixture(scope="module")
def reference(model_dir):
    model = Qwen3OmniMoeForConditionalGeneration.from_pretrained(model_dir, dtype=torch.float32).eval()
    return model, AutoTokenizer.from_pretrained(model_dir), WhisperFeatureExtractor.from_pretrained(model_dir)


async def test_text_prompt_matches_reference(engine, reference):
    model, tokenizer, _ = reference
    messages = [
        {"role": "system", "content": DEFAULT_SYSTEM_PROMPT},
        {"role": "user", "content": "Hello, who are you?"},
    ]
    ref_text, ref_frames = run_reference(model, engine.ckpt.special, template_ids(tokenizer, messages))

    conv = engine.conversation()
    await conv.add_text("u1", "Hello, who are you?")
    done, pcm = await collect(conv.respond(item_id="a1", voice=VOICE, max_output_tokens=THINKER_MAX))
    check_reply(engine, done, pcm, ref_text, ref_frames)
    await conv.close()


async def test_second_turn_matches_reference(engine, reference):
    """The second turn's talker reads both user turns and not the first reply (the reference's prompt), reusing the
    talker cache of the first."""
    model, tokenizer, _ = reference
    special = engine.ckpt.special
    conv = engine.conversation()
    await conv.add_text("u1", "Hello, who are you?")
    first, _ = await collect(conv.respond(item_id="a1", voice=VOICE, max_output_tokens=THINKER_MAX))
    await conv.add_text("u2", "Tell me more.")
    done, pcm = await collect(conv.respond(item_id="a2", voice=VOICE, max_output_tokens=THINKER_MAX))

    first_ids = tokenizer.apply_chat_template(
        [{"role": "system", "content": DEFAULT_SYSTEM_PROMPT}, {"role": "user", "content": "Hello, who are you?"}],
        add_generation_prompt=True,
        tokenize=False,
    )
    history = tokenizer(first_ids, add_special_tokens=False)["input_ids"] + list(first.text_token_ids)
    history += [special.im_end, *tokenizer("\n", add_special_tokens=False)["input_ids"]]  # the reply, closed
    second = tokenizer(
        tokenizer.apply_chat_template(
            [{"role": "user", "content": "Tell me more."}], add_generation_prompt=True, tokenize=False
        ),
        add_special_tokens=False,
    )["input_ids"]
    ref_text, ref_frames = run_reference(model, special, torch.tensor([history + second]))
    check_reply(engine, done, pcm, ref_text, ref_frames)
    assert done.usage.cached_tokens > 0
    await conv.close()


@pytest.mark.parametrize(("seconds", "streamed"), [(3, False), (10, True)], ids=["whole", "streamed"])
async def test_audio_prompt_matches_reference(engine, reference, seconds, streamed):
    """A spoken turn, added whole, or streamed in 20 ms pieces while the conversation is idle: its first 8 s block is
    encoded and prefilled (thinker and talker) before the commit, the tail after; the reply equals the reference's
    over the whole message (incremental prefill == one shot)."""
    model, tokenizer, fe = reference
    special = engine.ckpt.special
    rng = np.random.default_rng(7)
    pcm_in = (0.1 * rng.standard_normal(16_000 * seconds)).astype(np.float32)  # noise: the encoder sees real frames

    conv = engine.conversation()
    if streamed:
        audio = conv.open_audio("u1")
        await engine.wait_idle()
        before = await engine.stats()
        for start in range(0, len(pcm_in), 320):
            audio.append(pcm_in[start : start + 320])
        await engine.wait_idle()
        during = await engine.stats()
        # the first block was prefilled while "speaking", by the thinker and (listening) the talker
        assert during.cached_tokens > before.cached_tokens
        assert during.talker_cached_tokens > before.talker_cached_tokens
        await audio.commit()
    else:
        await conv.add_audio("u1", pcm_in)
    done, pcm = await collect(conv.respond(item_id="a1", voice=VOICE, max_output_tokens=THINKER_MAX))

    feats = fe(pcm_in, sampling_rate=16_000, return_tensors="pt", padding=True, truncation=False)
    mel = feats["input_features"]
    mask = torch.ones(1, mel.shape[-1], dtype=torch.long)
    n_tokens = done.usage.input_audio_tokens
    renderer = engine.ckpt.tokenizer
    system = template_ids(tokenizer, [{"role": "system", "content": DEFAULT_SYSTEM_PROMPT}])[0].tolist()
    system = system[: system.index(special.im_end) + 2]  # the system message without the generation prompt
    user = (
        [special.im_start, *renderer("user\n", add_special_tokens=False)["input_ids"], special.audio_start]
        + [special.audio_token] * n_tokens
        + [special.audio_end, special.im_end, *renderer("\n", add_special_tokens=False)["input_ids"]]
    )
    header = [special.im_start, *renderer("assistant\n", add_special_tokens=False)["input_ids"]]
    ids = torch.tensor([system + user + header])
    ref_text, ref_frames = run_reference(model, special, ids, input_features=mel, feature_attention_mask=mask)
    check_reply(engine, done, pcm, ref_text, ref_frames)
    await conv.close()


async def test_replies_at_once_equal_each_alone(engine):
    """Two conversations replying at the same time share the talker's batched steps (rows at different positions and
    lengths) and the code2wav worker's batched chunks; each gets what it gets alone."""
    prompts = ("Hello, who are you?", "What is the weather like today in the city?")

    async def reply(text: str, name: str):
        conv = engine.conversation()
        await conv.add_text(f"{name}-u", text)
        done, pcm = await collect(conv.respond(item_id=f"{name}-a", voice=VOICE, max_output_tokens=THINKER_MAX))
        await conv.close()
        return done, pcm

    alone = [await reply(text, f"alone{i}") for i, text in enumerate(prompts)]
    together = await asyncio.gather(*(reply(text, f"together{i}") for i, text in enumerate(prompts)))
    for (done_a, pcm_a), (done_t, pcm_t) in zip(alone, together):
        assert done_t.text_token_ids == done_a.text_token_ids
        assert done_t.audio_codes == done_a.audio_codes
        # batched code2wav chunks differ from single ones only in summation order
        np.testing.assert_allclose(pcm_t, pcm_a, atol=1e-4)
