"""Streaming pipeline == transformers' reference ``generate`` (greedy), token for token, on the tiny checkpoint and
on the sharpened one (``sharp_model_dir``), whose greedy tokens change when a position is wrong."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from transformers import AutoTokenizer, Qwen2_5OmniForConditionalGeneration, WhisperFeatureExtractor

from conftest import greedy_stage_config
from pipeline.engine import OmniEngine
from pipeline.models.common.hf_parts import thinker_audio_tower
from pipeline.models.qwen2_5_omni.prompt import DEFAULT_SYSTEM_PROMPT
from pipeline.response_events import AudioChunk, ResponseDone, ResponseStatus, TextDelta

pytestmark = pytest.mark.slow

THINKER_MAX = 12
TALKER_MAX = 120


@pytest.fixture(scope="module", params=["tiny_model_dir", "sharp_model_dir"], ids=["plain", "sharp"])
def model_dir(request):
    return request.getfixturevalue(request.param)


@pytest.fixture(scope="module")
def engine(model_dir, tiny_model_dir, request):
    """The shared greedy engine on the plain checkpoint; one like it on the sharpened one."""
    if model_dir == tiny_model_dir:
        yield request.getfixturevalue("tiny_engine")
        return
    engine = OmniEngine.from_pretrained(model_dir, greedy_stage_config(talker={"max_tokens": 120}), seed=1234)
    yield engine
    engine.close()


@pytest.fixture(scope="module")
def reference(model_dir):
    model = Qwen2_5OmniForConditionalGeneration.from_pretrained(model_dir, dtype=torch.float32).eval()
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    fe = WhisperFeatureExtractor.from_pretrained(model_dir)
    return model, tokenizer, fe


def run_reference(model, special, input_ids, **audio_kwargs):
    """Reference generate with greedy thinker and talker; returns (reply ids, codec ids).

    The prompt is left-padded by one token. Why: the talker adds the codec pad/bos embeddings to
    its last two prompt positions only when it receives an attention mask (as with the official
    processor), but transformers 5.x ``generate`` drops an all-ones mask, silently skipping that
    step. One padding position keeps the mask, and so the released model's behaviour, which the
    engine implements."""
    input_ids = torch.cat([torch.tensor([[special.endoftext]]), input_ids], dim=1)
    mask = torch.ones_like(input_ids)
    mask[0, 0] = 0
    captured = {}
    talker_generate = model.talker.generate

    def record(*args, **kwargs):
        out = talker_generate(*args, **kwargs)
        captured["codes"] = out[0, kwargs["input_ids"].shape[1] :].tolist()
        return out

    model.talker.generate = record
    try:
        with torch.inference_mode():
            seqs, _wav = model.generate(
                input_ids=input_ids,
                attention_mask=mask,
                speaker="Chelsie",
                thinker_max_new_tokens=THINKER_MAX,
                thinker_do_sample=False,
                thinker_repetition_penalty=1.0,
                talker_do_sample=False,
                talker_max_new_tokens=TALKER_MAX,
                talker_eos_token_id=list(special.codec_stop_ids()),
                **audio_kwargs,
            )
    finally:
        model.talker.generate = talker_generate
    reply = seqs[0, input_ids.shape[1] :].tolist()
    stop_text = {special.im_end, special.endoftext}
    reply = [t for t in reply if t not in stop_text]
    codes = captured["codes"]
    stops = [i for i, c in enumerate(codes) if c in special.codec_stop_ids()]
    return reply, codes[: stops[0]] if stops else codes


async def collect(resp):
    events = [ev async for ev in resp]
    assert isinstance(events[-1], ResponseDone)
    return events


async def test_text_prompt_matches_reference(engine, reference):
    model, tokenizer, _ = reference
    special = engine.ckpt.special
    messages = [
        {"role": "system", "content": DEFAULT_SYSTEM_PROMPT},
        {"role": "user", "content": "Hello, who are you?"},
    ]
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_tensors="pt")
    ids = ids["input_ids"] if not isinstance(ids, torch.Tensor) else ids
    ref_text, ref_codes = run_reference(model, special, ids)

    conv = engine.conversation()
    await conv.add_text("u1", "Hello, who are you?")
    events = await collect(conv.respond(item_id="a1", max_output_tokens=THINKER_MAX))
    done = events[-1]
    assert done.status in (ResponseStatus.COMPLETED, ResponseStatus.INCOMPLETE)
    assert list(done.text_token_ids) == ref_text
    assert len(ref_codes) > 30, "the tiny talker should speak for a while"
    assert list(done.audio_codes) == ref_codes
    await conv.close()


async def test_a_greeting_matches_reference(engine, reference):
    """A response with no user input answers the instructions alone: the prompt is the system message and the start
    of the assistant's turn, exactly what the chat template makes of the instructions with a generation prompt."""
    model, tokenizer, _ = reference
    special = engine.ckpt.special
    messages = [{"role": "system", "content": DEFAULT_SYSTEM_PROMPT}]
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_tensors="pt")
    ids = ids["input_ids"] if not isinstance(ids, torch.Tensor) else ids
    ref_text, ref_codes = run_reference(model, special, ids)

    conv = engine.conversation()
    done = (await collect(conv.respond(item_id="a1", max_output_tokens=THINKER_MAX)))[-1]
    assert done.status in (ResponseStatus.COMPLETED, ResponseStatus.INCOMPLETE), done.error
    assert done.usage.input_tokens == ids.shape[1]
    assert list(done.text_token_ids) == ref_text and len(ref_text) > 0
    assert list(done.audio_codes) == ref_codes
    await conv.close()


async def test_audio_prompt_matches_reference(engine, reference):
    model, tokenizer, fe = reference
    special = engine.ckpt.special
    rng = np.random.default_rng(0)
    t = np.arange(int(1.7 * 16000)) / 16000
    pcm = (0.3 * np.sin(2 * np.pi * 220 * t) + 0.05 * rng.standard_normal(t.size)).astype(np.float32)

    feats = fe(pcm, sampling_rate=16000, return_attention_mask=True, padding="max_length", return_tensors="pt")
    n_frames = int(feats["attention_mask"].sum())
    _, n_audio = thinker_audio_tower(model.thinker)._get_feat_extract_output_lengths(torch.tensor(n_frames))
    system = tokenizer.encode(f"system\n{DEFAULT_SYSTEM_PROMPT}", add_special_tokens=False)
    nl = tokenizer.encode("\n", add_special_tokens=False)
    user = tokenizer.encode("user\n", add_special_tokens=False)
    asst = tokenizer.encode("assistant\n", add_special_tokens=False)
    s = special
    ids = (
        [s.im_start, *system, s.im_end, *nl, s.im_start, *user, s.audio_start]
        + [s.audio_token] * int(n_audio)
        + [s.audio_end, s.im_end, *nl, s.im_start, *asst]
    )
    # the chat template renders the same layout
    templ = tokenizer.apply_chat_template(
        [{"role": "system", "content": DEFAULT_SYSTEM_PROMPT}, {"role": "user", "content": [{"type": "audio"}]}],
        add_generation_prompt=True,
        tokenize=False,
    )
    assert templ.count("<|AUDIO|>") == 1
    ref_text, ref_codes = run_reference(
        model,
        special,
        torch.tensor([ids]),
        input_features=feats["input_features"],
        feature_attention_mask=feats["attention_mask"],
    )

    conv = engine.conversation()
    await conv.add_audio("u1", pcm)
    events = await collect(conv.respond(item_id="a1", max_output_tokens=THINKER_MAX))
    done = events[-1]
    assert done.usage.input_audio_tokens == int(n_audio)
    assert list(done.text_token_ids) == ref_text
    assert list(done.audio_codes) == ref_codes
    await conv.close()


async def test_first_audio_precedes_talker_end_and_events_are_ordered(tiny_engine):
    conv = tiny_engine.conversation()
    await conv.add_text("u1", "Tell me something long.")
    events = await collect(conv.respond(item_id="a1", max_output_tokens=THINKER_MAX))
    done = events[-1]
    chunks = [e for e in events if isinstance(e, AudioChunk)]
    assert chunks, "no audio"
    # the first chunk left while the talker was still sampling codes
    assert chunks[0].codec_tokens_so_far < len(done.audio_codes)
    # chunks are contiguous and cover the reply: 480 samples (20 ms at 24 kHz) per codec token
    starts = [c.start_sample for c in chunks]
    assert starts == list(np.cumsum([0] + [len(c.pcm) for c in chunks[:-1]]))
    assert done.audio_samples == sum(len(c.pcm) for c in chunks) == 480 * len(done.audio_codes)
    assert all(c.pcm.dtype == np.float32 for c in chunks)
    assert float(np.sqrt(np.mean(np.concatenate([c.pcm for c in chunks]) ** 2))) > 0.01
    assert "".join(e.text for e in events if isinstance(e, TextDelta)) == done.text
    await conv.close()
