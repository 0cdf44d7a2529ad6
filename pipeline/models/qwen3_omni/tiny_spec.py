"""The sizes of a random Qwen3-Omni (:class:`Qwen3OmniRandomModelSpec`) and its presets: ``tiny`` for CPU tests,
``sharpened`` (the tiny one made position-sensitive) and the released 30B-A3B shape for GPU benchmarks."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from pipeline.models.common.random_checkpoint import RandomSpecPresets
from pipeline.models.qwen3_omni import released

TEST_ATTENTION_SHARPNESS = 8.0
"""Query/key scale of the sharpened test checkpoint (on the q/k RMSNorm weights, so attention logits grow by its
square). A random model's attention is nearly uniform and its greedy tokens hardly depend on positions; at 8 a wrong
position changes them within a few steps."""

TINY_CODEBOOK_SIZE = 128
"""Codes per codebook of the tiny model (the released one has 2048)."""


def codec_ids_for(codebook_size: int) -> dict[str, Any]:
    """Codec control and speaker ids at the released offsets above a codebook of ``codebook_size`` codes (the released
    ids are 2048 + 100... for 2048 codes), so every preset keeps the released layout of the codec vocabulary."""
    shift = codebook_size - released.CODE2WAV["codebook_size"]
    talker = released.TALKER
    return {
        "codec_pad_id": talker["codec_pad_id"] + shift,
        "codec_bos_id": talker["codec_bos_id"] + shift,
        "codec_eos_id": talker["codec_eos_token_id"] + shift,
        "codec_nothink_id": talker["codec_nothink_id"] + shift,
        "codec_think_bos_id": talker["codec_think_bos_id"] + shift,
        "codec_think_eos_id": talker["codec_think_eos_id"] + shift,
        "speaker_ids": tuple((name, sid + shift) for name, sid in talker["speaker_id"].items()),
    }


@dataclass(frozen=True)
class Qwen3OmniRandomModelSpec(RandomSpecPresets):
    """Every size of a random Qwen3-Omni. Units: sizes in channels, ``*_vocab`` / ``*_id`` in token or code ids.

    The thinker's vocabulary holds the BPE (``tokenizer_bpe_vocab`` entries), then the added tokens, then padding up
    to ``thinker_vocab``. The talker's codec vocabulary holds the ``codebook_size`` codes of codebook 0, then control
    ids and speakers; its last 1024 ids are what the reference never samples but for codec-eos. Tuning knobs
    (``None`` or 1.0 leave the random init alone): ``output_gain`` multiplies code2wav's last convolution (a tiny
    random code2wav outputs an RMS of ~2e-8; the default brings it to ~0.1);
    ``stop_logit_scale`` shrinks the talker's codec-eos head row; ``reply_end_logit`` is the level the thinker's
    ``<|im_end|>`` logit is held near; ``speech_end_logit`` is the talker's codec-eos logit once the reply's text has
    ended; ``attention_sharpness`` multiplies the thinker's and the talker's q/k RMSNorm weights.
    ``enable_audio_output`` False writes a text-only checkpoint (no talker, no code2wav), like the -Thinking ones.
    """

    SHARPENED_ATTENTION: ClassVar[float] = TEST_ATTENTION_SHARPNESS

    # thinker language model: an MoE decoder with q/k RMSNorm
    thinker_hidden: int = 64
    thinker_layers: int = 2
    thinker_heads: int = 2
    thinker_kv_heads: int = 1
    thinker_head_dim: int = 32
    thinker_experts: int = 4
    thinker_experts_per_tok: int = 2
    thinker_moe_intermediate: int = 32
    thinker_vocab: int = 640
    thinker_mrope_section: tuple[int, int, int] = (6, 5, 5)
    rope_theta: float = 1_000_000.0
    max_position_embeddings: int = 65_536
    position_id_per_seconds: int = released.THINKER["position_id_per_seconds"]
    seconds_per_chunk: int = released.THINKER["seconds_per_chunk"]
    # audio encoder (AuT): 128 mel bins in, windows of 2 * n_window frames
    audio_d_model: int = 32
    audio_layers: int = 2
    audio_heads: int = 1
    audio_ffn: int = 64
    audio_downsample_hidden: int = 8
    audio_n_window: int = released.AUDIO["n_window"]
    audio_n_window_infer: int = released.AUDIO["n_window_infer"]
    # vision encoder: deepstack features from layers vision_deepstack_indexes into the first thinker layers
    vision_hidden: int = 32
    vision_depth: int = 3
    vision_heads: int = 1
    vision_intermediate: int = 64
    vision_patch_size: int = released.VISION["patch_size"]
    vision_merge_size: int = released.VISION["spatial_merge_size"]
    vision_temporal_patch_size: int = released.VISION["temporal_patch_size"]
    vision_position_embeddings: int = 64
    vision_deepstack_indexes: tuple[int, ...] = (1, 2)
    # image processor (preprocessor_config.json): a picture's pixel budget, SigLIP's mean / std
    image_min_pixels: int = 4 * 32 * 32
    image_max_pixels: int = 64 * 32 * 32
    image_mean: tuple[float, float, float] = (0.5, 0.5, 0.5)
    image_std: tuple[float, float, float] = (0.5, 0.5, 0.5)
    # talker: an MoE decoder with a shared expert; talker_intermediate is also its input projections' width
    talker_hidden: int = 32
    talker_layers: int = 2
    talker_heads: int = 1
    talker_kv_heads: int = 1
    talker_head_dim: int = 32
    talker_intermediate: int = 64
    talker_moe_intermediate: int = 16
    talker_shared_expert_intermediate: int = 32
    talker_experts: int = 4
    talker_experts_per_tok: int = 2
    talker_mrope_section: tuple[int, int, int] = (6, 5, 5)
    talker_vocab: int = TINY_CODEBOOK_SIZE + 1024
    accept_hidden_layer: int = 1
    codebook_size: int = TINY_CODEBOOK_SIZE
    num_code_groups: int = released.TALKER["num_code_groups"]
    codec_pad_id: int = codec_ids_for(TINY_CODEBOOK_SIZE)["codec_pad_id"]
    codec_bos_id: int = codec_ids_for(TINY_CODEBOOK_SIZE)["codec_bos_id"]
    codec_eos_id: int = codec_ids_for(TINY_CODEBOOK_SIZE)["codec_eos_id"]
    codec_nothink_id: int = codec_ids_for(TINY_CODEBOOK_SIZE)["codec_nothink_id"]
    codec_think_bos_id: int = codec_ids_for(TINY_CODEBOOK_SIZE)["codec_think_bos_id"]
    codec_think_eos_id: int = codec_ids_for(TINY_CODEBOOK_SIZE)["codec_think_eos_id"]
    speaker_ids: tuple[tuple[str, int], ...] = codec_ids_for(TINY_CODEBOOK_SIZE)["speaker_ids"]
    # code predictor: fills codebooks 1..num_code_groups-1 of each frame; its hidden size is the talker's
    predictor_layers: int = 1
    predictor_heads: int = 1
    predictor_kv_heads: int = 1
    predictor_head_dim: int = 32
    predictor_intermediate: int = 64
    # code2wav: sliding-window transformer, then causal upsampling to 24 kHz
    code2wav_hidden: int = 32
    code2wav_layers: int = 1
    code2wav_heads: int = 1
    code2wav_kv_heads: int = 1
    code2wav_intermediate: int = 64
    code2wav_sliding_window: int = released.CODE2WAV["sliding_window"]
    code2wav_decoder_dim: int = 32
    code2wav_upsample_rates: tuple[int, ...] = tuple(released.CODE2WAV["upsample_rates"])
    code2wav_upsampling_ratios: tuple[int, ...] = tuple(released.CODE2WAV["upsampling_ratios"])
    code2wav_max_position_embeddings: int = released.CODE2WAV["max_position_embeddings"]
    # tokenizer
    tokenizer_bpe_vocab: int = 512
    # output
    enable_audio_output: bool = True
    # randomness and the tuning for end-to-end tests
    seed: int = 0
    output_gain: float = 5.0e6
    stop_logit_scale: float = 0.1
    reply_end_logit: float | None = 0.28
    speech_end_logit: float | None = 2.0
    attention_sharpness: float = 1.0

    @classmethod
    def qwen3_omni_30b_a3b(cls, seed: int = 0) -> Qwen3OmniRandomModelSpec:
        """The released 30B-A3B architecture (about 35.26 B parameters) with the released ids
        (:mod:`~pipeline.models.qwen3_omni.released`); build it on a GPU, never in tests."""
        text, audio, vision = released.THINKER_TEXT, released.AUDIO, released.VISION
        talker, talker_text, predictor, code2wav = (
            released.TALKER,
            released.TALKER_TEXT,
            released.CODE_PREDICTOR,
            released.CODE2WAV,
        )
        return cls(
            thinker_hidden=text["hidden_size"],
            thinker_layers=text["num_hidden_layers"],
            thinker_heads=text["num_attention_heads"],
            thinker_kv_heads=text["num_key_value_heads"],
            thinker_head_dim=text["head_dim"],
            thinker_experts=text["num_experts"],
            thinker_experts_per_tok=text["num_experts_per_tok"],
            thinker_moe_intermediate=text["moe_intermediate_size"],
            thinker_vocab=text["vocab_size"],
            thinker_mrope_section=tuple(text["rope_parameters"]["mrope_section"]),
            rope_theta=float(text["rope_parameters"]["rope_theta"]),
            max_position_embeddings=text["max_position_embeddings"],
            audio_d_model=audio["d_model"],
            audio_layers=audio["encoder_layers"],
            audio_heads=audio["encoder_attention_heads"],
            audio_ffn=audio["encoder_ffn_dim"],
            audio_downsample_hidden=audio["downsample_hidden_size"],
            vision_hidden=vision["hidden_size"],
            vision_depth=vision["depth"],
            vision_heads=vision["num_heads"],
            vision_intermediate=vision["intermediate_size"],
            vision_position_embeddings=vision["num_position_embeddings"],
            vision_deepstack_indexes=tuple(vision["deepstack_visual_indexes"]),
            image_min_pixels=released.PREPROCESSOR["min_pixels"],
            image_max_pixels=released.PREPROCESSOR["max_pixels"],
            talker_hidden=talker_text["hidden_size"],
            talker_layers=talker_text["num_hidden_layers"],
            talker_heads=talker_text["num_attention_heads"],
            talker_kv_heads=talker_text["num_key_value_heads"],
            talker_head_dim=talker_text["head_dim"],
            talker_intermediate=talker_text["intermediate_size"],
            talker_moe_intermediate=talker_text["moe_intermediate_size"],
            talker_shared_expert_intermediate=talker_text["shared_expert_intermediate_size"],
            talker_experts=talker_text["num_experts"],
            talker_experts_per_tok=talker_text["num_experts_per_tok"],
            talker_mrope_section=tuple(talker_text["rope_parameters"]["mrope_section"]),
            talker_vocab=talker_text["vocab_size"],
            accept_hidden_layer=talker["accept_hidden_layer"],
            codebook_size=code2wav["codebook_size"],
            **codec_ids_for(code2wav["codebook_size"]),
            predictor_layers=predictor["num_hidden_layers"],
            predictor_heads=predictor["num_attention_heads"],
            predictor_kv_heads=predictor["num_key_value_heads"],
            predictor_head_dim=predictor["head_dim"],
            predictor_intermediate=predictor["intermediate_size"],
            code2wav_hidden=code2wav["hidden_size"],
            code2wav_layers=code2wav["num_hidden_layers"],
            code2wav_heads=code2wav["num_attention_heads"],
            code2wav_kv_heads=code2wav["num_key_value_heads"],
            code2wav_intermediate=code2wav["intermediate_size"],
            code2wav_decoder_dim=code2wav["decoder_dim"],
            # The released tokenizer's 151643 BPE entries cannot be trained on the embedded corpus: the 30B preset
            # keeps the tiny tokenizer, and its ids (all below the thinker vocabulary) stand in for the released ones.
            # A random code2wav of the released width is loud already (RMS ~0.4 before its clamp to [-1, 1]).
            output_gain=1.0,
            # GPU benchmarks force reply lengths; the random init is left alone.
            stop_logit_scale=1.0,
            reply_end_logit=None,
            speech_end_logit=None,
            seed=seed,
        )

    @property
    def speakers(self) -> dict[str, int]:
        """Speaker name (lower case, as the config's ``speaker_id``) -> codec id."""
        return dict(self.speaker_ids)


__all__ = ["Qwen3OmniRandomModelSpec", "TEST_ATTENTION_SHARPNESS", "codec_ids_for"]
