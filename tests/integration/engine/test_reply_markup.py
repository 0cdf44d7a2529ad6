"""Reply text never carries a tokenizer's markup: added tokens such as ``<tool_response>`` or ``<|fim_prefix|>``
(not flagged special, so ``skip_special_tokens`` keeps their text) stay in the reply's tokens but add no text."""

from __future__ import annotations

import pytest
from transformers import AutoTokenizer

from conftest import greedy_stage_config
from pipeline.engine import OmniEngine
from pipeline.output.detokenizer import IncrementalDetokenizer, markup_ids
from pipeline.response_events import ResponseDone, TextDelta

MARKUP = ("<tool_response>", "<|fim_prefix|>", "<think>", "</tool_response>")


@pytest.fixture(scope="module")
def tokenizer(qwen3_model_dir):
    return AutoTokenizer.from_pretrained(qwen3_model_dir)


def test_markup_ids_are_the_added_tokens_and_no_plain_text(tokenizer):
    ids = markup_ids(tokenizer)
    assert {tokenizer.convert_tokens_to_ids(t) for t in (*MARKUP, "<|im_end|>", "<tool_call>")} <= ids
    assert not ids & set(tokenizer.encode("Hello world, five cats.", add_special_tokens=False))


def test_the_detokenizer_drops_markup_between_text_pieces(tokenizer):
    def decode(ids: list[int]) -> str:
        return tokenizer.decode(ids, skip_special_tokens=True)

    pieces = ["Hello", *MARKUP[:2], " wor", MARKUP[2], "ld", MARKUP[3]]
    ids = [i for p in pieces for i in tokenizer.encode(p, add_special_tokens=False)]
    assert "<tool_response>" in decode(ids), "skip_special_tokens alone keeps the markup's text"
    detok = IncrementalDetokenizer(decode, hidden=markup_ids(tokenizer))
    deltas = [detok.push(i) for i in ids]
    assert "".join(deltas) + detok.flush() == detok.text == "Hello world"


@pytest.mark.slow
async def test_a_reply_sampling_markup_streams_none_of_it(qwen3_model_dir, tokenizer, monkeypatch):
    """The engine's replies decode through the hidden markup: every other sampled token is replaced by a markup
    token; the streamed deltas and the reply's text hold the other tokens' text only, while its tokens keep all."""
    markup = [tokenizer.convert_tokens_to_ids(t) for t in MARKUP]
    engine = OmniEngine.from_pretrained(qwen3_model_dir, greedy_stage_config(family="qwen3_omni"), seed=1234)
    try:
        output = engine.core.output
        accept = output.accept_text_token
        count = [0]

        def with_markup(r, token):  # on the engine thread, as each sampled reply token arrives
            count[0] += 1
            accept(r, markup[count[0] // 2 % len(markup)] if count[0] % 2 else token)

        monkeypatch.setattr(output, "accept_text_token", with_markup)
        conv = engine.conversation()
        await conv.add_text("u1", "Hello")
        events = [ev async for ev in conv.respond(item_id="a1", max_output_tokens=12)]
    finally:
        engine.close()
    done = events[-1]
    assert isinstance(done, ResponseDone) and len(done.text_token_ids) >= 4
    assert set(done.text_token_ids[::2]) <= set(markup), "the markup stays in the reply's tokens"
    plain = [t for t in done.text_token_ids if t not in markup]
    streamed = "".join(ev.text for ev in events if isinstance(ev, TextDelta))
    assert streamed == done.text == tokenizer.decode(plain, skip_special_tokens=True)
    assert not any(m in done.text for m in MARKUP)
