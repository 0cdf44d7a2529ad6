"""A checkpoint without a talker (Qwen3-Omni with ``enable_audio_output: false``, like the released -Thinking ones) is
served in text only: the engine builds no talker runner, talker stage or token2wav and says so in its facts; its text
replies, to text and to speech, equal transformers' greedy ``generate``; a spoken response is refused with
``UnsupportedInputError`` before anything runs, and the conversation goes on."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from transformers import AutoTokenizer, Qwen3OmniMoeForConditionalGeneration, WhisperFeatureExtractor

from conftest import greedy_stage_config
from pipeline.core.commands import StartResponseCommand
from pipeline.core.response_state import ResponseSpec
from pipeline.engine import OmniEngine
from pipeline.errors import UnknownVoiceError, UnsupportedInputError
from pipeline.models.qwen3_omni.prompt import DEFAULT_SYSTEM_PROMPT
from pipeline.response_events import AudioChunk, ResponseDone, ResponseStatus, TextDelta

MAX_TOKENS = 12
TEXT = frozenset({"text"})


@pytest.fixture(scope="module")
def engine(qwen3_text_model_dir):
    engine = OmniEngine.from_pretrained(qwen3_text_model_dir, greedy_stage_config(family="qwen3_omni"), seed=1234)
    yield engine
    engine.close()


@pytest.fixture(scope="module")
def reference(qwen3_text_model_dir):
    model = Qwen3OmniMoeForConditionalGeneration.from_pretrained(qwen3_text_model_dir, dtype=torch.float32).eval()
    assert not model.has_talker
    return model, AutoTokenizer.from_pretrained(qwen3_text_model_dir)


def reference_reply(model, special, input_ids: torch.Tensor, **kwargs) -> list[int]:
    """transformers' greedy reply (the thinker alone: the model has no talker), without its stop token."""
    with torch.inference_mode():
        seqs = model.generate(
            input_ids=input_ids,
            thinker_max_new_tokens=MAX_TOKENS,
            thinker_do_sample=False,
            thinker_repetition_penalty=1.0,
            thinker_eos_token_id=special.im_end,
            **kwargs,
        )
    seqs = seqs if isinstance(seqs, torch.Tensor) else seqs.sequences
    return [t for t in seqs[0, input_ids.shape[1] :].tolist() if t not in (special.im_end, special.endoftext)]


async def text_reply(conv, item_id: str) -> tuple[ResponseDone, str]:
    events = [ev async for ev in conv.respond(item_id=item_id, modalities=TEXT, max_output_tokens=MAX_TOKENS)]
    done = events[-1]
    assert isinstance(done, ResponseDone), done
    assert done.status in (ResponseStatus.COMPLETED, ResponseStatus.INCOMPLETE), done.error
    assert not any(isinstance(e, AudioChunk) for e in events) and done.usage.output_audio_tokens == 0
    return done, "".join(e.text for e in events if isinstance(e, TextDelta))


def test_the_engine_builds_no_talker_and_says_it_has_no_audio_output(engine):
    assert (engine.audio_output, engine.voices, engine.default_voice) == (False, (), None)
    core = engine.core
    assert core.talker_stage is None and core.phases.talker_stage is None
    assert core.runner.talker is None and core.runner.token2wav is None and core.runner.worker is None
    assert core.scheduler.talker_slots is None and core.t2w_device is None
    assert core.devices == (torch.device("cpu"),) == core.decode_devices
    assert any("thinker KV slots" in line for line in core.describe())


async def test_a_text_reply_matches_the_reference(engine, reference):
    model, tokenizer = reference
    messages = [
        {"role": "system", "content": DEFAULT_SYSTEM_PROMPT},
        {"role": "user", "content": "Hello, who are you?"},
    ]
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_tensors="pt")
    ids = ids if isinstance(ids, torch.Tensor) else ids["input_ids"]
    expected = reference_reply(model, engine.ckpt.special, ids)

    conv = engine.conversation()
    await conv.add_text("u1", "Hello, who are you?")
    done, text = await text_reply(conv, "a1")
    assert list(done.text_token_ids) == expected and len(expected) > 0
    assert text == tokenizer.decode(expected)
    assert not engine.core.scheduler.conversations[conv.id].talker_vectors  # nothing kept for a talker
    await conv.close()


async def test_a_reply_to_speech_matches_the_reference(engine, reference, qwen3_text_model_dir):
    model, tokenizer = reference
    special = engine.ckpt.special
    pcm = (0.1 * np.random.default_rng(7).standard_normal(16_000 * 3)).astype(np.float32)
    conv = engine.conversation()
    await conv.add_audio("u1", pcm)
    done, _ = await text_reply(conv, "a1")

    fe = WhisperFeatureExtractor.from_pretrained(qwen3_text_model_dir)
    mel = fe(pcm, sampling_rate=16_000, return_tensors="pt", padding=True, truncation=False)["input_features"]
    system = tokenizer.apply_chat_template(
        [{"role": "system", "content": DEFAULT_SYSTEM_PROMPT}], add_generation_prompt=False, tokenize=False
    )

    def words(text: str) -> list[int]:
        return tokenizer(text, add_special_tokens=False)["input_ids"]

    ids = (
        words(system)
        + [special.im_start, *words("user\n"), special.audio_start]
        + [special.audio_token] * done.usage.input_audio_tokens
        + [special.audio_end, special.im_end, *words("\n"), special.im_start, *words("assistant\n")]
    )
    mask = torch.ones(1, mel.shape[-1], dtype=torch.long)
    expected = reference_reply(model, special, torch.tensor([ids]), input_features=mel, feature_attention_mask=mask)
    assert list(done.text_token_ids) == expected and expected and done.usage.input_audio_tokens > 0
    await conv.close()


async def test_asking_for_audio_is_refused_before_anything_runs_and_the_conversation_goes_on(engine):
    conv = engine.conversation()
    await conv.add_text("u1", "Hi")
    for modalities in (frozenset({"text", "audio"}), frozenset({"audio"})):
        with pytest.raises(UnsupportedInputError, match="text only") as caught:
            conv.respond(item_id="spoken", modalities=modalities)
        assert (caught.value.code, caught.value.param) == ("unsupported_input", "modalities")
    with pytest.raises(UnknownVoiceError, match="text only"):
        conv.respond(item_id="voiced", modalities=TEXT, voice="Ethan")
    stats = await engine.stats()
    assert stats.responses == 0 and stats.talker_tokens_total == 0

    first, _ = await text_reply(conv, "a1")
    await conv.add_text("u2", "And then?")
    second, _ = await text_reply(conv, "a2")
    assert second.usage.cached_tokens > 0 and first.text_token_ids
    items = await engine._call(lambda core: [item.id for item in core.scheduler.conversations[conv.id].items])
    assert items == ["u1", "a1", "u2", "a2"]  # the refused responses left nothing behind
    await conv.close()


async def test_the_core_itself_refuses_a_spoken_response(engine):
    """A request that skips the async API's check (a spoken ``StartResponseCommand``) is refused by the core, leaving no
    reply item."""
    conv = engine.conversation()
    await conv.add_text("u1", "Hi")
    spec = ResponseSpec(
        id="spoken", conv_id=conv.id, item_id="a1", audio=True, voice=None, max_text_tokens=4, sink=lambda ev: None
    )
    with pytest.raises(UnsupportedInputError, match="text only"):
        await engine._call(StartResponseCommand(spec))
    items = await engine._call(lambda core: [item.id for item in core.scheduler.conversations[conv.id].items])
    assert items == ["u1"]
    await conv.close()
