"""A random Qwen3-Omni's ``Qwen3OmniMoeConfig``, built from a :class:`~.tiny_spec.Qwen3OmniRandomModelSpec` and checked.

Every special id the config names is the id the written tokenizer gives that token (:func:`token_ids`): the added
tokens follow the BPE in the released order (:data:`~.released.QWEN3_ADDED_TOKENS`), and the role ids
(``system/user/assistant_token_id``) are the BPE ids of the role words, as in the released tokenizer.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any

from pipeline.errors import CheckpointError
from pipeline.models.common import bpe
from pipeline.models.common.random_checkpoint import check_common_spec
from pipeline.models.qwen3_omni import released
from pipeline.models.qwen3_omni.hf_logging import quiet_rope_key_warnings

if TYPE_CHECKING:
    from pipeline.models.qwen3_omni.tiny_spec import Qwen3OmniRandomModelSpec

ADDED_TOKENS: tuple[tuple[str, bool], ...] = tuple(
    (token, special) for token, _, special in released.QWEN3_ADDED_TOKENS
)
"""The tokenizer's added tokens ``(content, special)`` in their released order."""

TALKER_SUPPRESSED_TAIL = 1024
"""The reference samples codebook 0 with the last this many codec ids suppressed but codec-eos (the control ids and
speakers live there)."""

SAMPLES_PER_FRAME = round(released.SAMPLE_RATE_OUT / released.CODEC_FRAMES_PER_SECOND)
"""24 kHz samples per codec frame (1920): code2wav's upsampling rates must multiply to this."""


def token_ids(bpe_vocab_size: int) -> dict[str, int]:
    """Ids of the added tokens and of the role words (``"system"``, ``"user"``, ``"assistant"``) in the tokenizer
    written for ``bpe_vocab_size`` BPE entries."""
    return {**bpe.added_token_ids(bpe_vocab_size, [t for t, _ in ADDED_TOKENS]), **_role_ids(bpe_vocab_size)}


@functools.lru_cache(maxsize=4)
def _role_ids(bpe_vocab_size: int) -> dict[str, int]:
    tokenizer = bpe.train_bpe(bpe_vocab_size, bpe.role_prefixed_corpus())
    ids = {}
    for role in bpe.CHAT_ROLES:
        encoded = tokenizer.encode(role).ids
        if len(encoded) != 1:
            raise CheckpointError(f"tokenizer: the role word {role!r} is {len(encoded)} BPE tokens, not one")
        ids[role] = encoded[0]
    return ids


def build_config(spec: Qwen3OmniRandomModelSpec) -> Any:
    """A ``transformers.Qwen3OmniMoeConfig`` for ``spec`` (checked by :func:`check_spec` first)."""
    from transformers import Qwen3OmniMoeConfig

    quiet_rope_key_warnings()
    check_spec(spec)
    ids = token_ids(spec.tokenizer_bpe_vocab)
    markers = {
        "audio_token_id": ids["<|audio_pad|>"],
        "image_token_id": ids["<|image_pad|>"],
        "video_token_id": ids["<|video_pad|>"],
        "audio_start_token_id": ids["<|audio_start|>"],
        "vision_start_token_id": ids["<|vision_start|>"],
        "position_id_per_seconds": spec.position_id_per_seconds,
        "seconds_per_chunk": spec.seconds_per_chunk,
    }
    thinker = {
        **markers,
        "audio_end_token_id": ids["<|audio_end|>"],
        "vision_end_token_id": ids["<|vision_end|>"],
        "user_token_id": ids["user"],
        "tie_word_embeddings": False,
        "text_config": _thinker_text(spec, ids),
        "audio_config": _audio(spec),
        "vision_config": _vision(spec),
    }
    return Qwen3OmniMoeConfig(
        thinker_config=thinker,
        talker_config=_talker(spec, markers, ids),
        code2wav_config=_code2wav(spec),
        enable_audio_output=spec.enable_audio_output,
        im_start_token_id=ids["<|im_start|>"],
        im_end_token_id=ids["<|im_end|>"],
        tts_pad_token_id=ids["<tts_pad>"],
        tts_bos_token_id=ids["<tts_text_bos>"],
        tts_eos_token_id=ids["<tts_text_eod>"],
        system_token_id=ids["system"],
        user_token_id=ids["user"],
        assistant_token_id=ids["assistant"],
    )


def _rope(
    spec: Qwen3OmniRandomModelSpec, section: tuple[int, int, int] | None, *, thinker: bool = False
) -> dict[str, Any]:
    rope: dict[str, Any] = {"rope_type": "default", "rope_theta": spec.rope_theta}
    if section is not None:
        rope.update(mrope_section=list(section), interleaved=True)
        if thinker:
            rope["mrope_interleaved"] = True
    return rope


def _thinker_text(spec: Qwen3OmniRandomModelSpec, ids: dict[str, int]) -> dict[str, Any]:
    return {
        "vocab_size": spec.thinker_vocab,
        "hidden_size": spec.thinker_hidden,
        "intermediate_size": spec.thinker_moe_intermediate,
        "moe_intermediate_size": spec.thinker_moe_intermediate,
        "num_hidden_layers": spec.thinker_layers,
        "num_attention_heads": spec.thinker_heads,
        "num_key_value_heads": spec.thinker_kv_heads,
        "head_dim": spec.thinker_head_dim,
        "num_experts": spec.thinker_experts,
        "num_experts_per_tok": spec.thinker_experts_per_tok,
        "norm_topk_prob": True,
        "decoder_sparse_step": 1,
        "mlp_only_layers": [],
        "shared_expert_intermediate_size": 0,
        "use_qk_norm": True,
        "max_position_embeddings": spec.max_position_embeddings,
        "rms_norm_eps": released.THINKER_TEXT["rms_norm_eps"],
        "rope_parameters": _rope(spec, spec.thinker_mrope_section, thinker=True),
        "tie_word_embeddings": False,
    }


def _audio(spec: Qwen3OmniRandomModelSpec) -> dict[str, Any]:
    return {
        "num_mel_bins": released.AUDIO["num_mel_bins"],
        "d_model": spec.audio_d_model,
        "encoder_layers": spec.audio_layers,
        "encoder_attention_heads": spec.audio_heads,
        "encoder_ffn_dim": spec.audio_ffn,
        "downsample_hidden_size": spec.audio_downsample_hidden,
        "output_dim": spec.thinker_hidden,
        "n_window": spec.audio_n_window,
        "n_window_infer": spec.audio_n_window_infer,
        "conv_chunksize": released.AUDIO["conv_chunksize"],
        "max_source_positions": released.AUDIO["max_source_positions"],
    }


def _vision(spec: Qwen3OmniRandomModelSpec) -> dict[str, Any]:
    return {
        "depth": spec.vision_depth,
        "hidden_size": spec.vision_hidden,
        "num_heads": spec.vision_heads,
        "intermediate_size": spec.vision_intermediate,
        "hidden_act": released.VISION["hidden_act"],
        "patch_size": spec.vision_patch_size,
        "temporal_patch_size": spec.vision_temporal_patch_size,
        "spatial_merge_size": spec.vision_merge_size,
        "in_channels": 3,
        "out_hidden_size": spec.thinker_hidden,
        "num_position_embeddings": spec.vision_position_embeddings,
        "deepstack_visual_indexes": list(spec.vision_deepstack_indexes),
    }


def _talker(spec: Qwen3OmniRandomModelSpec, markers: dict[str, Any], ids: dict[str, int]) -> dict[str, Any]:
    text = {
        "vocab_size": spec.talker_vocab,
        "hidden_size": spec.talker_hidden,
        "intermediate_size": spec.talker_intermediate,
        "moe_intermediate_size": spec.talker_moe_intermediate,
        "shared_expert_intermediate_size": spec.talker_shared_expert_intermediate,
        "num_hidden_layers": spec.talker_layers,
        "num_attention_heads": spec.talker_heads,
        "num_key_value_heads": spec.talker_kv_heads,
        "head_dim": spec.talker_head_dim,
        "num_experts": spec.talker_experts,
        "num_experts_per_tok": spec.talker_experts_per_tok,
        "norm_topk_prob": True,
        "decoder_sparse_step": 1,
        "mlp_only_layers": [],
        "max_position_embeddings": spec.max_position_embeddings,
        "rms_norm_eps": released.TALKER_TEXT["rms_norm_eps"],
        "rope_parameters": _rope(spec, spec.talker_mrope_section),
    }
    predictor = {
        "vocab_size": spec.codebook_size,
        "hidden_size": spec.talker_hidden,
        "intermediate_size": spec.predictor_intermediate,
        "num_hidden_layers": spec.predictor_layers,
        "num_attention_heads": spec.predictor_heads,
        "num_key_value_heads": spec.predictor_kv_heads,
        "head_dim": spec.predictor_head_dim,
        "num_code_groups": spec.num_code_groups,
        "max_position_embeddings": released.CODE_PREDICTOR["max_position_embeddings"],
        "rms_norm_eps": released.CODE_PREDICTOR["rms_norm_eps"],
        "rope_parameters": _rope(spec, None),
    }
    return {
        **markers,
        "audio_end_token_id": ids["<|audio_end|>"],
        "text_config": text,
        "code_predictor_config": predictor,
        "accept_hidden_layer": spec.accept_hidden_layer,
        "thinker_hidden_size": spec.thinker_hidden,
        "num_code_groups": spec.num_code_groups,
        "codec_pad_id": spec.codec_pad_id,
        "codec_bos_id": spec.codec_bos_id,
        "codec_eos_token_id": spec.codec_eos_id,
        "codec_nothink_id": spec.codec_nothink_id,
        "codec_think_bos_id": spec.codec_think_bos_id,
        "codec_think_eos_id": spec.codec_think_eos_id,
        "speaker_id": spec.speakers,
        "spatial_merge_size": spec.vision_merge_size,
        "tie_word_embeddings": False,
    }


def _code2wav(spec: Qwen3OmniRandomModelSpec) -> dict[str, Any]:
    return {
        "codebook_size": spec.codebook_size,
        "num_quantizers": spec.num_code_groups,
        "hidden_size": spec.code2wav_hidden,
        "intermediate_size": spec.code2wav_intermediate,
        "num_hidden_layers": spec.code2wav_layers,
        "num_attention_heads": spec.code2wav_heads,
        "num_key_value_heads": spec.code2wav_kv_heads,
        "sliding_window": spec.code2wav_sliding_window,
        "max_position_embeddings": spec.code2wav_max_position_embeddings,
        "rms_norm_eps": released.CODE2WAV["rms_norm_eps"],
        "layer_scale_initial_scale": released.CODE2WAV["layer_scale_initial_scale"],
        "decoder_dim": spec.code2wav_decoder_dim,
        "upsample_rates": list(spec.code2wav_upsample_rates),
        "upsampling_ratios": list(spec.code2wav_upsampling_ratios),
        "rope_parameters": {
            "rope_type": "default",
            "rope_theta": float(released.CODE2WAV["rope_parameters"]["rope_theta"]),
        },
    }


def _fail(message: str, param: str) -> None:
    raise CheckpointError(f"spec: {message}", param=param)


def check_spec(spec: Qwen3OmniRandomModelSpec) -> None:
    """The cross-part size rules a random Qwen3-Omni must keep; :class:`CheckpointError` naming the field otherwise."""
    check_common_spec(spec, len(ADDED_TOKENS))
    _check_attention(spec)
    _check_codec(spec)
    _check_vision_and_audio(spec)


def _check_attention(spec: Qwen3OmniRandomModelSpec) -> None:
    stacks = {
        "thinker": (spec.thinker_heads, spec.thinker_kv_heads, spec.thinker_head_dim, spec.thinker_mrope_section),
        "talker": (spec.talker_heads, spec.talker_kv_heads, spec.talker_head_dim, spec.talker_mrope_section),
        "predictor": (spec.predictor_heads, spec.predictor_kv_heads, spec.predictor_head_dim, None),
        "code2wav": (spec.code2wav_heads, spec.code2wav_kv_heads, spec.code2wav_hidden // spec.code2wav_heads, None),
    }
    for name, (heads, kv_heads, head_dim, section) in stacks.items():
        if heads % kv_heads:
            _fail(f"{name} heads ({heads}) must be a multiple of its kv heads ({kv_heads})", f"{name}_kv_heads")
        if head_dim % 2:
            _fail(f"{name} head_dim ({head_dim}) must be even (rotary halves)", f"{name}_head_dim")
        if section is not None and sum(section) != head_dim // 2:
            _fail(f"{name}_mrope_section {section} must sum to head_dim / 2 = {head_dim // 2}", f"{name}_mrope_section")
        if section is not None and not section[0] >= section[1] >= section[2]:
            # Interleaved mrope gives h and w every third frequency up to 3 * their section: t keeps the rest.
            _fail(f"{name}_mrope_section {section} must not grow from t to h to w", f"{name}_mrope_section")
    if spec.code2wav_hidden % spec.code2wav_heads:
        _fail("code2wav_hidden must be a multiple of code2wav_heads", "code2wav_heads")
    if not 0 <= spec.accept_hidden_layer <= spec.thinker_layers:
        _fail(
            f"accept_hidden_layer must index the thinker's hidden states 0..{spec.thinker_layers}",
            "accept_hidden_layer",
        )
    for name in ("thinker_experts_per_tok", "talker_experts_per_tok"):
        experts = getattr(spec, name.replace("_per_tok", ""))
        if not 0 < getattr(spec, name) <= experts:
            _fail(f"{name} must lie in 1..{experts}", name)


def _check_codec(spec: Qwen3OmniRandomModelSpec) -> None:
    control = {
        "codec_pad_id": spec.codec_pad_id,
        "codec_bos_id": spec.codec_bos_id,
        "codec_eos_id": spec.codec_eos_id,
        "codec_nothink_id": spec.codec_nothink_id,
        "codec_think_bos_id": spec.codec_think_bos_id,
        "codec_think_eos_id": spec.codec_think_eos_id,
        **{f"speaker_ids[{name}]": value for name, value in spec.speaker_ids},
    }
    suppressed_from = spec.talker_vocab - TALKER_SUPPRESSED_TAIL
    if not spec.codebook_size <= suppressed_from:
        _fail(
            f"talker_vocab={spec.talker_vocab} must be at least codebook_size + {TALKER_SUPPRESSED_TAIL} "
            f"(the reference never samples the last {TALKER_SUPPRESSED_TAIL} ids but codec-eos)",
            "talker_vocab",
        )
    for name, value in control.items():
        if not suppressed_from <= value < spec.talker_vocab:
            _fail(
                f"{name}={value} must lie in the talker's control range [{suppressed_from}, {spec.talker_vocab})", name
            )
    if len(set(control.values())) != len(control):
        _fail("codec control ids and speaker ids must be distinct", "speaker_ids")
    if not spec.speaker_ids:
        _fail("at least one speaker is needed", "speaker_ids")
    if any(name != name.lower() for name, _ in spec.speaker_ids):
        _fail("speaker names are lower case (the reference looks them up lower-cased)", "speaker_ids")
    if spec.num_code_groups < 2:
        _fail("num_code_groups must be at least 2 (codebook 0 and a residual one)", "num_code_groups")
    samples = 1
    for rate in (*spec.code2wav_upsample_rates, *spec.code2wav_upsampling_ratios):
        samples *= rate
    if samples != SAMPLES_PER_FRAME:
        _fail(
            f"code2wav's rates multiply to {samples} samples a frame, not {SAMPLES_PER_FRAME} "
            f"({released.SAMPLE_RATE_OUT} Hz at {released.CODEC_FRAMES_PER_SECOND} frames/s)",
            "code2wav_upsample_rates",
        )
    if spec.code2wav_decoder_dim % 2 ** len(spec.code2wav_upsample_rates):
        _fail(
            f"code2wav_decoder_dim must halve {len(spec.code2wav_upsample_rates)} times (one per upsample rate)",
            "code2wav_decoder_dim",
        )
    if spec.code2wav_sliding_window < 1:
        _fail("code2wav_sliding_window must be positive", "code2wav_sliding_window")


def _check_vision_and_audio(spec: Qwen3OmniRandomModelSpec) -> None:
    side = round(spec.vision_position_embeddings**0.5)
    if side * side != spec.vision_position_embeddings:
        _fail("vision_position_embeddings must be a square (a side x side grid)", "vision_position_embeddings")
    indexes = spec.vision_deepstack_indexes
    if not set(indexes) <= set(range(spec.vision_depth)) or len(set(indexes)) != len(indexes):
        _fail(
            f"vision_deepstack_indexes {indexes} must be distinct layers of depth {spec.vision_depth}",
            "vision_deepstack_indexes",
        )
    if len(indexes) > spec.thinker_layers:
        _fail(
            "each deepstack feature goes into its own thinker layer: too many deepstack indexes",
            "vision_deepstack_indexes",
        )
    if spec.vision_hidden % spec.vision_heads or (spec.vision_hidden // spec.vision_heads) % 2:
        _fail("vision_hidden / vision_heads must be an even head size", "vision_heads")
    if spec.audio_d_model % spec.audio_heads:
        _fail("audio_d_model must be a multiple of audio_heads", "audio_heads")
    if spec.audio_n_window_infer % (2 * spec.audio_n_window):
        _fail("audio_n_window_infer must be a whole number of 2 * audio_n_window windows", "audio_n_window_infer")
    if not 0 < spec.image_min_pixels <= spec.image_max_pixels:
        _fail("image pixel budget must satisfy 0 < image_min_pixels <= image_max_pixels", "image_min_pixels")


__all__ = ["ADDED_TOKENS", "build_config", "check_spec", "token_ids"]
