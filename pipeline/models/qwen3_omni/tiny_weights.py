"""Random Qwen3-Omni weights: a seeded ``Qwen3OmniMoeForConditionalGeneration`` and the few changes that make a random
model behave enough like a voice model for end-to-end tests (:func:`tune_random_weights`)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from pipeline.models.common.hf_parts import thinker_text_model
from pipeline.models.common.random_checkpoint import default_device_and_dtype
from pipeline.models.common.random_tuning import hold_reply_end_logit, mark_text_end, never_write

if TYPE_CHECKING:
    from pipeline.models.qwen3_omni.tiny_spec import Qwen3OmniRandomModelSpec


def build_model(
    spec: Qwen3OmniRandomModelSpec,
    config: Any,
    ids: dict[str, int],
    *,
    device: str = "cpu",
    dtype: torch.dtype = torch.float32,
) -> Any:
    """A random ``Qwen3OmniMoeForConditionalGeneration`` for ``config``, drawn from ``spec.seed`` on ``device`` in
    ``dtype`` (code2wav in float32), tuned by :func:`tune_random_weights`, in eval mode. ``ids``: the tokenizer's ids
    (:func:`~.tiny_config.token_ids`). The thinker is drawn first, so a text-only model has the same thinker."""
    from transformers import Qwen3OmniMoeForConditionalGeneration

    torch.manual_seed(spec.seed)  # seeds every device's generator
    with default_device_and_dtype(device, dtype):
        model = Qwen3OmniMoeForConditionalGeneration(config)
    if model.has_talker:
        _init_talker_experts(model.talker, spec.seed + TALKER_EXPERTS_SEED_OFFSET)
        model.code2wav.float()
    tune_random_weights(model, spec, ids)
    return model.eval()


TALKER_EXPERTS_SEED_OFFSET = 1
"""The talker's routed experts and router are drawn from generator seed ``spec.seed + TALKER_EXPERTS_SEED_OFFSET``."""


@torch.no_grad()
def _init_talker_experts(talker: Any, seed: int) -> None:
    """Draw the talker's routed experts and router like the thinker's (normal, std ``initializer_range``).

    transformers (5.25) initialises only the thinker's MoE blocks: the talker's expert tensors are left as
    ``torch.empty`` (whatever memory held, NaN included, and different on every build) and its router at zero (every
    expert tied, so the first ones always win)."""
    std = talker.config.text_config.initializer_range
    generator = torch.Generator(device=talker.codec_head.weight.device).manual_seed(seed)
    for layer in talker.model.layers:
        for tensor in (layer.mlp.experts.gate_up_proj, layer.mlp.experts.down_proj, layer.mlp.gate.weight):
            torch.nn.init.normal_(tensor, mean=0.0, std=std, generator=generator)


@torch.no_grad()
def tune_random_weights(model: Any, spec: Qwen3OmniRandomModelSpec, ids: dict[str, int]) -> None:
    """Make random weights behave enough like a voice model for end-to-end tests.

    * Positions: ``spec.attention_sharpness`` multiplies the thinker's and the talker's q/k RMSNorm weights (Qwen3
      normalises queries and keys per head, so scaling the projections would change nothing).
    * Ending a reply: :func:`~pipeline.models.common.random_tuning.hold_reply_end_logit` keeps the thinker's
      ``<|im_end|>`` logit near ``spec.reply_end_logit``, inside the sampler's top-k but below the usual best logit.
    * Ending its speech: :func:`_end_speech_after_text` raises the talker's codec-eos logit to
      ``spec.speech_end_logit`` exactly when its text input is ``<tts_text_eod>`` / ``<tts_pad>`` (the text has ended),
      after ``spec.stop_logit_scale`` shrank the eos row so that greedy decoding does not stop by chance.
    * Audibility: code2wav's last convolution is scaled by ``spec.output_gain`` (its output is clamped to [-1, 1]).
    """
    text = thinker_text_model(model.thinker)
    if spec.attention_sharpness != 1.0:
        _sharpen_attention(text.layers, spec.attention_sharpness)
    # The thinker side comes first and does not depend on the talker, so a text-only model has the same thinker.
    marked = [ids["<tts_text_eod>"], ids["<tts_pad>"]]
    if spec.speech_end_logit is not None:
        mark_text_end(text.embed_tokens.weight, marked, marker=spec.thinker_hidden - 2)
    if spec.reply_end_logit is not None:
        hold_reply_end_logit(model.thinker, ids["<|im_end|>"], spec.reply_end_logit)
    if not model.has_talker:
        return
    if spec.attention_sharpness != 1.0:
        _sharpen_attention(model.talker.model.layers, spec.attention_sharpness)
    model.talker.codec_head.weight[spec.codec_eos_id].mul_(spec.stop_logit_scale)
    if spec.speech_end_logit is not None:
        _end_speech_after_text(model, spec, marked, spec.speech_end_logit)
    model.code2wav.decoder[-1].conv.weight.mul_(spec.output_gain)


def _sharpen_attention(layers: Any, factor: float) -> None:
    for layer in layers:
        layer.self_attn.q_norm.weight.mul_(factor)
        layer.self_attn.k_norm.weight.mul_(factor)


def _end_speech_after_text(model: Any, spec: Qwen3OmniRandomModelSpec, marked: list[int], level: float) -> None:
    """Make the talker's codec-eos logit about ``level`` whenever its text input is one of ``marked`` token ids.

    The talker reads the reply's text as the thinker's *embeddings* through ``text_projection`` (a two-layer MLP). The
    marker channel (the thinker's second-to-last, :func:`~pipeline.models.common.random_tuning.mark_text_end`) is
    non-zero only in the embeddings of ``marked``; one hidden unit of the projection carries it alone into the talker's
    last channel, which no other input (codec embeddings, the multimodal ``hidden_projection``) fills and no talker
    layer writes. The codec head reads that channel only in the eos row, calibrated on a probe of text-pad steps;
    before the text ends the channel is zero.
    """
    thinker_embed = thinker_text_model(model.thinker).embed_tokens.weight
    talker = model.talker
    marker, channel = spec.thinker_hidden - 2, spec.talker_hidden - 1
    projection = talker.text_projection
    unit = projection.linear_fc1.weight.shape[0] - 1
    projection.linear_fc1.weight[:, marker] = 0.0
    projection.linear_fc1.weight[unit] = 0.0
    projection.linear_fc1.bias[unit] = 0.0
    projection.linear_fc1.weight[unit, marker] = 1.0
    projection.linear_fc2.weight[:, unit] = 0.0
    projection.linear_fc2.weight[channel] = 0.0
    projection.linear_fc2.bias[channel] = 0.0
    projection.linear_fc2.weight[channel, unit] = 1.0
    talker.hidden_projection.linear_fc2.weight[channel] = 0.0
    talker.hidden_projection.linear_fc2.bias[channel] = 0.0
    talker.model.codec_embedding.weight[:, channel] = 0.0
    for table in talker.code_predictor.model.codec_embedding:
        table.weight[:, channel] = 0.0
    never_write(talker.model.layers, channel)
    head = talker.codec_head.weight
    head[:, channel] = 0.0
    # A talker step's input: the sum of the frame's codebook embeddings (codebook 0's table, then the predictor's
    # tables for the residual codebooks) plus the text input.
    codes = torch.arange(2 * 16 * spec.num_code_groups, device=head.device) % spec.codebook_size
    codes = codes.reshape(spec.num_code_groups, 2, 16)
    frames = talker.model.codec_embedding(codes[0])
    for table, group in zip(talker.code_predictor.model.codec_embedding, codes[1:], strict=True):
        frames = frames + table(group)
    probe = frames + projection(thinker_embed[marked[-1]])
    normed = talker.model(inputs_embeds=probe).last_hidden_state[..., channel].float().mean()
    head[spec.codec_eos_id, channel] = level / normed.item()


__all__ = ["build_model", "tune_random_weights"]
