"""A tiny random Qwen3-Omni (``Qwen3OmniMoeConfig``) for unit tests: the released layout at toy sizes, built offline.

Sizes: thinker 2 MoE layers of hidden 64 (4 experts, top 2), a 1-layer audio encoder and vision tower; talker 2 MoE
layers of hidden 64 (4 experts, top 2, a shared expert), code predictor 2 dense layers, 16 code groups; a 1-layer
code2wav. Ids keep the released structure: the talker's vocabulary is ``codebook`` codes followed by 1024 control
ids (the range ``generate`` suppresses, codec eos excepted), the codec control ids and speakers lie in that range,
and every thinker-side id (markers, ``tts_*``, roles) lies in the thinker's vocabulary.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers import Qwen3OmniMoeConfig, Qwen3OmniMoeForConditionalGeneration

__all__ = ["CODEBOOK", "TINY_IDS", "TinyIds", "sharpen_talker", "tiny_qwen3_config", "tiny_qwen3_model"]


@dataclass(frozen=True)
class TinyIds:
    """Thinker-vocabulary ids of the tiny config (the released model's are 151644...; these fit a 512 vocabulary)."""

    im_start: int = 500
    im_end: int = 501
    tts_pad: int = 502
    tts_bos: int = 503
    tts_eos: int = 504
    system: int = 505
    user: int = 506
    assistant: int = 507
    audio_start: int = 508
    audio_end: int = 509
    audio: int = 510
    image: int = 511
    video: int = 499
    vision_start: int = 498
    vision_end: int = 497
    newline: int = 10


TINY_IDS = TinyIds()
CODEBOOK = 64
"""Codes per codebook (the code predictor's vocabulary, code2wav's codebook size)."""


def _rope(section: list[int]) -> dict:
    return {"rope_type": "default", "rope_theta": 1000000.0, "mrope_section": section, "interleaved": True}


def tiny_qwen3_config(*, accept_hidden_layer: int = 1) -> Qwen3OmniMoeConfig:
    ids = TINY_IDS
    talker_vocab = CODEBOOK + 1024
    thinker = {
        "audio_config": {
            "num_mel_bins": 128,
            "encoder_layers": 1,
            "encoder_attention_heads": 2,
            "encoder_ffn_dim": 64,
            "d_model": 32,
            "output_dim": 64,
            "downsample_hidden_size": 16,
            "n_window": 50,
            "n_window_infer": 400,
        },
        "vision_config": {
            "depth": 1,
            "hidden_size": 32,
            "intermediate_size": 64,
            "num_heads": 2,
            "out_hidden_size": 64,
            "num_position_embeddings": 64,
            "deepstack_visual_indexes": [0],
        },
        "text_config": {
            "vocab_size": 512,
            "hidden_size": 64,
            "intermediate_size": 128,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "head_dim": 16,
            "moe_intermediate_size": 32,
            "num_experts": 4,
            "num_experts_per_tok": 2,
            "rope_parameters": _rope([2, 3, 3]),
        },
        "audio_token_id": ids.audio,
        "image_token_id": ids.image,
        "video_token_id": ids.video,
        "audio_start_token_id": ids.audio_start,
        "vision_start_token_id": ids.vision_start,
        "vision_end_token_id": ids.vision_end,
        "audio_end_token_id": ids.audio_end,
        "user_token_id": ids.user,
        "position_id_per_seconds": 13,
        "seconds_per_chunk": 2,
    }
    talker = {
        "text_config": {
            "vocab_size": talker_vocab,
            "hidden_size": 64,
            "intermediate_size": 128,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "head_dim": 16,
            "moe_intermediate_size": 32,
            "shared_expert_intermediate_size": 32,
            "num_experts": 4,
            "num_experts_per_tok": 2,
            "norm_topk_prob": True,
            "rope_parameters": _rope([2, 3, 3]),
        },
        "code_predictor_config": {
            "vocab_size": CODEBOOK,
            "hidden_size": 64,
            "intermediate_size": 128,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "head_dim": 16,
            "num_code_groups": 16,
        },
        "num_code_groups": 16,
        "thinker_hidden_size": 64,
        "accept_hidden_layer": accept_hidden_layer,
        "codec_pad_id": CODEBOOK + 6,
        "codec_bos_id": CODEBOOK + 7,
        "codec_eos_token_id": CODEBOOK + 8,
        "codec_nothink_id": CODEBOOK + 13,
        "codec_think_bos_id": CODEBOOK + 14,
        "codec_think_eos_id": CODEBOOK + 15,
        "speaker_id": {"chelsie": CODEBOOK + 40, "ethan": CODEBOOK + 41, "aiden": CODEBOOK + 42},
        "audio_token_id": ids.audio,
        "image_token_id": ids.image,
        "video_token_id": ids.video,
        "vision_start_token_id": ids.vision_start,
        "audio_start_token_id": ids.audio_start,
        "position_id_per_seconds": 13,
        "spatial_merge_size": 2,
    }
    code2wav = {
        "codebook_size": CODEBOOK,
        "hidden_size": 32,
        "num_hidden_layers": 1,
        "num_attention_heads": 2,
        "num_key_value_heads": 2,
        "intermediate_size": 64,
        "sliding_window": 8,
        "num_quantizers": 16,
        "upsample_rates": [2, 2],
        "upsampling_ratios": [2],
        "decoder_dim": 32,
    }
    return Qwen3OmniMoeConfig(
        thinker_config=thinker,
        talker_config=talker,
        code2wav_config=code2wav,
        im_start_token_id=ids.im_start,
        im_end_token_id=ids.im_end,
        tts_pad_token_id=ids.tts_pad,
        tts_bos_token_id=ids.tts_bos,
        tts_eos_token_id=ids.tts_eos,
        system_token_id=ids.system,
        user_token_id=ids.user,
        assistant_token_id=ids.assistant,
    )


def tiny_qwen3_model(seed: int = 0, **config) -> Qwen3OmniMoeForConditionalGeneration:
    """The tiny model in float32 with seeded random weights, in eval mode (~1 s to build on one core). Every MoE
    expert weight is drawn here: transformers' init leaves some of them (the talker's) as ``torch.empty`` memory,
    whose values would depend on what ran before in the process."""
    torch.manual_seed(seed)
    model = Qwen3OmniMoeForConditionalGeneration(tiny_qwen3_config(**config)).float().eval()
    with torch.no_grad():
        for name, param in model.named_parameters():
            if ".experts." in name:
                param.normal_(0.0, 0.02)
    return model


def sharpen_talker(model: Qwen3OmniMoeForConditionalGeneration, factor: float = 8.0, loud: float = 20.0) -> None:
    """Scale the talker's query and key norms by ``factor`` (attention logits by ``factor**2``) and its thinker
    projections' outputs by ``loud``: a random tiny talker is nearly blind to positions and hears its text part
    faintly next to the codec embeddings; sharpened, a wrong rope position or text vector changes its greedy codes."""
    with torch.no_grad():
        for proj in (model.talker.text_projection, model.talker.hidden_projection):
            proj.linear_fc2.weight.mul_(loud)
            proj.linear_fc2.bias.mul_(loud)
        for layer in model.talker.model.layers:
            layer.self_attn.q_norm.weight.mul_(factor)
            layer.self_attn.k_norm.weight.mul_(factor)
