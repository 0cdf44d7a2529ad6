"""The Qwen3-Omni talker streamed text token by text token (pipeline/models/qwen3_omni/talker.py, code_predictor.py,
talker_positions.py) equals transformers' ``generate``: on a tiny random model (sharpened talker attention, so a
wrong position changes codes), the streaming loop below — only our pieces, the HF talker body's forward over a
DynamicCache, and our code predictor, reply tokens consumed one at a time — yields the reference's codes [T, 16]."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch
from transformers import DynamicCache
from transformers.generation.logits_process import TopKLogitsWarper, TopPLogitsWarper
from transformers.models.qwen3_omni_moe.modeling_qwen3_omni_moe import _get_feat_extract_output_lengths

from pipeline.errors import InvalidInputError, UnknownVoiceError, UnsupportedInputError
from pipeline.models.qwen3_omni.talker import (
    ASSISTANT_PART_LEN,
    CodecRules,
    TalkerInputs,
    TalkerTextEnd,
    TalkerTokens,
    step_text,
    user_mask,
)
from pipeline.models.qwen3_omni.talker_positions import decode_position, prompt_positions
from tests.helpers.qwen3_code_predictor import CodePredictor, TopKTopP
from tests.helpers.qwen3_tiny_config import TINY_IDS as I
from tests.helpers.qwen3_tiny_config import sharpen_talker, tiny_qwen3_model

MEL_FRAMES = 100
EOS_BIAS = 50.0
MARKERS = [i for i in range(I.vision_end, I.image + 1) if i != I.im_end]
"""Thinker ids a random thinker must not write into a reply (a generated placeholder would be fed back as one)."""

pytestmark = pytest.mark.filterwarnings("ignore:Passing `repetition_penalty` with `inputs_embeds`:UserWarning")


@pytest.fixture(scope="module")
def model():
    m = tiny_qwen3_model(seed=0)
    sharpen_talker(m)
    return m


@pytest.fixture(scope="module")
def tokens(model) -> TalkerTokens:
    return TalkerTokens.of(model.config)


@pytest.fixture(scope="module")
def inputs(model, tokens) -> TalkerInputs:
    return TalkerInputs(model.talker, model.thinker.get_input_embeddings(), tokens)


def turn(role: int, body: list[int]) -> list[int]:
    return [I.im_start, role, I.newline, *body, I.im_end, I.newline]


SYSTEM = turn(I.system, [20, 21, 22])
"""8 positions: a chunk cut at 11 holds the user turn's first 3 positions, one cut at 13 its first audio token."""
HEADER = [I.im_start, I.assistant, I.newline]
AUDIO = [I.audio_start, *[I.audio] * int(_get_feat_extract_output_lengths(torch.tensor(MEL_FRAMES))), I.audio_end]


@dataclass
class Reference:
    prompt: torch.Tensor  # (L,) thinker prompt ids
    reply: list[int]  # every generated thinker token
    embeds: torch.Tensor  # (L, H) thinker input embeddings of the prompt
    hidden: torch.Tensor  # (L, H) thinker hidden states at accept_hidden_layer
    talker_embeds: torch.Tensor  # (P, H) the talker prompt generate built
    talker_ids: list[int]
    trailing: torch.Tensor  # (n, H) generate's trailing_text_hidden
    codes: torch.Tensor  # (T, 16)


def reference(model, prompt: list[int], *, audio: bool = False, **kwargs) -> Reference:
    """transformers' ``generate`` (greedy), with its thinker result, talker inputs and codes recorded on the way."""
    seen = {}
    thinker_generate, talker_generate, decode = model.thinker.generate, model.talker.generate, model.code2wav
    chunked = decode.chunked_decode

    def record_thinker(*a, **kw):
        seen["thinker"] = thinker_generate(*a, **kw)
        return seen["thinker"]

    def record_talker(*a, **kw):
        seen["talker"] = kw
        return talker_generate(*a, **kw)

    def record_codes(codes, **kw):
        seen["codes"] = codes
        return chunked(codes, **kw)

    model.thinker.generate, model.talker.generate, decode.chunked_decode = record_thinker, record_talker, record_codes
    try:
        ids = torch.tensor([prompt])
        if audio:
            torch.manual_seed(1)
            kwargs["input_features"] = torch.randn(1, 128, MEL_FRAMES)
            kwargs["feature_attention_mask"] = torch.ones(1, MEL_FRAMES, dtype=torch.long)
        kwargs.setdefault("thinker_eos_token_id", I.im_end)
        kwargs["thinker_suppress_tokens"] = MARKERS + kwargs.get("thinker_suppress_tokens", [])
        model.generate(input_ids=ids, thinker_do_sample=False, talker_do_sample=False, speaker="Ethan", **kwargs)
    finally:
        del model.thinker.generate, model.talker.generate, decode.chunked_decode
    thinker, talker = seen["thinker"], seen["talker"]
    first = thinker.hidden_states[0]
    layer = model.config.talker_config.accept_hidden_layer
    return Reference(
        prompt=ids[0],
        reply=thinker.sequences[0, len(prompt) :].tolist(),
        embeds=first[0][0],
        hidden=first[layer][0],
        talker_embeds=talker["inputs_embeds"][0],
        talker_ids=talker["talker_input_ids"][0].tolist(),
        trailing=talker["trailing_text_hidden"][0],
        codes=seen["codes"][0].T,
    )


@dataclass(frozen=True)
class Forcing:
    """The test's own logits forcing, mirrored from the ``talker_*`` kwargs it passes to ``generate``: eos
    suppressed before ``min_codes`` codes (``min_new_tokens``), then biased (``sequence_bias``)."""

    min_codes: int = 0
    eos_bias: float = 0.0

    def kwargs(self, eos: int) -> dict:
        out = {"talker_min_new_tokens": self.min_codes} if self.min_codes else {}
        if self.eos_bias:
            out["talker_sequence_bias"] = {(eos,): self.eos_bias}
        return out


def user_vectors(inputs, tokens, ref: Reference, cuts: tuple[int, ...]) -> tuple[torch.Tensor, list[int]]:
    """The user part as the engine makes it: chunk by chunk of the thinker prompt (cut at ``cuts``), each chunk's
    user-role positions only; the first chunk from the thinker's input embeddings, the others from the ids."""
    mask = user_mask(ref.prompt, tokens)
    parts, ids = [], []
    bounds = [0, *cuts, len(ref.prompt)]
    for a, b in zip(bounds, bounds[1:]):
        m = mask[a:b]
        parts.append(inputs.user_part(ref.prompt[a:b][m], ref.hidden[a:b][m], ref.embeds[a:b][m] if a == 0 else None))
        ids += ref.prompt[a:b][m].tolist()
    return torch.cat(parts), ids


def stream(model, inputs, tokens, ref: Reference, *, max_codes: int, forcing=Forcing(), cuts=(11,), shift=0):
    """The per-step contract: prefill [user part, assistant part] at the talker prompt's positions; then per frame:
    codebook 0 from the last hidden state (penalty, suppression), stop at codec eos, residual codes from the code
    predictor, next input = frame embedding + the step's text part, reply tokens taken one at a time as needed.
    ``shift``: added to every decode position (a deliberately wrong rope position, for the negative control)."""
    talker, predictor = model.talker, CodePredictor(model.talker)
    rules = CodecRules.of(tokens)
    with torch.inference_mode():
        user, ids = user_vectors(inputs, tokens, ref, cuts)
        known = 1  # reply tokens the thinker has produced so far
        prefill = torch.cat(
            (user, inputs.assistant_part(ref.prompt[-3:].tolist(), tokens.speaker("ethan"), ref.reply[0]))
        )
        positions, delta = prompt_positions(ids + inputs.assistant_ids(), tokens)
        cache = DynamicCache(config=talker.model.config)
        out = talker.model(inputs_embeds=prefill[None], position_ids=positions[:, None], cache=cache, use_cache=True)
        hidden = out.last_hidden_state[:, -1]
        history: list[int] = []
        frames = []
        for step in range(max_codes):
            logits = talker.codec_head(hidden).float()
            logits[:, rules.stop] += forcing.eos_bias
            logits = rules.process(logits, [history])
            if len(history) < forcing.min_codes:
                logits[:, rules.stop] = float("-inf")
            code0 = logits.argmax(-1)
            history.append(int(code0))
            if int(code0) == rules.stop or step == max_codes - 1:
                break  # no frame for eos; a code drawn at the length limit is never fed back, so it has no frame
            codes = torch.cat((code0[:, None], predictor.predict(hidden, code0)), dim=1)
            frames.append(codes[0])
            while (part := step_text(step, known, known == len(ref.reply))) is None:
                known += 1  # the thinker produces its next token
            text = inputs.text_vector(ref.reply[part]) if isinstance(part, int) else inputs.end_vector(part)
            x = inputs.frame_embedding(codes) + text
            pos = torch.full((3, 1, 1), decode_position(prefill.shape[0], delta, step) + shift)
            out = talker.model(inputs_embeds=x[:, None], position_ids=pos, cache=cache, use_cache=True)
            hidden = out.last_hidden_state[:, -1]
    return torch.stack(frames), prefill, ids + inputs.assistant_ids()


def check(model, inputs, tokens, prompt, *, max_codes=10, forcing=Forcing(), cuts=(11,), **kwargs) -> torch.Tensor:
    ref = reference(model, prompt, talker_max_new_tokens=max_codes, **forcing.kwargs(tokens.codec_eos), **kwargs)
    codes, prefill, ids = stream(model, inputs, tokens, ref, max_codes=max_codes, forcing=forcing, cuts=cuts)
    assert ids == ref.talker_ids
    torch.testing.assert_close(prefill, ref.talker_embeds, rtol=1e-6, atol=1e-6)
    assert codes.shape[0] >= 3 and torch.equal(codes, ref.codes), (codes, ref.codes)
    return codes


def test_text_prompt_reply_ending_with_im_end(model, inputs, tokens):
    # the reply's 6th token is forced to be <|im_end|>: the talker gets tts_eos in its place
    prompt = SYSTEM + turn(I.user, [30, 31, 32, 33]) + HEADER
    check(model, inputs, tokens, prompt, thinker_max_new_tokens=6, thinker_forced_eos_token_id=I.im_end)


def test_reply_cut_at_its_length_limit_and_talker_stopped_by_eos(model, inputs, tokens):
    # no <|im_end|>: the reply's last token is still replaced by tts_eos; the talker draws eos after 7 codes
    prompt = SYSTEM + turn(I.user, [40, 41, 42]) + HEADER
    forcing = Forcing(min_codes=7, eos_bias=EOS_BIAS)
    codes = check(
        model, inputs, tokens, prompt, max_codes=12, forcing=forcing,
        thinker_max_new_tokens=4, thinker_suppress_tokens=[I.im_end],
    )  # fmt: skip
    assert codes.shape[0] == 7


def test_audio_prompt(model, inputs, tokens):
    prompt = SYSTEM + turn(I.user, [*AUDIO, 50, 51]) + HEADER
    check(model, inputs, tokens, prompt, audio=True, cuts=(13, 20), thinker_max_new_tokens=5)


def test_two_turns(model, inputs, tokens):
    # the first reply (and the system turn) is left out of the talker's prompt; both user turns are in it
    first_reply = turn(I.assistant, [60, 61, 62])
    prompt = SYSTEM + turn(I.user, [*AUDIO, 52]) + first_reply + turn(I.user, [53, 54]) + HEADER
    check(model, inputs, tokens, prompt, audio=True, cuts=(len(SYSTEM) + 6, len(prompt) - 6), thinker_max_new_tokens=4)
    mask = user_mask(torch.tensor(prompt), tokens)
    assert mask.sum() == len(prompt) - len(SYSTEM) - len(first_reply) - len(HEADER)


def test_trailing_text_is_the_reference_rule(model, inputs, tokens):
    """Every step's text part equals generate's ``trailing_text_hidden`` entry, then tts_pad."""
    ref = reference(model, SYSTEM + turn(I.user, [30, 31]) + HEADER, talker_max_new_tokens=2, thinker_max_new_tokens=5)
    with torch.inference_mode():
        parts = []
        for step in range(len(ref.reply) + 2):
            part = step_text(step, len(ref.reply), done=True)
            parts.append(inputs.text_vector(ref.reply[part]) if isinstance(part, int) else inputs.end_vector(part))
    n = ref.trailing.shape[0]
    torch.testing.assert_close(torch.stack(parts[:n]), ref.trailing, rtol=1e-6, atol=1e-6)
    assert all(torch.equal(p, inputs.tts_pad) for p in parts[n:])


def test_a_wrong_decode_position_changes_the_codes(model, inputs, tokens):
    """Negative control: the sharpened talker is not blind to positions, so the equality above checks them."""
    ref = reference(
        model, SYSTEM + turn(I.user, [30, 31, 32]) + HEADER, talker_max_new_tokens=10, thinker_max_new_tokens=5
    )
    right, _, _ = stream(model, inputs, tokens, ref, max_codes=10)
    wrong, _, _ = stream(model, inputs, tokens, ref, max_codes=10, shift=1)
    assert torch.equal(right, ref.codes) and not torch.equal(wrong, right)


def test_step_text():
    assert [step_text(s, 3, done=False) for s in range(3)] == [1, 2, None]
    eos, pad = TalkerTextEnd.EOS, TalkerTextEnd.PAD
    assert [step_text(s, 4, done=True) for s in range(5)] == [1, 2, eos, pad, pad]
    assert [step_text(s, 2, done=True) for s in range(2)] == [eos, pad]
    with pytest.raises(InvalidInputError):
        step_text(0, 1, done=True)  # a one-token reply: the reference has no talker prompt for it


def test_codec_rules_from_config(tokens):
    rules = CodecRules.of(tokens)
    assert rules.stop == tokens.codec_eos
    assert rules.stop not in rules.suppress and tokens.codec_bos in rules.suppress
    assert rules.suppress == tuple(i for i in range(tokens.vocab - 1024, tokens.vocab) if i != tokens.codec_eos)
    logits = torch.tensor([[1.0, -2.0, 3.0] + [0.0] * (tokens.vocab - 3)])
    out = rules.process(logits, [[0, 1, 1]])
    assert out[0, :3].tolist() == pytest.approx([1.0 / 1.05, -2.0 * 1.05, 3.0])
    assert torch.isinf(out[0, list(rules.suppress)]).all() and out[0, rules.stop] == 0


def test_released_ids():
    from transformers import Qwen3OmniMoeConfig

    released = Qwen3OmniMoeConfig(
        talker_config={
            "codec_pad_id": 2148, "codec_bos_id": 2149, "codec_eos_token_id": 2150, "codec_nothink_id": 2155,
            "codec_think_bos_id": 2156, "codec_think_eos_id": 2157, "num_code_groups": 16, "accept_hidden_layer": 24,
            "speaker_id": {"chelsie": 2301, "ethan": 2302, "aiden": 2303}, "spatial_merge_size": 2,
            "text_config": {"vocab_size": 3072}, "code_predictor_config": {"num_code_groups": 16},
        },
        tts_pad_token_id=151671, tts_bos_token_id=151672, tts_eos_token_id=151673,
    )  # fmt: skip
    t = TalkerTokens.of(released)
    rules = CodecRules.of(t)
    assert (t.codec_eos, t.speaker("Ethan"), t.tts_pad, t.accept_hidden_layer) == (2150, 2302, 151671, 24)
    assert rules.suppress[0] == 2048 and len(rules.suppress) == 1023
    with pytest.raises(UnknownVoiceError):
        t.speaker("nobody")


def test_code_predictor_sampling_matches_the_warpers():
    torch.manual_seed(3)
    logits = torch.randn(4, 64) * 3
    ours = TopKTopP([torch.Generator() for _ in range(4)], top_k=50, top_p=0.8).warp(logits)
    theirs = TopPLogitsWarper(0.8)(None, TopKLogitsWarper(50)(None, logits.clone()))
    assert torch.equal(torch.isinf(ours), torch.isinf(theirs)) and torch.equal(ours, theirs)


def test_code_predictor_rows_are_independent_and_seeded(model):
    predictor = CodePredictor(model.talker)
    torch.manual_seed(4)
    hidden, code0 = torch.randn(3, 64), torch.tensor([1, 7, 30])

    def sampled(seeds):
        return predictor.predict(hidden, code0, TopKTopP([torch.Generator().manual_seed(s) for s in seeds]))

    batch = sampled([11, 12, 13])
    assert batch.shape == (3, 15) and int(batch.max()) < 64
    assert torch.equal(batch, sampled([11, 12, 13]))
    alone = predictor.predict(hidden[1:2], code0[1:2], TopKTopP([torch.Generator().manual_seed(12)]))
    assert torch.equal(alone, batch[1:2])


def test_talker_positions_equal_get_rope_index(model, tokens):
    """With pictures and video the talker's positions are get_rope_index's over the talker's own ids."""
    image, video = (1, 4, 6), (3, 4, 4)
    ids = [30, 31, I.vision_start, *[I.image] * 6, I.vision_end, 32, I.vision_start, *[I.video] * 12, I.vision_end]
    ids += [33] + [I.tts_pad] * ASSISTANT_PART_LEN
    grids = {"image_grid_thw": torch.tensor([image]), "video_grid_thw": torch.tensor([video])}
    ones = torch.ones(1, len(ids), dtype=torch.long)
    ours, delta = prompt_positions(ids, tokens, image_grids=[image], video_grids=[video], video_seconds=[0.5])
    theirs, deltas = model.talker.get_rope_index(
        torch.tensor([ids]), **grids, attention_mask=ones, second_per_grids=torch.tensor([0.5])
    )
    assert torch.equal(ours, theirs[:, 0]) and delta == float(deltas[0, 0]) and delta < 0
    assert decode_position(len(ids), delta, 0) == float(ours.max()) + 1
    text, no_delta = prompt_positions([30, *AUDIO, 31], tokens)
    assert no_delta == 0 and torch.equal(text, torch.arange(len(AUDIO) + 2).float().expand(3, -1))


def test_talker_positions_with_audio_and_pictures(model, tokens):
    """The reference's talker cannot position audio next to pictures (it reads an audio_config it lacks); ours follow
    the thinker's get_rope_index rule over the talker's ids, audio one position per token."""
    image = (1, 4, 4)
    ids = [30, *AUDIO, I.vision_start, *[I.image] * 4, I.vision_end, 31, *AUDIO, 32]
    ours, delta = prompt_positions(ids, tokens, image_grids=[image])
    theirs, deltas = model.thinker.model.get_rope_index(
        torch.tensor([ids]),
        image_grid_thw=torch.tensor([image]),
        attention_mask=torch.ones(1, len(ids), dtype=torch.long),
        audio_seqlens=torch.tensor([MEL_FRAMES, MEL_FRAMES]),
    )
    assert torch.equal(ours, theirs[:, 0]) and delta == float(deltas[0, 0])


def test_audio_in_video_is_refused(tokens):
    with pytest.raises(UnsupportedInputError):
        prompt_positions([30, I.vision_start, I.audio_start, I.audio], tokens)


def test_user_part_needs_hidden_states_at_multimodal_positions(inputs):
    ids = torch.tensor([30, I.audio])
    with pytest.raises(InvalidInputError):
        inputs.user_part(ids, None)
    with pytest.raises(InvalidInputError):
        inputs.assistant_part([I.im_start, I.user, I.newline], 0, 30)
