"""Facts about the released ``Qwen/Qwen3-Omni-30B-A3B-Instruct`` checkpoint, as values.

Where they come from: the checkpoint's ``config.json`` (as copied into public repositories and as transformers 5.7
prints ``Qwen3OmniMoeConfig`` for the downloaded checkpoint), its ``tokenizer_config.json`` (added tokens and the
processor's named tokens) and its ``preprocessor_config.json``; the ``-Thinking`` and ``-Captioner`` checkpoints share
the thinker and the preprocessor settings and write ``enable_audio_output: false``. Only the values this project
needs are recorded, grouped like the config's sub-configs and named like its keys (the raw file writes the rotary
settings as ``rope_theta`` + ``rope_scaling``; transformers 5 reads them into ``rope_parameters``, as here).

This module is data: :mod:`.tiny` writes configs from it and tests assert released values against it. The engine
never reads ids from here; it reads them from the checkpoint it loads.
"""

from __future__ import annotations

from types import MappingProxyType
from typing import Any


def _frozen(mapping: dict[str, Any]) -> MappingProxyType:
    return MappingProxyType({k: _frozen(v) if isinstance(v, dict) else v for k, v in mapping.items()})


REPO_ID = "Qwen/Qwen3-Omni-30B-A3B-Instruct"

TOP_LEVEL = _frozen(
    {
        "model_type": "qwen3_omni_moe",
        "architectures": ["Qwen3OmniMoeForConditionalGeneration"],
        "enable_audio_output": True,
        "im_start_token_id": 151644,
        "im_end_token_id": 151645,
        "tts_pad_token_id": 151671,
        "tts_bos_token_id": 151672,
        "tts_eos_token_id": 151673,
        "system_token_id": 8948,
        "user_token_id": 872,
        "assistant_token_id": 77091,
    }
)
"""Keys of the top-level config (``system/user/assistant_token_id`` are the BPE ids of the role words, not added
tokens; ``tts_*`` are added tokens of the thinker's vocabulary that the talker embeds through the thinker's table)."""

THINKER = _frozen(
    {
        "audio_token_id": 151675,
        "image_token_id": 151655,
        "video_token_id": 151656,
        "audio_start_token_id": 151669,
        "audio_end_token_id": 151670,
        "vision_start_token_id": 151652,
        "vision_end_token_id": 151653,
        "user_token_id": 872,
        "position_id_per_seconds": 13,
        "seconds_per_chunk": 2,
        "tie_word_embeddings": False,
    }
)
"""``thinker_config`` keys beside its three sub-configs."""

THINKER_TEXT = _frozen(
    {
        "vocab_size": 152064,
        "hidden_size": 2048,
        "intermediate_size": 768,
        "moe_intermediate_size": 768,
        "num_hidden_layers": 48,
        "num_attention_heads": 32,
        "num_key_value_heads": 4,
        "head_dim": 128,
        "num_experts": 128,
        "num_experts_per_tok": 8,
        "norm_topk_prob": True,
        "decoder_sparse_step": 1,
        "mlp_only_layers": [],
        "shared_expert_intermediate_size": 0,
        "use_qk_norm": True,
        "max_position_embeddings": 65536,
        "rms_norm_eps": 1e-6,
        "hidden_act": "silu",
        "tie_word_embeddings": False,
        "rope_parameters": {
            "rope_type": "default",
            "rope_theta": 1_000_000,
            "mrope_section": [24, 20, 20],
            "interleaved": True,
            "mrope_interleaved": True,
        },
    }
)
"""``thinker_config.text_config``: the Qwen3-30B-A3B MoE decoder (no shared expert, q/k RMSNorm). ``mrope_section``
[t, h, w] sums to ``head_dim / 2``; the sections are interleaved over the rotary frequencies (t, h, w, t, h, w, ...),
unlike Qwen2.5's contiguous blocks."""

AUDIO = _frozen(
    {
        "num_mel_bins": 128,
        "d_model": 1280,
        "encoder_layers": 32,
        "encoder_attention_heads": 20,
        "encoder_ffn_dim": 5120,
        "downsample_hidden_size": 480,
        "output_dim": 2048,
        "n_window": 50,
        "n_window_infer": 800,
        "conv_chunksize": 500,
        "max_source_positions": 1500,
        "activation_function": "gelu",
    }
)
"""``thinker_config.audio_config`` (AuT): mel windows of ``2 * n_window`` frames are each downsampled 8x by three
stride-2 convolutions (13 tokens a full 100-frame window); attention spans ``n_window_infer`` frames."""

VISION = _frozen(
    {
        "depth": 27,
        "hidden_size": 1152,
        "num_heads": 16,
        "intermediate_size": 4304,
        "hidden_act": "gelu_pytorch_tanh",
        "patch_size": 16,
        "temporal_patch_size": 2,
        "spatial_merge_size": 2,
        "in_channels": 3,
        "out_hidden_size": 2048,
        "num_position_embeddings": 2304,
        "deepstack_visual_indexes": [8, 16, 24],
        "apply_vit_abs_pos_embed": True,
        "tokens_per_second": 2,
        "image_size": 768,
    }
)
"""``thinker_config.vision_config`` (SigLIP2-So400M shape): one token per 32x32 pixels per 2 frames; the features of
layers ``deepstack_visual_indexes`` go, each through its own merger, into the first thinker layers' hidden states."""

TALKER = _frozen(
    {
        "accept_hidden_layer": 24,
        "thinker_hidden_size": 2048,
        "num_code_groups": 16,
        "codec_pad_id": 2148,
        "codec_bos_id": 2149,
        "codec_eos_token_id": 2150,
        "codec_nothink_id": 2155,
        "codec_think_bos_id": 2156,
        "codec_think_eos_id": 2157,
        "speaker_id": {"chelsie": 2301, "ethan": 2302, "aiden": 2303},
        "audio_token_id": 151675,
        "image_token_id": 151655,
        "video_token_id": 151656,
        "audio_start_token_id": 151669,
        "audio_end_token_id": 151670,
        "vision_start_token_id": 151652,
        "position_id_per_seconds": 13,
        "seconds_per_chunk": 2,
        "spatial_merge_size": 2,
        "tie_word_embeddings": False,
    }
)
"""``talker_config`` keys beside its two sub-configs. Codec control ids and speakers live in the talker's codec
vocabulary, above the 2048 codes of codebook 0."""

TALKER_TEXT = _frozen(
    {
        "vocab_size": 3072,
        "hidden_size": 1024,
        "intermediate_size": 2048,
        "moe_intermediate_size": 384,
        "shared_expert_intermediate_size": 768,
        "num_hidden_layers": 20,
        "num_attention_heads": 16,
        "num_key_value_heads": 2,
        "head_dim": 128,
        "num_experts": 128,
        "num_experts_per_tok": 6,
        "norm_topk_prob": True,
        "decoder_sparse_step": 1,
        "mlp_only_layers": [],
        "max_position_embeddings": 65536,
        "rms_norm_eps": 1e-6,
        "hidden_act": "silu",
        "rope_parameters": {
            "rope_type": "default",
            "rope_theta": 1_000_000,
            "mrope_section": [24, 20, 20],
            "interleaved": True,
        },
    }
)
"""``talker_config.text_config``: an MoE decoder with a gated shared expert; ``intermediate_size`` is also the width
of the talker's two input projections (thinker hidden -> talker hidden). The reference suppresses the last 1024 ids
of ``vocab_size`` but ``codec_eos_token_id`` when sampling codebook 0."""

CODE_PREDICTOR = _frozen(
    {
        "vocab_size": 2048,
        "hidden_size": 1024,
        "intermediate_size": 3072,
        "num_hidden_layers": 5,
        "num_attention_heads": 16,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "num_code_groups": 16,
        "max_position_embeddings": 32768,
        "rms_norm_eps": 1e-6,
        "hidden_act": "silu",
        "rope_parameters": {"rope_type": "default", "rope_theta": 1_000_000},
    }
)
"""``talker_config.code_predictor_config``: a dense decoder that, per frame, reads the talker's last hidden state and
codebook 0's embedding and samples codebooks 1..15 in sequence (one embedding table and one head per codebook)."""

CODE2WAV = _frozen(
    {
        "codebook_size": 2048,
        "num_quantizers": 16,
        "hidden_size": 1024,
        "intermediate_size": 3072,
        "num_hidden_layers": 8,
        "num_attention_heads": 16,
        "num_key_value_heads": 16,
        "sliding_window": 72,
        "max_position_embeddings": 8000,
        "rms_norm_eps": 1e-5,
        "layer_scale_initial_scale": 0.01,
        "hidden_act": "silu",
        "decoder_dim": 1536,
        "upsample_rates": [8, 5, 4, 3],
        "upsampling_ratios": [2, 2],
        "rope_parameters": {"rope_type": "default", "rope_theta": 10_000},
        "num_semantic_quantizers": 1,
        "semantic_codebook_size": 4096,
        "vector_quantization_hidden_dimension": 512,
        "codebook_dim": 512,
    }
)
"""``code2wav_config``: the 16 codebooks' mean embedding -> a causal sliding-window transformer (window 72 frames) ->
two 2x transposed-convolution upsamplers -> a causal ConvNet decoder (rates 8, 5, 4, 3; channels halving from
``decoder_dim``). Samples per codec frame: 8*5*4*3*2*2 = 1920 (80 ms at 24 kHz, 12.5 frames/s). The last four keys
describe the codec's quantizer and are read by nothing in transformers."""

SAMPLE_RATE_OUT = 24_000
"""code2wav's output sample rate (Hz)."""

CODEC_FRAMES_PER_SECOND = 12.5
"""Codec frames per second of speech: :data:`SAMPLE_RATE_OUT` / 1920."""

QWEN3_ADDED_TOKENS: tuple[tuple[str, int, bool], ...] = (
    ("<|endoftext|>", 151643, True),
    ("<|im_start|>", 151644, True),
    ("<|im_end|>", 151645, True),
    ("<|object_ref_start|>", 151646, True),
    ("<|object_ref_end|>", 151647, True),
    ("<|box_start|>", 151648, True),
    ("<|box_end|>", 151649, True),
    ("<|quad_start|>", 151650, True),
    ("<|quad_end|>", 151651, True),
    ("<|vision_start|>", 151652, True),
    ("<|vision_end|>", 151653, True),
    ("<|vision_pad|>", 151654, True),
    ("<|image_pad|>", 151655, True),
    ("<|video_pad|>", 151656, True),
    ("<tool_call>", 151657, False),
    ("</tool_call>", 151658, False),
    ("<|fim_prefix|>", 151659, False),
    ("<|fim_middle|>", 151660, False),
    ("<|fim_suffix|>", 151661, False),
    ("<|fim_pad|>", 151662, False),
    ("<|repo_name|>", 151663, False),
    ("<|file_sep|>", 151664, False),
    ("<tool_response>", 151665, False),
    ("</tool_response>", 151666, False),
    ("<think>", 151667, False),
    ("</think>", 151668, False),
    ("<|audio_start|>", 151669, True),
    ("<|audio_end|>", 151670, True),
    ("<tts_pad>", 151671, True),
    ("<tts_text_bos>", 151672, True),
    ("<tts_text_eod>", 151673, True),
    ("<tts_text_bos_single>", 151674, True),
    ("<|audio_pad|>", 151675, True),
)
"""The tokenizer's added tokens in their released order: ``(content, id, special)``; the ids follow the 151643 BPE
entries. ``special`` tokens are dropped by ``decode(skip_special_tokens=True)``."""

TOKENIZER_NAMED_TOKENS = _frozen(
    {
        "audio_token": "<|audio_pad|>",
        "audio_bos_token": "<|audio_start|>",
        "audio_eos_token": "<|audio_end|>",
        "image_token": "<|image_pad|>",
        "video_token": "<|video_pad|>",
        "vision_bos_token": "<|vision_start|>",
        "vision_eos_token": "<|vision_end|>",
    }
)
"""Tokens ``tokenizer_config.json`` names (``Qwen3OmniMoeProcessor`` reads them from the tokenizer)."""

TOKENIZER = _frozen(
    {
        "tokenizer_class": "Qwen2Tokenizer",
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "bos_token": None,
        "unk_token": None,
        "add_prefix_space": False,
        "errors": "replace",
        "split_special_tokens": False,
        "clean_up_tokenization_spaces": False,
    }
)
"""``tokenizer_config.json`` settings beside the added tokens."""

PREPROCESSOR = _frozen(
    {
        "processor_class": "Qwen3OmniMoeProcessor",
        "feature_extractor_type": "WhisperFeatureExtractor",
        "feature_size": 128,
        "sampling_rate": 16000,
        "hop_length": 160,
        "n_fft": 400,
        "chunk_length": 300,
        "n_samples": 4_800_000,
        "nb_max_frames": 30000,
        "dither": 0.0,
        "padding_value": 0.0,
        "padding_side": "right",
        "return_attention_mask": True,
        "image_processor_type": "Qwen2VLImageProcessor",
        "patch_size": 16,
        "temporal_patch_size": 2,
        "merge_size": 2,
        "min_pixels": 3136,
        "max_pixels": 12845056,
        "image_mean": [0.5, 0.5, 0.5],
        "image_std": [0.5, 0.5, 0.5],
    }
)
"""``preprocessor_config.json``: Whisper's 128-bin log-mel at 16 kHz with a 10 ms hop (inputs up to 300 s), and the
image processor's settings beside them in the same object."""

PARAMETERS_B = _frozen({"total": 35.26, "thinker": 31.7, "talker": 3.3, "code2wav": 0.2})
"""Parameter counts (billions) of the model the released config describes, per part and in total."""

__all__ = [
    "AUDIO",
    "CODE2WAV",
    "CODEC_FRAMES_PER_SECOND",
    "CODE_PREDICTOR",
    "PARAMETERS_B",
    "PREPROCESSOR",
    "QWEN3_ADDED_TOKENS",
    "REPO_ID",
    "SAMPLE_RATE_OUT",
    "TALKER",
    "TALKER_TEXT",
    "THINKER",
    "THINKER_TEXT",
    "TOKENIZER",
    "TOKENIZER_NAMED_TOKENS",
    "TOP_LEVEL",
    "VISION",
]
