"""Loading a Qwen2.5-Omni checkpoint in the Hugging Face layout, with named special tokens and speakers.

A checkpoint folder holds ``config.json`` (thinker / talker / token2wav sub-configs),
``model.safetensors`` or ``model-0000X-of-0000N.safetensors`` + ``model.safetensors.index.json``,
``spk_dict.pt`` (the voices), tokenizer files and ``preprocessor_config.json`` (the Whisper feature
extractor's settings and, for a checkpoint that takes pictures, the image processor's beside them).
Random-weight test checkpoints made by :mod:`.tiny` also carry :data:`RANDOM_MARKER_FILE`.

Every special id the engine needs is read from the checkpoint config and cross-checked against the
tokenizer here, once; the rest of the engine takes them from :class:`Qwen25OmniSpecialTokens` and never
writes an id literally.

Units: user audio is 16 kHz mono; the feature extractor's hop is 10 ms (one mel frame); the audio
encoder emits one token per 4 mel frames (25 tokens/s).
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import torch

from pipeline.errors import CheckpointError, ConfigError
from pipeline.models.common.hf_checkpoint import (
    CONFIG_FILE,
    PREPROCESSOR_FILE,
    RANDOM_MARKER_FILE,
    SINGLE_WEIGHTS_FILE,
    TOKENIZER_FILES,
    WEIGHTS_INDEX_FILE,
    check_distinct,
    check_in_vocab,
    check_weights_present,
    config_id,
    is_random_checkpoint,
    load_tokenizer,
    required_file,
    resolve_checkpoint_path,
    tokenizer_ids,
)
from pipeline.models.common.hf_loading import (
    Placement,
    load_feature_extractor,
    load_hf_config,
    load_parts,
    read_preprocessor_config,
    stage_placement,
)
from pipeline.models.qwen2_5_omni.hf_logging import quiet_talker_token_id_warnings
from pipeline.models.qwen2_5_omni.vision import Qwen25OmniVisionPreprocessor

logger = logging.getLogger(__name__)

# --- Token strings of the Qwen2.5-Omni tokenizer. Ids always come from the checkpoint. ---------
ENDOFTEXT = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
AUDIO_PLACEHOLDER = "<|AUDIO|>"
AUDIO_BOS = "<|audio_bos|>"
AUDIO_EOS = "<|audio_eos|>"
IMAGE_PLACEHOLDER = "<|IMAGE|>"
VIDEO_PLACEHOLDER = "<|VIDEO|>"
VISION_BOS = "<|vision_bos|>"
VISION_EOS = "<|vision_eos|>"

TOKENIZER_NAMED_FIELDS: Mapping[str, str] = {
    "endoftext": ENDOFTEXT,
    "im_start": IM_START,
    "im_end": IM_END,
    "audio_token": AUDIO_PLACEHOLDER,
    "audio_start": AUDIO_BOS,
    "audio_end": AUDIO_EOS,
    "image_token": IMAGE_PLACEHOLDER,
    "video_token": VIDEO_PLACEHOLDER,
    "vision_start": VISION_BOS,
    "vision_end": VISION_EOS,
}
""":class:`Qwen25OmniSpecialTokens` field -> the tokenizer token that must carry the same id."""

SPEAKERS_FILE = "spk_dict.pt"

SUBMODELS = ("thinker", "talker", "token2wav")
TOKEN2WAV_DTYPE = torch.float32
"""The DiT's ODE and the vocoder are only numerically sound in float32 (the reference does the same)."""

BIGVGAN_HOP_SAMPLES = 240
"""24 kHz output samples per mel frame: the BigVGAN upsample rates must multiply to this."""


# --- Special tokens ---------------------------------------------------------------------------
@dataclass(frozen=True)
class Qwen25OmniSpecialTokens:
    """Every special id the engine needs.

    Thinker-vocabulary ids: ``im_start .. vision_end`` (chat and modality markers; ``audio_token``
    is the ``<|AUDIO|>`` placeholder repeated once per audio-encoder output) and
    ``tts_text_start/end/pad`` (ids the talker embeds through the thinker's embedding table).
    Talker (codec) vocabulary ids: ``codec_bos/eos/pad/mask``.
    """

    im_start: int
    im_end: int
    endoftext: int
    audio_token: int
    audio_start: int
    audio_end: int
    image_token: int
    video_token: int
    vision_start: int
    vision_end: int
    tts_text_start: int
    tts_text_end: int
    tts_text_pad: int
    codec_bos: int
    codec_eos: int
    codec_pad: int
    codec_mask: int

    def codec_stop_ids(self) -> tuple[int, ...]:
        """Codec ids that end an utterance (eos, then pad), as the reference's ``talker_eos_token_id``."""
        return (self.codec_eos, self.codec_pad)

    def thinker_ids(self) -> dict[str, int]:
        return {f.name: getattr(self, f.name) for f in fields(self) if not f.name.startswith("codec_")}

    def codec_ids(self) -> dict[str, int]:
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name.startswith("codec_")}

    @classmethod
    def from_config(cls, config: Any, tokenizer: Any) -> Qwen25OmniSpecialTokens:
        """Read the ids from a ``Qwen2_5OmniConfig``; ``im_start/im_end/endoftext`` (absent from
        the Omni config) come from the tokenizer by name. Raises :class:`CheckpointError` when an id
        is missing, out of its vocabulary, or disagrees with the tokenizer."""
        thinker, talker = config.thinker_config, config.talker_config
        by_name = tokenizer_ids(tokenizer, TOKENIZER_NAMED_FIELDS.values())
        special = cls(
            im_start=by_name[IM_START],
            im_end=by_name[IM_END],
            endoftext=by_name[ENDOFTEXT],
            audio_token=config_id(thinker, "thinker_config", "audio_token_index"),
            audio_start=config_id(thinker, "thinker_config", "audio_start_token_id"),
            audio_end=config_id(thinker, "thinker_config", "audio_end_token_id"),
            image_token=config_id(thinker, "thinker_config", "image_token_index"),
            video_token=config_id(thinker, "thinker_config", "video_token_index"),
            # The thinker config of the released checkpoints may lack the vision ids; the talker's has them.
            vision_start=_config_id_with_fallback(thinker, talker, "vision_start_token_id"),
            vision_end=_config_id_with_fallback(thinker, talker, "vision_end_token_id"),
            tts_text_start=config_id(talker, "talker_config", "tts_text_start_token_id"),
            tts_text_end=config_id(talker, "talker_config", "tts_text_end_token_id"),
            tts_text_pad=config_id(talker, "talker_config", "tts_text_pad_token_id"),
            codec_bos=config_id(talker, "talker_config", "tts_codec_start_token_id"),
            codec_eos=config_id(talker, "talker_config", "tts_codec_end_token_id"),
            codec_pad=config_id(talker, "talker_config", "tts_codec_pad_token_id"),
            codec_mask=config_id(talker, "talker_config", "tts_codec_mask_token_id"),
        )
        special.check(config, by_name)
        return special

    def check(self, config: Any, tokenizer_ids: Mapping[str, int]) -> None:
        """Ranges, distinctness, and agreement of the config's marker ids with the tokenizer."""
        thinker_vocab = config.thinker_config.text_config.vocab_size
        talker_vocab = config.talker_config.vocab_size
        for name, value in self.thinker_ids().items():
            check_in_vocab(value, thinker_vocab, f"thinker id {name}")
        for name, value in self.codec_ids().items():
            check_in_vocab(value, talker_vocab, f"talker codec id {name}")
        check_distinct(self.thinker_ids(), "thinker special ids")
        check_distinct(self.codec_ids(), "codec special ids")
        for name, token in TOKENIZER_NAMED_FIELDS.items():
            if tokenizer_ids[token] != getattr(self, name):
                raise CheckpointError(
                    f"{CONFIG_FILE}: {name} id {getattr(self, name)} differs from the tokenizer's id "
                    f"{tokenizer_ids[token]} for {token}",
                    param=name,
                )
        tts_text = {self.tts_text_start, self.tts_text_end, self.tts_text_pad}
        markers = {self.audio_token, self.audio_start, self.audio_end, self.image_token, self.video_token}
        if tts_text & markers:
            raise CheckpointError(f"{CONFIG_FILE}: talker tts_text_* ids collide with modality marker ids")


def _config_id_with_fallback(thinker: Any, talker: Any, attr: str) -> int:
    if isinstance(getattr(thinker, attr, None), int):
        return config_id(thinker, "thinker_config", attr)
    return config_id(talker, "talker_config", attr)


# --- Config consistency ---------------------------------------------------------------------
def validate_config(config: Any) -> None:
    """Check the cross-sub-model consistency rules a Qwen2.5-Omni config must satisfy (they hold
    for the released checkpoints and for our random ones). Raises :class:`CheckpointError` naming
    the offending field."""
    if not getattr(config, "enable_audio_output", False):
        raise CheckpointError(
            f"{CONFIG_FILE}: enable_audio_output is false; a talker is required", param="enable_audio_output"
        )
    thinker, talker = config.thinker_config, config.talker_config
    text, audio, vision = thinker.text_config, thinker.audio_config, thinker.vision_config
    dit, bigvgan = config.token2wav_config.dit_config, config.token2wav_config.bigvgan_config
    _require_equal(
        "thinker hidden size",
        {
            "thinker_config.text_config.hidden_size": text.hidden_size,
            "thinker_config.audio_config.output_dim": audio.output_dim,
            "thinker_config.vision_config.out_hidden_size": vision.out_hidden_size,
            "talker_config.embedding_size": talker.embedding_size,
        },
    )
    _check_mrope(text, "thinker_config.text_config")
    _check_mrope(talker, "talker_config")
    _require_equal("mel dimension", {"dit_config.mel_dim": dit.mel_dim, "bigvgan_config.mel_dim": bigvgan.mel_dim})
    if math.prod(bigvgan.upsample_rates) != BIGVGAN_HOP_SAMPLES:
        raise CheckpointError(
            f"{CONFIG_FILE}: bigvgan_config.upsample_rates {list(bigvgan.upsample_rates)} multiply to "
            f"{math.prod(bigvgan.upsample_rates)}, expected {BIGVGAN_HOP_SAMPLES} samples per mel frame",
            param="token2wav_config.bigvgan_config.upsample_rates",
        )
    if len(bigvgan.upsample_rates) != len(bigvgan.upsample_kernel_sizes):
        raise CheckpointError(f"{CONFIG_FILE}: bigvgan upsample_rates and upsample_kernel_sizes differ in length")
    if bigvgan.upsample_initial_channel % (2 ** len(bigvgan.upsample_rates)) != 0:
        raise CheckpointError(
            f"{CONFIG_FILE}: bigvgan_config.upsample_initial_channel {bigvgan.upsample_initial_channel} must be a "
            f"multiple of 2**{len(bigvgan.upsample_rates)} (each upsampling stage halves the channels)",
            param="token2wav_config.bigvgan_config.upsample_initial_channel",
        )
    dilations = [list(d) for d in bigvgan.resblock_dilation_sizes]
    if len(dilations) != len(bigvgan.resblock_kernel_sizes) or any(len(d) != 3 for d in dilations):
        raise CheckpointError(
            f"{CONFIG_FILE}: bigvgan_config.resblock_dilation_sizes {dilations} needs one triple per resblock kernel "
            f"{list(bigvgan.resblock_kernel_sizes)}",
            param="token2wav_config.bigvgan_config.resblock_dilation_sizes",
        )
    channels = list(dit.enc_channels)
    if not len(channels) == len(dit.enc_kernel_sizes) == len(dit.enc_dilations) or len(channels) < 3:
        raise CheckpointError(
            f"{CONFIG_FILE}: dit_config.enc_channels, enc_kernel_sizes and enc_dilations need the same length (>= 3)",
            param="token2wav_config.dit_config.enc_channels",
        )
    if channels[-1] != sum(channels[1:-1]):
        raise CheckpointError(
            f"{CONFIG_FILE}: dit_config.enc_channels[-1] = {channels[-1]} must equal the sum of the SE-Res2Net "
            f"block widths {channels[1:-1]} (the speaker encoder concatenates them)",
            param="token2wav_config.dit_config.enc_channels",
        )


def _require_equal(what: str, values: Mapping[str, int]) -> None:
    """All ``values`` must equal the first one; the error names the first field that differs."""
    reference = next(iter(values.values()))
    offending = [name for name, value in values.items() if value != reference]
    if offending:
        listing = ", ".join(f"{k}={v}" for k, v in values.items())
        raise CheckpointError(f"{CONFIG_FILE}: {what} must agree: {listing}", param=offending[0])


def _check_mrope(sub_config: Any, where: str) -> None:
    rope = getattr(sub_config, "rope_parameters", None) or {}
    section = rope.get("mrope_section")
    head_dim = getattr(sub_config, "head_dim", None) or sub_config.hidden_size // sub_config.num_attention_heads
    if section is None or sum(section) * 2 != head_dim:
        raise CheckpointError(
            f"{CONFIG_FILE}: {where} mrope_section {section} must sum to head_dim/2 = {head_dim // 2}",
            param=f"{where}.rope_parameters.mrope_section",
        )


# --- Speakers -------------------------------------------------------------------------------
@dataclass(frozen=True)
class Speaker:
    """One voice of ``spk_dict.pt``. ``bos_token`` is a thinker-vocabulary id that opens the
    talker's text stream; ``cond`` (1, enc_emb_dim) conditions the DiT; ``ref_mel``
    (1, frames, mel_dim) feeds the DiT's speaker encoder. Tensors are float32 on CPU."""

    name: str
    bos_token: int
    cond: torch.Tensor
    ref_mel: torch.Tensor


def speakers_from_dict(raw: Any, config: Any, *, source: str = SPEAKERS_FILE) -> dict[str, Speaker]:
    """Validate the ``spk_dict.pt`` payload against ``config`` and wrap it in :class:`Speaker`."""
    if not isinstance(raw, Mapping) or not raw:
        raise CheckpointError(f"{source}: expected a non-empty dict of speakers")
    dit = config.token2wav_config.dit_config
    thinker_vocab = config.thinker_config.text_config.vocab_size
    speakers: dict[str, Speaker] = {}
    for name, entry in raw.items():
        if not isinstance(entry, Mapping) or not {"bos_token", "cond", "ref_mel"} <= set(entry):
            raise CheckpointError(f"{source}: speaker {name!r} needs bos_token, cond and ref_mel", param=str(name))
        bos = int(entry["bos_token"])
        cond = torch.as_tensor(entry["cond"]).float().reshape(1, -1)
        ref_mel = torch.as_tensor(entry["ref_mel"]).float()
        if cond.shape[1] != dit.enc_emb_dim:
            raise CheckpointError(
                f"{source}: speaker {name!r} cond width {cond.shape[1]} != dit_config.enc_emb_dim {dit.enc_emb_dim}",
                param=str(name),
            )
        if ref_mel.ndim != 3 or ref_mel.shape[0] != 1 or ref_mel.shape[2] != dit.mel_dim:
            raise CheckpointError(
                f"{source}: speaker {name!r} ref_mel shape {tuple(ref_mel.shape)} != (1, frames, {dit.mel_dim})",
                param=str(name),
            )
        check_in_vocab(bos, thinker_vocab, f"{source} speaker {name!r} bos_token")
        speakers[str(name)] = Speaker(name=str(name), bos_token=bos, cond=cond, ref_mel=ref_mel)
    bos_ids = [s.bos_token for s in speakers.values()]
    if len(set(bos_ids)) != len(bos_ids):
        raise CheckpointError(f"{source}: speakers must have distinct bos_token ids, got {bos_ids}")
    return speakers


def load_speakers(path: Path, config: Any) -> dict[str, Speaker]:
    try:
        raw = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # torch raises several unrelated types for a corrupt pickle
        raise CheckpointError(f"{path.name}: cannot be read: {exc}") from exc
    return speakers_from_dict(raw, config, source=path.name)


# --- Audio token count ------------------------------------------------------------------------
def mel_frames_for_samples(n_samples: int, *, hop_length: int, max_samples: int | None) -> int:
    """Mel frames the reference processor counts for ``n_samples`` (it pads to the feature
    extractor's window, so a partial last hop counts as a frame; audio beyond ``max_samples``, the
    extractor's 30 s window, is truncated)."""
    if n_samples < 0:
        raise ValueError(f"n_samples must be >= 0, got {n_samples}")
    if max_samples is not None:
        n_samples = min(n_samples, max_samples)
    return -(-n_samples // hop_length)


def audio_tokens_for_mel_frames(n_frames: int) -> int:
    """Audio-encoder outputs for ``n_frames`` mel frames: a stride-2 conv then stride-2 pooling.
    (The encoder's 2 s blocks hold an even number of frames, so blocking does not change the count.)"""
    if n_frames < 0:
        raise ValueError(f"n_frames must be >= 0, got {n_frames}")
    after_conv = (n_frames - 1) // 2 + 1
    return (after_conv - 2) // 2 + 1


# --- The loaded checkpoint --------------------------------------------------------------------
@dataclass
class Qwen25OmniLoadedCheckpoint:
    """A checkpoint ready for inference (sub-models in eval mode on their devices).

    ``source`` is what the caller asked for (path or hub id), ``path`` the resolved folder (a temp
    folder holding only tokenizer files for :func:`.tiny.build_random_model`). ``thinker`` /
    ``talker`` / ``token2wav`` are the transformers sub-modules; ``token2wav`` is always float32.
    """

    source: str
    path: Path
    config: Any
    thinker: torch.nn.Module
    talker: torch.nn.Module
    token2wav: torch.nn.Module
    tokenizer: Any
    feature_extractor: Any
    speakers: dict[str, Speaker]
    special: Qwen25OmniSpecialTokens
    random_weights: bool
    vision: Qwen25OmniVisionPreprocessor | None = None
    """The image processor settings (None: the checkpoint takes no pictures)."""

    @property
    def thinker_hidden_size(self) -> int:
        return int(self.config.thinker_config.text_config.hidden_size)

    def audio_tokens_for_samples(self, n_samples_16k: int) -> int:
        """Number of ``<|AUDIO|>`` positions (audio-encoder outputs) for ``n_samples_16k`` samples of
        16 kHz audio passed through the Whisper feature extractor, as the reference processor counts."""
        fe = self.feature_extractor
        frames = mel_frames_for_samples(n_samples_16k, hop_length=fe.hop_length, max_samples=fe.n_samples)
        return audio_tokens_for_mel_frames(frames)

    @property
    def default_speaker(self) -> str:
        """``Chelsie`` when present (the reference default), else the first voice."""
        return "Chelsie" if "Chelsie" in self.speakers else next(iter(self.speakers))


# --- Loading ----------------------------------------------------------------------------------
def load_checkpoint(
    name_or_path: str | os.PathLike[str],
    *,
    devices: dict[str, str] | None = None,
    dtypes: dict[str, torch.dtype] | None = None,
) -> Qwen25OmniLoadedCheckpoint:
    """Load a checkpoint folder, or a hub id already in the local Hugging Face cache (never downloads).

    ``devices`` / ``dtypes`` are keyed by ``"thinker"``, ``"talker"``, ``"token2wav"``; missing
    keys default to ``"cpu"`` and to bfloat16 on CUDA / float32 elsewhere; token2wav is always
    float32. Raises :class:`CheckpointError` naming the file or field when something is missing or
    inconsistent, :class:`ConfigError` for bad ``devices``/``dtypes`` arguments.
    """
    placement = _placement(devices, dtypes)
    path = resolve_checkpoint_path(name_or_path)
    config = _load_config(path)
    check_weights_present(path)
    tokenizer = load_tokenizer(path)
    special = Qwen25OmniSpecialTokens.from_config(config, tokenizer)
    speakers = load_speakers(required_file(path, SPEAKERS_FILE), config)
    feature_extractor = load_feature_extractor(path, config)
    vision = load_vision_preprocessor(path, config)
    thinker, talker, token2wav = _load_submodels(path, placement)
    return Qwen25OmniLoadedCheckpoint(
        source=str(name_or_path),
        path=path,
        config=config,
        thinker=thinker,
        talker=talker,
        token2wav=token2wav,
        tokenizer=tokenizer,
        feature_extractor=feature_extractor,
        speakers=speakers,
        special=special,
        random_weights=is_random_checkpoint(path),
        vision=vision,
    )


def _placement(devices: dict[str, str] | None, dtypes: dict[str, torch.dtype] | None) -> dict[str, Placement]:
    placement = stage_placement(devices, dtypes, {part: part for part in SUBMODELS}, float32_parts=("token2wav",))
    if placement["token2wav"].dtype != TOKEN2WAV_DTYPE:
        raise ConfigError("dtypes.token2wav: token2wav always runs in float32", param="dtypes.token2wav")
    return placement


def _load_config(path: Path) -> Any:
    from transformers import Qwen2_5OmniConfig

    quiet_talker_token_id_warnings()
    config = load_hf_config(path, Qwen2_5OmniConfig, "qwen2_5_omni")
    validate_config(config)
    return config


def load_vision_preprocessor(path: Path, config: Any) -> Qwen25OmniVisionPreprocessor | None:
    """The image processor settings of ``preprocessor_config.json`` (None when it has none), checked against the
    vision tower's config."""
    raw = read_preprocessor_config(path)
    return Qwen25OmniVisionPreprocessor.from_preprocessor_config(raw, config.thinker_config.vision_config)


def _load_submodels(path: Path, placement: dict[str, Placement]) -> tuple[Any, Any, Any]:
    """The three parts, loaded once and placed (:func:`~pipeline.models.common.hf_loading.load_parts`)."""
    from transformers import Qwen2_5OmniForConditionalGeneration

    # The class's own from_pretrained only adds speaker loading (done by us, with checks) and cannot
    # return the loading info; the generic PreTrainedModel one can, so call that for this class.
    model_class = Qwen2_5OmniForConditionalGeneration
    thinker, talker, token2wav = load_parts(super(model_class, model_class).from_pretrained, path, placement)
    return thinker, talker, token2wav


__all__ = [
    "CONFIG_FILE",
    "PREPROCESSOR_FILE",
    "RANDOM_MARKER_FILE",
    "SINGLE_WEIGHTS_FILE",
    "SPEAKERS_FILE",
    "TOKENIZER_FILES",
    "WEIGHTS_INDEX_FILE",
    "Qwen25OmniLoadedCheckpoint",
    "Qwen25OmniSpecialTokens",
    "Speaker",
    "is_random_checkpoint",
    "load_checkpoint",
    "load_tokenizer",
    "resolve_checkpoint_path",
]
