"""Random-weight Qwen2.5-Omni checkpoints: a tiny one for CPU tests, the full 7B shape for GPU benchmarks.

:func:`make_random_checkpoint` writes the exact Hugging Face layout of the released checkpoints
(config.json, model.safetensors, spk_dict.pt, tokenizer files, preprocessor_config.json,
generation_config.json) plus :data:`~.checkpoint.RANDOM_MARKER_FILE`, so the same loader serves
test and real models. Everything is built offline and deterministically from ``spec.seed``: the
same seed and software versions give a byte-identical ``model.safetensors``.

A few changes to the random initialisation keep the tiny model useful for end-to-end tests (see
:func:`_tune_random_weights`): the vocoder's last convolution is scaled by ``spec.output_gain`` (a
random BigVGAN otherwise outputs ~1e-7, silence for any audibility check), the talker's codec
stop rows are shrunk by ``spec.stop_logit_scale`` so that decoding does not stop at the first
steps, and the thinker's end-of-reply and the talker's end-of-speech logits are raised just enough
that a sampled reply ends on its own after a few seconds, as a real model's does.

The tokenizer is a byte-level BPE trained at build time on :mod:`pipeline.models.common.tokenizer_corpus`, with the Qwen
special tokens appended in the released order; the thinker vocabulary is padded beyond it (like the
released 152064-entry table) and the talker's ``tts_text_*`` ids and the speakers' bos ids live in
that padding.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any, ClassVar

import torch

from pipeline.errors import CheckpointError
from pipeline.models.common import bpe
from pipeline.models.common.hermes_tools import TOOLS_EPILOGUE, TOOLS_PREAMBLE
from pipeline.models.common.hf_parts import thinker_text_model, thinker_vision_tower
from pipeline.models.common.random_checkpoint import (
    RandomSpecPresets,
    check_common_spec,
    default_device_and_dtype,
    generation_config,
    scratch_folder,
    write_preprocessor_config,
    write_random_marker,
)
from pipeline.models.common.random_tuning import hold_reply_end_logit, mark_text_end, never_write
from pipeline.models.qwen2_5_omni import checkpoint as ckpt
from pipeline.models.qwen2_5_omni.hf_logging import quiet_talker_token_id_warnings

SPEAKER_NAMES = ("Chelsie", "Ethan")
"""Voices of the released checkpoints; Chelsie is the reference default."""

DEFAULT_SYSTEM_PROMPT = "You are a helpful assistant."
"""What the released chat template inserts when a conversation has no system message."""

SAMPLE_RATE_IN = 16_000
MEL_BINS_IN = 128
REF_MEL_FRAMES = 64
"""Frames of the random speakers' reference mel (the released ones are a few hundred)."""
MAX_SHARD_SIZE = "5GB"
"""Shard size of written weights (the released 7B ships five shards)."""

# Qwen's added tokens in their released order (ids follow the BPE vocabulary). The flag says
# whether the token is "special" (skipped when decoding with skip_special_tokens).
QWEN_ADDED_TOKENS: tuple[tuple[str, bool], ...] = (
    (ckpt.ENDOFTEXT, True),
    (ckpt.IM_START, True),
    (ckpt.IM_END, True),
    (ckpt.AUDIO_PLACEHOLDER, True),
    (ckpt.AUDIO_BOS, True),
    (ckpt.AUDIO_EOS, True),
    ("<|box_end|>", True),
    ("<|quad_start|>", True),
    ("<|quad_end|>", True),
    (ckpt.VISION_BOS, True),
    (ckpt.VISION_EOS, True),
    ("<|vision_pad|>", True),
    (ckpt.IMAGE_PLACEHOLDER, True),
    (ckpt.VIDEO_PLACEHOLDER, True),
    ("<tool_call>", False),
    ("</tool_call>", False),
    ("<|fim_prefix|>", False),
    ("<|fim_middle|>", False),
    ("<|fim_suffix|>", False),
    ("<|fim_pad|>", False),
    ("<|repo_name|>", False),
    ("<|file_sep|>", False),
)

# Attributes the released tokenizer_config.json names (the processor reads them).
_TOKENIZER_NAMED_TOKENS = {
    "audio_token": ckpt.AUDIO_PLACEHOLDER,
    "audio_bos_token": ckpt.AUDIO_BOS,
    "audio_eos_token": ckpt.AUDIO_EOS,
    "image_token": ckpt.IMAGE_PLACEHOLDER,
    "video_token": ckpt.VIDEO_PLACEHOLDER,
    "vision_bos_token": ckpt.VISION_BOS,
    "vision_eos_token": ckpt.VISION_EOS,
}

RELEASED_7B_IDS: dict = {
    "codec_pad": 8292,
    "codec_bos": 8293,
    "codec_eos": 8294,
    "codec_mask": 8296,
    "speaker_bos": (151870, 151871),
}
"""Special ids of the released Qwen2.5-Omni-7B config.json. This module *writes* configs, so the
7B preset needs them as values; the engine itself reads every id from the checkpoint config."""

RELEASED_7B_PARAMETERS: Mapping[str, int] = MappingProxyType(
    {"thinker": 8_931_813_888, "talker": 1_307_289_344, "token2wav": 449_051_264, "total": 10_688_154_496}
)
"""Parameters of the released Qwen2.5-Omni-7B architecture (:meth:`Qwen25OmniRandomModelSpec.qwen2_5_omni_7b`) per
part and in total, as transformers builds it (``tests/unit/models/test_tiny_checkpoint.py`` counts them)."""


TEST_ATTENTION_SHARPNESS = 8.0
"""Query/key scale of the sharpened test checkpoint. At 1 (the random init) replacing an image prompt's 3-D positions
with 1-D ones moves the last logits by ~1e-3 and no greedy token; at 8 both that and a one-position shift after an
audio block change the greedy tokens within ten steps; the talker's likewise change its greedy codes."""


@dataclass(frozen=True)
class Qwen25OmniRandomModelSpec(RandomSpecPresets):
    """Every size of a random Qwen2.5-Omni. Units: hidden sizes in channels, ``*_vocab`` in ids.

    ``codec_speech_vocab`` is the number of speech codes (ids below it); the codec special ids sit
    above it. ``dit_num_embeds`` must cover the speech codes. ``output_gain`` multiplies the
    vocoder's last convolution; ``stop_logit_scale`` multiplies the talker's codec-head rows of
    the stop ids (1.0 leaves the random init alone); ``reply_end_logit`` is the level the thinker's
    ``<|im_end|>`` logit is held near and ``speech_end_logit`` the talker's codec-eos logit once the
    reply's text has ended (``None`` leaves the random init alone). ``attention_sharpness`` multiplies the thinker's
    and the talker's query and key projections (weights and biases; attention logits grow by its square): a random
    model's attention is nearly uniform, so its outputs hardly depend on positions; a sharpened one's greedy tokens
    and codes do (test checkpoints that must catch a wrong position).
    """

    SHARPENED_ATTENTION: ClassVar[float] = TEST_ATTENTION_SHARPNESS

    # thinker language model
    thinker_hidden: int = 64
    thinker_layers: int = 2
    thinker_heads: int = 2
    thinker_kv_heads: int = 1
    thinker_intermediate: int = 128
    thinker_vocab: int = 1024
    thinker_mrope_section: tuple[int, int, int] = (4, 6, 6)
    rope_theta: float = 1_000_000.0
    max_position_embeddings: int = 32_768
    # audio encoder (Whisper-like, 128 mel bins in)
    audio_d_model: int = 32
    audio_layers: int = 2
    audio_heads: int = 1
    audio_ffn: int = 64
    audio_output_dim: int = 64
    # vision encoder: windowed attention in every layer but the full-attention ones; windows of window_size pixels
    vision_hidden: int = 32
    vision_depth: int = 3
    vision_heads: int = 1
    vision_intermediate: int = 64
    vision_out_hidden: int = 64
    vision_fullatt_blocks: tuple[int, ...] = (1,)
    vision_window_size: int = 56
    vision_patch_size: int = 14
    vision_merge_size: int = 2
    vision_temporal_patch_size: int = 2
    # image processor (preprocessor_config.json): the pixel budget of a picture, CLIP's mean / std
    image_min_pixels: int = 4 * 28 * 28
    image_max_pixels: int = 64 * 28 * 28
    image_mean: tuple[float, float, float] = (0.48145466, 0.4578275, 0.40821073)
    image_std: tuple[float, float, float] = (0.26862954, 0.26130258, 0.27577711)
    # talker
    talker_hidden: int = 32
    talker_layers: int = 2
    talker_heads: int = 1
    talker_kv_heads: int = 1
    talker_head_dim: int = 32
    talker_intermediate: int = 64
    talker_vocab: int = 128
    talker_mrope_section: tuple[int, int, int] = (8, 8, 0)
    codec_speech_vocab: int = 120
    codec_pad_id: int = 120
    codec_bos_id: int = 121
    codec_eos_id: int = 122
    codec_mask_id: int = 124
    # token2wav: DiT
    dit_hidden: int = 32
    dit_layers: int = 3
    dit_heads: int = 1
    dit_head_dim: int = 32
    dit_ff_mult: int = 2
    dit_codec_emb_dim: int = 16
    dit_num_embeds: int = 128
    dit_block_size: int = 24
    dit_look_ahead_layers: tuple[int, ...] = (1,)
    dit_look_backward_layers: tuple[int, ...] = (0, 2)
    mel_dim: int = 80
    speaker_dim: int = 32
    speaker_enc_dim: int = 16
    speaker_enc_channels: tuple[int, ...] = (32, 32, 32)
    speaker_enc_kernels: tuple[int, ...] = (5, 3, 1)
    speaker_enc_dilations: tuple[int, ...] = (1, 2, 1)
    speaker_enc_attention_channels: int = 16
    speaker_enc_se_channels: int = 16
    # token2wav: BigVGAN
    bigvgan_channels: int = 128
    bigvgan_upsample_rates: tuple[int, ...] = (5, 3, 2, 2, 2, 2)
    bigvgan_upsample_kernels: tuple[int, ...] = (11, 7, 4, 4, 4, 4)
    bigvgan_resblock_kernels: tuple[int, ...] = (3,)
    bigvgan_resblock_dilations: tuple[tuple[int, int, int], ...] = ((1, 3, 5),)
    # ids in the thinker vocabulary beyond the tokenizer (tts_text_*: as the talker embeds them)
    tokenizer_bpe_vocab: int = 512
    tts_text_pad_id: int = 1000
    tts_text_start_id: int = 1001
    tts_text_end_id: int = 1002
    speaker_bos_ids: tuple[int, int] = (1010, 1011)
    # randomness and the audibility tweaks
    seed: int = 0
    output_gain: float = 8.0e5
    stop_logit_scale: float = 0.3
    reply_end_logit: float | None = 0.29
    speech_end_logit: float | None = 0.06
    attention_sharpness: float = 1.0

    @classmethod
    def qwen2_5_omni_7b(cls, seed: int = 0) -> Qwen25OmniRandomModelSpec:
        """The released 7B architecture (10.69 B parameters), with the released codec ids."""
        return cls(
            thinker_hidden=3584,
            thinker_layers=28,
            thinker_heads=28,
            thinker_kv_heads=4,
            thinker_intermediate=18944,
            thinker_vocab=152064,
            thinker_mrope_section=(16, 24, 24),
            audio_d_model=1280,
            audio_layers=32,
            audio_heads=20,
            audio_ffn=5120,
            audio_output_dim=3584,
            vision_hidden=1280,
            vision_depth=32,
            vision_heads=16,
            vision_intermediate=3420,
            vision_out_hidden=3584,
            vision_fullatt_blocks=(7, 15, 23, 31),
            vision_window_size=112,
            image_min_pixels=3136,
            image_max_pixels=12845056,
            talker_hidden=896,
            talker_layers=24,
            talker_heads=12,
            talker_kv_heads=4,
            talker_head_dim=64,
            talker_intermediate=18944,
            talker_vocab=8448,
            talker_mrope_section=(16, 16, 0),
            codec_speech_vocab=8192,
            codec_pad_id=RELEASED_7B_IDS["codec_pad"],
            codec_bos_id=RELEASED_7B_IDS["codec_bos"],
            codec_eos_id=RELEASED_7B_IDS["codec_eos"],
            codec_mask_id=RELEASED_7B_IDS["codec_mask"],
            dit_hidden=1024,
            dit_layers=22,
            dit_heads=16,
            dit_head_dim=64,
            dit_codec_emb_dim=512,
            dit_num_embeds=8193,
            dit_look_ahead_layers=(10,),
            dit_look_backward_layers=(0, 20),
            speaker_dim=192,
            speaker_enc_dim=128,
            speaker_enc_channels=(256, 256, 256, 256, 768),
            speaker_enc_kernels=(5, 3, 3, 3, 1),
            speaker_enc_dilations=(1, 2, 3, 4, 1),
            speaker_enc_attention_channels=64,
            speaker_enc_se_channels=64,
            bigvgan_channels=1536,
            bigvgan_resblock_kernels=(3, 7, 11),
            bigvgan_resblock_dilations=((1, 3, 5), (1, 3, 5), (1, 3, 5)),
            tts_text_pad_id=151859,
            tts_text_start_id=151860,
            tts_text_end_id=151861,
            speaker_bos_ids=RELEASED_7B_IDS["speaker_bos"],
            # 1536 vocoder channels keep a random signal at RMS ~0.035; 3x brings it to ~0.1.
            output_gain=3.0,
            # GPU benchmarks force reply lengths; the random init is left alone.
            stop_logit_scale=0.7,
            reply_end_logit=None,
            speech_end_logit=None,
            seed=seed,
        )


# --- Tokenizer --------------------------------------------------------------------------------
def added_token_ids(bpe_vocab_size: int) -> dict[str, int]:
    """Ids of the Qwen added tokens when they follow a BPE vocabulary of ``bpe_vocab_size``."""
    return bpe.added_token_ids(bpe_vocab_size, [token for token, _ in QWEN_ADDED_TOKENS])


def chat_template() -> str:
    """A Jinja chat template that renders like the released Qwen2.5-Omni one:
    ``<|im_start|>{role}\\n{content}<|im_end|>\\n`` per message, a default system message when the
    first message is not one, media parts as ``<|audio_bos|><|AUDIO|><|audio_eos|>`` (and the vision
    equivalents, optionally numbered with ``add_audio_id`` / ``add_vision_id``), and
    ``<|im_start|>assistant\\n`` for ``add_generation_prompt``; with ``tools=``, function calling as Qwen2.5 renders it
    (:mod:`~pipeline.models.common.hermes_tools`): the tools block after the system message's content, an assistant's
    ``tool_calls`` as ``<tool_call>`` blocks after its content, and consecutive ``tool`` messages as one user turn of
    ``<tool_response>`` blocks. Written on one line: transformers renders with ``trim_blocks``, which would eat a
    newline written after a block tag (text that starts with one right after a tag is written as a Jinja string)."""
    im_start, im_end = ckpt.IM_START, ckpt.IM_END
    tools_block = "".join(
        [
            "{% if tools %}",
            bpe.jinja_text(TOOLS_PREAMBLE),
            "{% for tool in tools %}",
            bpe.jinja_text("\n"),
            "{{ tool | tojson }}{% endfor %}",
            bpe.jinja_text(TOOLS_EPILOGUE),
            "{% endif %}",
        ]
    )
    tool_turns = "".join(
        [
            "{% if message['role'] == 'tool' %}",
            f"{{% if loop.first or messages[loop.index0 - 1]['role'] != 'tool' %}}{im_start}user{{% endif %}}",
            bpe.jinja_text("\n<tool_response>\n"),
            "{{ message['content'] }}\n</tool_response>",
            f"{{% if loop.last or messages[loop.index0 + 1]['role'] != 'tool' %}}{im_end}\n{{% endif %}}",
            "{% elif message['role'] == 'assistant' and message['tool_calls'] %}",
            f"{im_start}assistant{{% if message['content'] %}}",
            bpe.jinja_text("\n"),
            "{{ message['content'] }}{% endif %}",
            "{% for call in message['tool_calls'] %}",
            "{% set fn = call['function'] if call['function'] is defined else call %}",
            bpe.jinja_text('\n<tool_call>\n{"name": "'),
            "{{ fn['name'] }}\", ",
            "\"arguments\": {{ fn['arguments'] | tojson }}}\n</tool_call>",
            f"{{% endfor %}}{im_end}\n",
            "{% else %}",
        ]
    )
    audio = ckpt.AUDIO_BOS + ckpt.AUDIO_PLACEHOLDER + ckpt.AUDIO_EOS
    image = ckpt.VISION_BOS + ckpt.IMAGE_PLACEHOLDER + ckpt.VISION_EOS
    video = ckpt.VISION_BOS + ckpt.VIDEO_PLACEHOLDER + ckpt.VISION_EOS
    return "".join(
        [
            "{% set n = namespace(audio=0, image=0, video=0) %}",
            "{% for message in messages %}",
            "{% if loop.first and message['role'] != 'system' %}",
            f"{im_start}system\n{DEFAULT_SYSTEM_PROMPT}{tools_block}{im_end}\n",
            "{% endif %}",
            tool_turns,
            f"{im_start}{{{{ message['role'] }}}}\n",
            "{% if message['content'] is string %}{{ message['content'] }}{% else %}",
            "{% for part in message['content'] %}",
            "{% if part['type'] == 'image' or 'image' in part or 'image_url' in part %}",
            "{% set n.image = n.image + 1 %}{% if add_vision_id %}Picture {{ n.image }}: {% endif %}",
            image,
            "{% elif part['type'] == 'audio' or 'audio' in part or 'audio_url' in part %}",
            "{% set n.audio = n.audio + 1 %}{% if add_audio_id %}Audio {{ n.audio }}: {% endif %}",
            audio,
            "{% elif part['type'] == 'video' or 'video' in part %}",
            "{% set n.video = n.video + 1 %}{% if add_vision_id %}Video {{ n.video }}: {% endif %}",
            video,
            "{% elif 'text' in part %}{{ part['text'] }}{% endif %}",
            "{% endfor %}{% endif %}",
            "{% if loop.first and message['role'] == 'system' %}",
            tools_block,
            "{% endif %}",
            f"{im_end}\n",
            "{% endif %}",
            "{% endfor %}",
            f"{{% if add_generation_prompt %}}{im_start}assistant\n{{% endif %}}",
        ]
    )


def write_tokenizer(out_dir: Path, spec: Qwen25OmniRandomModelSpec) -> dict[str, int]:
    """Write tokenizer.json, vocab.json, merges.txt, tokenizer_config.json and chat_template.json
    (the released file set) and return the added tokens' ids."""
    tokenizer, ids = bpe.train_with_added_tokens(spec.tokenizer_bpe_vocab, QWEN_ADDED_TOKENS)
    bpe.write_tokenizer_files(out_dir, tokenizer, _tokenizer_config(ids, chat_template()))
    return ids


def _tokenizer_config(ids: dict[str, int], template: str) -> dict[str, Any]:
    specials = [token for token, special in QWEN_ADDED_TOKENS if special]
    return {
        "tokenizer_class": "Qwen2Tokenizer",
        "add_prefix_space": False,
        "bos_token": None,
        "eos_token": ckpt.IM_END,
        "pad_token": ckpt.ENDOFTEXT,
        "unk_token": None,
        "clean_up_tokenization_spaces": False,
        "errors": "replace",
        "model_max_length": 32768,
        "split_special_tokens": False,
        "extra_special_tokens": [t for t in specials if t != ckpt.ENDOFTEXT],
        **_TOKENIZER_NAMED_TOKENS,
        "added_tokens_decoder": bpe.added_tokens_decoder(ids, QWEN_ADDED_TOKENS),
        "chat_template": template,
    }


# --- Config -----------------------------------------------------------------------------------
def build_config(spec: Qwen25OmniRandomModelSpec) -> Any:
    """A ``transformers.Qwen2_5OmniConfig`` for ``spec``, checked by
    :func:`~.checkpoint.validate_config` and the spec-only rules of :func:`check_spec`."""
    from transformers import Qwen2_5OmniConfig

    quiet_talker_token_id_warnings()
    check_spec(spec)
    ids = added_token_ids(spec.tokenizer_bpe_vocab)
    markers = {
        "audio_token_index": ids[ckpt.AUDIO_PLACEHOLDER],
        "image_token_index": ids[ckpt.IMAGE_PLACEHOLDER],
        "video_token_index": ids[ckpt.VIDEO_PLACEHOLDER],
        "audio_start_token_id": ids[ckpt.AUDIO_BOS],
        "audio_end_token_id": ids[ckpt.AUDIO_EOS],
        "vision_start_token_id": ids[ckpt.VISION_BOS],
        "vision_end_token_id": ids[ckpt.VISION_EOS],
    }
    config = Qwen2_5OmniConfig(
        thinker_config=_thinker_config(spec, markers, ids),
        talker_config=_talker_config(spec, markers),
        token2wav_config={"dit_config": _dit_config(spec), "bigvgan_config": _bigvgan_config(spec)},
        enable_audio_output=True,
    )
    ckpt.validate_config(config)
    return config


def _rope(spec: Qwen25OmniRandomModelSpec, section: tuple[int, int, int]) -> dict[str, Any]:
    return {"rope_type": "default", "rope_theta": spec.rope_theta, "mrope_section": list(section)}


def _thinker_config(spec: Qwen25OmniRandomModelSpec, markers: dict[str, int], ids: dict[str, int]) -> dict[str, Any]:
    text = {
        "vocab_size": spec.thinker_vocab,
        "hidden_size": spec.thinker_hidden,
        "intermediate_size": spec.thinker_intermediate,
        "num_hidden_layers": spec.thinker_layers,
        "num_attention_heads": spec.thinker_heads,
        "num_key_value_heads": spec.thinker_kv_heads,
        "max_position_embeddings": spec.max_position_embeddings,
        "rope_parameters": _rope(spec, spec.thinker_mrope_section),
        # The released thinker has separate input and output embeddings.
        "tie_word_embeddings": False,
        "eos_token_id": ids[ckpt.IM_END],
    }
    audio = {
        "num_mel_bins": MEL_BINS_IN,
        "encoder_layers": spec.audio_layers,
        "encoder_attention_heads": spec.audio_heads,
        "encoder_ffn_dim": spec.audio_ffn,
        "d_model": spec.audio_d_model,
        "output_dim": spec.audio_output_dim,
    }
    vision = {
        "depth": spec.vision_depth,
        "hidden_size": spec.vision_hidden,
        "num_heads": spec.vision_heads,
        "intermediate_size": spec.vision_intermediate,
        "out_hidden_size": spec.vision_out_hidden,
        "fullatt_block_indexes": list(spec.vision_fullatt_blocks),
        "window_size": spec.vision_window_size,
        "patch_size": spec.vision_patch_size,
        "spatial_merge_size": spec.vision_merge_size,
        "temporal_patch_size": spec.vision_temporal_patch_size,
    }
    return {
        "text_config": text,
        "audio_config": audio,
        "vision_config": vision,
        "tie_word_embeddings": False,
        **markers,
    }


def _talker_config(spec: Qwen25OmniRandomModelSpec, markers: dict[str, int]) -> dict[str, Any]:
    return {
        **markers,
        "vocab_size": spec.talker_vocab,
        "embedding_size": spec.thinker_hidden,
        "hidden_size": spec.talker_hidden,
        "intermediate_size": spec.talker_intermediate,
        "num_hidden_layers": spec.talker_layers,
        "num_attention_heads": spec.talker_heads,
        "num_key_value_heads": spec.talker_kv_heads,
        "head_dim": spec.talker_head_dim,
        "max_position_embeddings": spec.max_position_embeddings,
        "rope_parameters": _rope(spec, spec.talker_mrope_section),
        "tts_text_start_token_id": spec.tts_text_start_id,
        "tts_text_end_token_id": spec.tts_text_end_id,
        "tts_text_pad_token_id": spec.tts_text_pad_id,
        "tts_codec_start_token_id": spec.codec_bos_id,
        "tts_codec_end_token_id": spec.codec_eos_id,
        "tts_codec_pad_token_id": spec.codec_pad_id,
        "tts_codec_mask_token_id": spec.codec_mask_id,
    }


def _dit_config(spec: Qwen25OmniRandomModelSpec) -> dict[str, Any]:
    return {
        "hidden_size": spec.dit_hidden,
        "num_hidden_layers": spec.dit_layers,
        "num_attention_heads": spec.dit_heads,
        "head_dim": spec.dit_head_dim,
        "ff_mult": spec.dit_ff_mult,
        "emb_dim": spec.dit_codec_emb_dim,
        "num_embeds": spec.dit_num_embeds,
        "block_size": spec.dit_block_size,
        "look_ahead_layers": list(spec.dit_look_ahead_layers),
        "look_backward_layers": list(spec.dit_look_backward_layers),
        "mel_dim": spec.mel_dim,
        "enc_emb_dim": spec.speaker_dim,
        "enc_dim": spec.speaker_enc_dim,
        "enc_channels": list(spec.speaker_enc_channels),
        "enc_kernel_sizes": list(spec.speaker_enc_kernels),
        "enc_dilations": list(spec.speaker_enc_dilations),
        "enc_attention_channels": spec.speaker_enc_attention_channels,
        "enc_se_channels": spec.speaker_enc_se_channels,
        "rope_parameters": {"rope_type": "default", "rope_theta": 10_000.0},
    }


def _bigvgan_config(spec: Qwen25OmniRandomModelSpec) -> dict[str, Any]:
    return {
        "mel_dim": spec.mel_dim,
        "upsample_initial_channel": spec.bigvgan_channels,
        "upsample_rates": list(spec.bigvgan_upsample_rates),
        "upsample_kernel_sizes": list(spec.bigvgan_upsample_kernels),
        "resblock_kernel_sizes": list(spec.bigvgan_resblock_kernels),
        "resblock_dilation_sizes": [list(d) for d in spec.bigvgan_resblock_dilations],
    }


def check_spec(spec: Qwen25OmniRandomModelSpec) -> None:
    """Rules specific to random checkpoints (the generic ones are in ``validate_config``)."""
    check_common_spec(spec, len(QWEN_ADDED_TOKENS))
    if not set(spec.vision_fullatt_blocks) <= set(range(spec.vision_depth)):
        raise CheckpointError(
            f"spec: vision_fullatt_blocks {spec.vision_fullatt_blocks} must index layers of depth {spec.vision_depth}",
            param="vision_fullatt_blocks",
        )
    tokenizer_size = spec.tokenizer_bpe_vocab + len(QWEN_ADDED_TOKENS)
    padding_ids = {
        "tts_text_pad_id": spec.tts_text_pad_id,
        "tts_text_start_id": spec.tts_text_start_id,
        "tts_text_end_id": spec.tts_text_end_id,
        **{f"speaker_bos_ids[{i}]": v for i, v in enumerate(spec.speaker_bos_ids)},
    }
    for name, value in padding_ids.items():
        # Above the tokenizer so that no text ever encodes to them, below the embedding size.
        if not tokenizer_size <= value < spec.thinker_vocab:
            raise CheckpointError(
                f"spec: {name}={value} must lie in the thinker vocabulary padding "
                f"[{tokenizer_size}, {spec.thinker_vocab})",
                param=name,
            )
    if len(set(padding_ids.values())) != len(padding_ids):
        raise CheckpointError("spec: tts_text_* ids and speaker bos ids must be distinct", param="speaker_bos_ids")
    codec = {
        "codec_pad_id": spec.codec_pad_id,
        "codec_bos_id": spec.codec_bos_id,
        "codec_eos_id": spec.codec_eos_id,
        "codec_mask_id": spec.codec_mask_id,
    }
    for name, value in codec.items():
        if not spec.codec_speech_vocab <= value < spec.talker_vocab:
            raise CheckpointError(
                f"spec: {name}={value} must lie above the speech codes, "
                f"in [{spec.codec_speech_vocab}, {spec.talker_vocab})",
                param=name,
            )
    if spec.dit_num_embeds < spec.codec_speech_vocab:
        raise CheckpointError(
            f"spec: dit_num_embeds={spec.dit_num_embeds} cannot embed all {spec.codec_speech_vocab} speech codes",
            param="dit_num_embeds",
        )
    if len(spec.speaker_bos_ids) != len(SPEAKER_NAMES):
        raise CheckpointError(f"spec: speaker_bos_ids needs one id per voice {SPEAKER_NAMES}", param="speaker_bos_ids")


# --- Weights ----------------------------------------------------------------------------------
VISION_SEED_OFFSET = 2
"""The vision tower's weights come from generator seed ``spec.seed + VISION_SEED_OFFSET``."""

RNG_LAYOUT_VISION = {
    "depth": 1,
    "hidden_size": 32,
    "num_heads": 1,
    "intermediate_size": 64,
    "fullatt_block_indexes": [0],
}
"""The vision tower shape the model is first built with, then replaced by the spec's own tower drawn from its own
generator: the draws of every other part (thinker, talker, token2wav) never depend on the vision tower's shape, so
changing the tower leaves their random weights, and the tests tuned on them, as they were."""


def build_model(
    spec: Qwen25OmniRandomModelSpec,
    config: Any,
    *,
    device: torch.device | str = "cpu",
    dtype: torch.dtype = torch.float32,
) -> Any:
    """A seeded random ``Qwen2_5OmniForConditionalGeneration`` (token2wav float32), tuned by
    :func:`_tune_random_weights`, in eval mode. The vision tower is drawn separately (:data:`RNG_LAYOUT_VISION`)."""
    import copy

    from transformers import Qwen2_5OmniForConditionalGeneration
    from transformers.models.qwen2_5_omni.modeling_qwen2_5_omni import Qwen2_5OmniVisionEncoder

    layout = copy.deepcopy(config)
    for name, value in RNG_LAYOUT_VISION.items():
        setattr(layout.thinker_config.vision_config, name, value)
    layout.thinker_config.vision_config.out_hidden_size = spec.vision_out_hidden
    torch.manual_seed(spec.seed)  # seeds every device's generator
    with default_device_and_dtype(device, dtype):
        model = Qwen2_5OmniForConditionalGeneration(layout)
    holder = model.thinker if getattr(model.thinker, "visual", None) is not None else model.thinker.model
    torch.manual_seed(spec.seed + VISION_SEED_OFFSET)
    with default_device_and_dtype(device, dtype):
        visual = type(thinker_vision_tower(model.thinker, Qwen2_5OmniVisionEncoder))._from_config(
            config.thinker_config.vision_config
        )
        visual.post_init()
    holder.visual = visual
    for module in model.modules():
        if getattr(module, "config", None) is layout:
            module.config = config
        elif getattr(module, "config", None) is layout.thinker_config:
            module.config = config.thinker_config
    model.token2wav.float()
    _tune_random_weights(model, spec)
    return model.eval()


@torch.no_grad()
def _tune_random_weights(model: Any, spec: Qwen25OmniRandomModelSpec) -> None:
    """Make random weights behave enough like a voice model for end-to-end tests.

    * Audibility: BigVGAN's six upsampling stages shrink a random signal to ~1e-7; scaling the
      last convolution (``conv_post``, linear, no bias) by ``output_gain`` brings typical outputs to
      an RMS of roughly 0.05-0.3 without touching anything the streaming code depends on.
    * Stopping: with random logits each of the two stop ids (eos, pad) would be the greedy argmax
      about 1/vocab of the time, often within the first few codes. Shrinking their codec-head rows
      shrinks their logits toward 0 while the best of the other codes stays clearly positive, so
      greedy decoding rarely stops early; the logits stay finite, so sampling (and occasionally
      greedy decoding) still stops.
    * Ending a reply: the thinker's ``<|im_end|>`` would be sampled about once per thousand tokens, so
      a sampled reply ran to the length cap. :func:`~pipeline.models.common.random_tuning.hold_reply_end_logit`
      keeps its logit near ``spec.reply_end_logit``, below the usual best logit (greedy decoding seldom ends) but inside
      the sampler's top-k, so a reply sampled with the packaged settings ends on its own, after
      about a hundred tokens on average (some two seconds of speech).
    * Ending its speech: once the text has ended the talker is fed the same text-pad vector at every
      step and a random talker never samples its codec eos. :func:`_end_speech_after_text` raises
      that logit to ``spec.speech_end_logit`` exactly then: inside the sampler's top-k but below the
      best code, so sampled speech ends soon after the text while greedy decoding runs to its cap.
    """
    if spec.attention_sharpness != 1.0:
        _sharpen_attention(thinker_text_model(model.thinker).layers, spec.attention_sharpness)
        _sharpen_attention(model.talker.model.layers, spec.attention_sharpness)
    model.token2wav.code2wav_bigvgan_model.conv_post.weight.mul_(spec.output_gain)
    talker = model.talker
    for stop_id in (talker.codec_eos_token, talker.codec_pad_token):
        talker.codec_head.weight[stop_id].mul_(spec.stop_logit_scale)
    if spec.reply_end_logit is not None:
        end_id = added_token_ids(spec.tokenizer_bpe_vocab)[ckpt.IM_END]
        hold_reply_end_logit(model.thinker, end_id, spec.reply_end_logit)
    if spec.speech_end_logit is not None:
        _end_speech_after_text(model, spec, spec.speech_end_logit)


@torch.no_grad()
def _sharpen_attention(layers: Any, factor: float) -> None:
    """Multiply every layer's query and key projections (weights and biases) by ``factor``."""
    for layer in layers:
        for proj in (layer.self_attn.q_proj, layer.self_attn.k_proj):
            proj.weight.mul_(factor)
            if proj.bias is not None:
                proj.bias.mul_(factor)


@torch.no_grad()
def _end_speech_after_text(model: Any, spec: Qwen25OmniRandomModelSpec, level: float) -> None:
    """Make the talker's codec-eos logit about ``level`` whenever its input is the text-end or text-pad vector.

    A marker channel (the thinker's second-to-last) is non-zero only in the embeddings of
    ``tts_text_end`` / ``tts_text_pad`` (what the talker is fed once the text has ended) and is never
    written by a thinker layer, so the thinker's hidden states carry zero there. The talker's input
    projection copies it alone into the talker's last channel, which no talker layer writes either;
    the codec head reads that channel only in the eos row, calibrated on a probe of text-pad inputs.
    Before the text ends the channel is zero and the eos logit keeps its random value.
    """
    from transformers.models.qwen2_5_omni.modeling_qwen2_5_omni import Qwen2_5OmniThinkerTextModel

    text, talker = thinker_text_model(model.thinker, Qwen2_5OmniThinkerTextModel), model.talker
    marker, channel = spec.thinker_hidden - 2, spec.talker_hidden - 1
    embed = text.embed_tokens.weight
    mark_text_end(embed, [spec.tts_text_end_id, spec.tts_text_pad_id], marker)
    never_write(text.layers, marker)
    model.thinker.lm_head.weight[:, marker] = 0.0
    talker.model.embed_tokens.weight[:, marker] = 0.0
    proj = talker.thinker_to_talker_proj
    proj.weight[:, marker] = 0.0
    proj.weight[channel] = 0.0
    proj.bias[channel] = 0.0
    proj.weight[channel, marker] = 1.0
    never_write(talker.model.layers, channel)
    head = talker.codec_head.weight
    head[:, channel] = 0.0
    codes = torch.arange(32, device=embed.device).reshape(2, 16) % spec.codec_speech_vocab
    pad = embed[spec.tts_text_pad_id]
    probe = proj(talker.model.embed_tokens(codes) + pad)
    normed = talker.model(inputs_embeds=probe).last_hidden_state[..., channel].float().mean()
    head[spec.codec_eos_id, channel] = level / normed.item()


def make_speakers(spec: Qwen25OmniRandomModelSpec) -> dict[str, dict[str, Any]]:
    """Random voices in the ``spk_dict.pt`` format: ``{name: {"bos_token", "cond", "ref_mel"}}``.
    ``ref_mel`` values sit in the log-mel range the vocoder expects (about -11 to 2)."""
    generator = torch.Generator().manual_seed(spec.seed + 1)
    speakers = {}
    for name, bos in zip(SPEAKER_NAMES, spec.speaker_bos_ids, strict=True):
        cond = torch.randn(1, spec.speaker_dim, generator=generator)
        ref_mel = torch.randn(1, REF_MEL_FRAMES, spec.mel_dim, generator=generator) * 2.0 - 5.0
        speakers[name] = {"bos_token": bos, "cond": cond, "ref_mel": ref_mel}
    return speakers


IMAGE_PROCESSOR_TYPE = "Qwen2VLImageProcessor"
"""The reference image processor class the released ``preprocessor_config.json`` names."""


def _write_preprocessor_config(out_dir: Path, spec: Qwen25OmniRandomModelSpec) -> None:
    """``preprocessor_config.json`` as released: the Whisper feature extractor's settings and the image processor's
    in one object (each reference processor reads its own fields)."""
    write_preprocessor_config(
        out_dir,
        {"feature_size": MEL_BINS_IN, "sampling_rate": SAMPLE_RATE_IN, "return_attention_mask": True},
        {
            "image_processor_type": IMAGE_PROCESSOR_TYPE,
            "min_pixels": spec.image_min_pixels,
            "max_pixels": spec.image_max_pixels,
            "patch_size": spec.vision_patch_size,
            "merge_size": spec.vision_merge_size,
            "temporal_patch_size": spec.vision_temporal_patch_size,
            "image_mean": list(spec.image_mean),
            "image_std": list(spec.image_std),
        },
    )


def make_random_checkpoint(
    out_dir: str | Path,
    spec: Qwen25OmniRandomModelSpec = Qwen25OmniRandomModelSpec.tiny(),
    *,
    dtype: torch.dtype = torch.float32,
) -> Path:
    """Write a random checkpoint in the released Hugging Face layout to ``out_dir`` and return it.

    Offline, deterministic from ``spec.seed`` (byte-identical model.safetensors for the same seed
    and software), seconds for the tiny preset. Thinker and talker weights are stored in ``dtype``
    (token2wav in float32); weights above :data:`MAX_SHARD_SIZE` are split into
    ``model-0000X-of-0000N.safetensors`` + index like the released 7B. ``out_dir`` may exist; files
    of the same names are replaced.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    config = build_config(spec)
    ids = write_tokenizer(out, spec)
    model = build_model(spec, config, dtype=dtype)
    model.generation_config = generation_config(ids)
    model.save_pretrained(out, max_shard_size=MAX_SHARD_SIZE)
    torch.save(make_speakers(spec), out / ckpt.SPEAKERS_FILE)
    _write_preprocessor_config(out, spec)
    write_random_marker(out, spec.to_dict())
    return out


def build_random_model(
    spec: Qwen25OmniRandomModelSpec, *, device: torch.device | str = "cpu", dtype: torch.dtype = torch.bfloat16
) -> ckpt.Qwen25OmniLoadedCheckpoint:
    """The checkpoint of ``spec`` built in memory (no weights on disk), e.g. the 7B architecture
    on a GPU for benchmarks. Thinker and talker use ``dtype``, token2wav float32. The tokenizer and
    feature extractor are written to a fresh temp folder (``Qwen25OmniLoadedCheckpoint.path``), which the
    caller may delete once the tokenizer is loaded."""
    config = build_config(spec)
    with scratch_folder("omni-random-") as folder:
        write_tokenizer(folder, spec)
        _write_preprocessor_config(folder, spec)
        model = build_model(spec, config, device=device, dtype=dtype)
        tokenizer = ckpt.load_tokenizer(folder)
        feature_extractor = ckpt.load_feature_extractor(folder, config)
        vision = ckpt.load_vision_preprocessor(folder, config)
    return ckpt.Qwen25OmniLoadedCheckpoint(
        source=f"random:seed{spec.seed}",
        path=folder,
        config=config,
        thinker=model.thinker,
        talker=model.talker,
        token2wav=model.token2wav,
        tokenizer=tokenizer,
        feature_extractor=feature_extractor,
        speakers=ckpt.speakers_from_dict(make_speakers(spec), config, source="random speakers"),
        special=ckpt.Qwen25OmniSpecialTokens.from_config(config, tokenizer),
        random_weights=True,
        vision=vision,
    )


def parameter_count(spec: Qwen25OmniRandomModelSpec) -> int:
    """Parameters of the model ``spec`` describes, counted on the meta device (nothing allocated)."""
    from transformers import Qwen2_5OmniForConditionalGeneration

    with torch.device("meta"):
        model = Qwen2_5OmniForConditionalGeneration(build_config(spec))
    return sum(p.numel() for p in model.parameters())


# --- Command line -----------------------------------------------------------------------------
PRESETS = {"tiny": Qwen25OmniRandomModelSpec.tiny, "7b": Qwen25OmniRandomModelSpec.qwen2_5_omni_7b}
PRESET_DTYPES = {"tiny": torch.float32, "7b": torch.bfloat16}
"""The 7B preset is stored in bfloat16 like the released checkpoint (about 22 GB)."""


def build_arg_parser(prog: str | None = None) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=prog, description="Write a random-weight Qwen2.5-Omni checkpoint.")
    parser.add_argument("--out", required=True, type=Path, help="output folder (created if missing)")
    parser.add_argument("--preset", choices=sorted(PRESETS), default="tiny", help="model size (default: tiny)")
    parser.add_argument("--seed", type=int, default=0, help="weight seed (default: 0)")
    return parser


def main(argv: Sequence[str] | None = None, *, prog: str | None = None) -> int:
    """``make-tiny-model`` entry point: parse ``argv`` (default ``sys.argv[1:]``; ``prog``: the command's name in
    its help), write, report."""
    args = build_arg_parser(prog).parse_args(argv)
    spec = PRESETS[args.preset](seed=args.seed)
    start = time.perf_counter()
    out = make_random_checkpoint(args.out, spec, dtype=PRESET_DTYPES[args.preset])
    size_mb = sum(f.stat().st_size for f in out.iterdir() if f.is_file()) / 1e6
    print(
        f"wrote {args.preset} random checkpoint (seed {args.seed}) to {out}: {size_mb:.1f} MB "
        f"in {time.perf_counter() - start:.1f} s"
    )
    return 0


__all__ = [
    "Qwen25OmniRandomModelSpec",
    "build_config",
    "build_random_model",
    "make_random_checkpoint",
    "parameter_count",
    "main",
]
