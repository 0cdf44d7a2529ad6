"""Loading a Qwen3-Omni checkpoint in the Hugging Face layout (``model_type`` ``qwen3_omni_moe``), with named special
tokens and speakers.

A checkpoint folder holds ``config.json`` (thinker / talker / code2wav sub-configs), the weights
(``model.safetensors`` or shards + ``model.safetensors.index.json``), tokenizer files and
``preprocessor_config.json`` (the Whisper feature extractor's settings and the image processor's). The voices are
codec ids in the talker config (``speaker_id``: name -> id), not a separate file. A checkpoint with
``enable_audio_output: false`` (the -Thinking checkpoints, or an Instruct one saved without its talker) has no talker
and no code2wav: it answers in text only.

Every special id the engine needs is read from the config and cross-checked against the tokenizer here, once.
Units: user audio is 16 kHz mono, one mel frame per 10 ms; the codec makes 12.5 frames per second of 24 kHz audio,
16 codes a frame.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from pipeline.errors import CheckpointError
from pipeline.models.common.hf_checkpoint import (
    CONFIG_FILE,
    check_distinct,
    check_in_vocab,
    check_weights_present,
    config_id,
    is_random_checkpoint,
    load_tokenizer,
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
from pipeline.models.qwen3_omni.experts import use_capturable_experts
from pipeline.models.qwen3_omni.hf_logging import quiet_rope_key_warnings
from pipeline.models.qwen3_omni.vision import Qwen3OmniVisionPreprocessor

if TYPE_CHECKING:
    from transformers.models.qwen3_omni_moe.modeling_qwen3_omni_moe import (
        Qwen3OmniMoeCode2Wav,
        Qwen3OmniMoeTalkerForConditionalGeneration,
        Qwen3OmniMoeThinkerForConditionalGeneration,
    )

logger = logging.getLogger(__name__)

MODEL_TYPE = "qwen3_omni_moe"

# --- Token strings of the Qwen3-Omni tokenizer that the config does not carry. Ids come from the tokenizer. -----
ENDOFTEXT = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
AUDIO_END = "<|audio_end|>"
VISION_END = "<|vision_end|>"

TOKENIZER_NAMED_FIELDS: Mapping[str, str] = {
    "endoftext": ENDOFTEXT,
    "im_start": IM_START,
    "im_end": IM_END,
    "audio_end": AUDIO_END,
    "vision_end": VISION_END,
}
""":class:`Qwen3OmniSpecialTokens` field -> the tokenizer token that carries its id."""

SUBMODELS = ("thinker", "talker", "code2wav")
"""The parts a checkpoint with audio output loads, by stage (code2wav is the ``token2wav`` stage)."""
STAGE_OF_PART = {"thinker": "thinker", "talker": "talker", "code2wav": "token2wav"}


@dataclass(frozen=True)
class Qwen3OmniSpecialTokens:
    """Every special id the engine needs.

    Thinker-vocabulary ids: chat and modality markers (``audio_token`` is the audio placeholder repeated once per
    audio-encoder output; ``image_token`` / ``video_token`` likewise for the vision encoder), the role ids of the chat
    headers, and ``tts_bos`` / ``tts_eos`` / ``tts_pad`` (ids the talker reads through the thinker's embedding table).
    Talker (codec) vocabulary ids: ``codec_*``. ``None`` codec ids: the checkpoint has no talker.
    """

    im_start: int
    im_end: int
    endoftext: int
    system_role: int
    user_role: int
    assistant_role: int
    audio_token: int
    audio_start: int
    audio_end: int
    image_token: int
    video_token: int
    vision_start: int
    vision_end: int
    tts_bos: int
    tts_eos: int
    tts_pad: int
    codec_bos: int | None = None
    codec_eos: int | None = None
    codec_pad: int | None = None
    codec_nothink: int | None = None
    codec_think_bos: int | None = None
    codec_think_eos: int | None = None

    def thinker_ids(self) -> dict[str, int]:
        """The thinker-vocabulary ids by name (the role ids are ordinary text tokens, so not among them)."""
        roles = {"system_role", "user_role", "assistant_role"}
        return {
            f.name: getattr(self, f.name)
            for f in fields(self)
            if not f.name.startswith("codec_") and f.name not in roles
        }

    def codec_ids(self) -> dict[str, int]:
        return {
            f.name: getattr(self, f.name)
            for f in fields(self)
            if f.name.startswith("codec_") and getattr(self, f.name) is not None
        }

    def codec_stop_ids(self) -> tuple[int, ...]:
        """Codec ids that end an utterance (the reference's ``eos_token_id`` for the talker)."""
        return () if self.codec_eos is None else (self.codec_eos,)

    @classmethod
    def from_config(cls, config: Any, tokenizer: Any) -> Qwen3OmniSpecialTokens:
        """Read the ids from a ``Qwen3OmniMoeConfig`` (chat markers absent from it from the tokenizer by name). Raises
        :class:`CheckpointError` when an id is missing, outside its vocabulary, or disagrees with the tokenizer."""
        thinker = config.thinker_config
        by_name = tokenizer_ids(tokenizer, TOKENIZER_NAMED_FIELDS.values())
        codec: dict[str, int] = {}
        if config.enable_audio_output:
            talker = config.talker_config
            for name, attr in (
                ("codec_bos", "codec_bos_id"),
                ("codec_eos", "codec_eos_token_id"),
                ("codec_pad", "codec_pad_id"),
                ("codec_nothink", "codec_nothink_id"),
                ("codec_think_bos", "codec_think_bos_id"),
                ("codec_think_eos", "codec_think_eos_id"),
            ):
                codec[name] = config_id(talker, "talker_config", attr)
        vision_start = getattr(thinker, "vision_start_token_id", None)
        if not isinstance(vision_start, int) and config.enable_audio_output:
            vision_start = config.talker_config.vision_start_token_id
        special = cls(
            im_start=config_id(config, "config", "im_start_token_id"),
            im_end=config_id(config, "config", "im_end_token_id"),
            endoftext=by_name[ENDOFTEXT],
            system_role=config_id(config, "config", "system_token_id"),
            user_role=config_id(config, "config", "user_token_id"),
            assistant_role=config_id(config, "config", "assistant_token_id"),
            audio_token=config_id(thinker, "thinker_config", "audio_token_id"),
            audio_start=config_id(thinker, "thinker_config", "audio_start_token_id"),
            audio_end=by_name[AUDIO_END],
            image_token=config_id(thinker, "thinker_config", "image_token_id"),
            video_token=config_id(thinker, "thinker_config", "video_token_id"),
            vision_start=vision_start if isinstance(vision_start, int) else -1,
            vision_end=by_name[VISION_END],
            tts_bos=config_id(config, "config", "tts_bos_token_id"),
            tts_eos=config_id(config, "config", "tts_eos_token_id"),
            tts_pad=config_id(config, "config", "tts_pad_token_id"),
            **codec,
        )
        special.check(config, by_name, tokenizer)
        return special

    def check(self, config: Any, by_name: Mapping[str, int], tokenizer: Any) -> None:
        """Ranges, distinctness, and agreement of the config's marker ids with the tokenizer."""
        if self.vision_start < 0:
            raise CheckpointError(f"{CONFIG_FILE}: vision_start_token_id is missing", param="vision_start_token_id")
        thinker_vocab = config.thinker_config.text_config.vocab_size
        for name, value in self.thinker_ids().items():
            check_in_vocab(value, thinker_vocab, f"thinker id {name}")
        check_distinct(self.thinker_ids(), "thinker special ids")
        if config.enable_audio_output:
            talker_vocab = config.talker_config.text_config.vocab_size
            for name, value in self.codec_ids().items():
                check_in_vocab(value, talker_vocab, f"talker codec id {name}")
            check_distinct(self.codec_ids(), "codec special ids")
        for name, token in TOKENIZER_NAMED_FIELDS.items():
            if by_name[token] != getattr(self, name):
                raise CheckpointError(f"tokenizer: {token} has id {by_name[token]}, the config {getattr(self, name)}")
        im_start = tokenizer.convert_tokens_to_ids(IM_START)
        if im_start != self.im_start:
            raise CheckpointError(
                f"{CONFIG_FILE}: im_start_token_id {self.im_start} differs from the tokenizer's id {im_start} for "
                f"{IM_START}",
                param="im_start_token_id",
            )
        for name, role in (("system_role", "system"), ("user_role", "user"), ("assistant_role", "assistant")):
            ids = tokenizer.encode(role, add_special_tokens=False)
            if list(ids) != [getattr(self, name)]:
                raise CheckpointError(
                    f"{CONFIG_FILE}: {name} id {getattr(self, name)} is not the tokenizer's single token for "
                    f"{role!r} ({list(ids)})",
                    param=name,
                )


def speakers_from_config(config: Any) -> dict[str, int]:
    """Voice name (capitalised, as the model card writes it: ``Chelsie``) -> codec id, from the talker config's
    ``speaker_id``; CheckpointError when it is missing, empty, or an id is outside the talker's vocabulary."""
    talker = config.talker_config
    raw = getattr(talker, "speaker_id", None)
    if not isinstance(raw, Mapping) or not raw:
        raise CheckpointError(f"{CONFIG_FILE}: talker_config.speaker_id names no voice", param="speaker_id")
    vocab = talker.text_config.vocab_size
    voices: dict[str, int] = {}
    for name, codec_id in raw.items():
        if not isinstance(name, str) or not isinstance(codec_id, int) or not 0 <= codec_id < vocab:
            raise CheckpointError(
                f"{CONFIG_FILE}: talker_config.speaker_id[{name!r}] = {codec_id!r} is not a codec id below {vocab}",
                param="speaker_id",
            )
        voices[name.capitalize()] = codec_id
    return voices


def validate_config(config: Any) -> None:
    """The cross-part sizes a Qwen3-Omni config must keep consistent (they hold for the released checkpoint)."""
    thinker = config.thinker_config
    hidden = thinker.text_config.hidden_size
    checks = {"thinker_config.audio_config.output_dim": thinker.audio_config.output_dim}
    if getattr(thinker, "vision_config", None) is not None:
        checks["thinker_config.vision_config.out_hidden_size"] = thinker.vision_config.out_hidden_size
    if config.enable_audio_output:
        talker = config.talker_config
        checks["talker_config.thinker_hidden_size"] = talker.thinker_hidden_size
        layers = thinker.text_config.num_hidden_layers
        if not 0 <= talker.accept_hidden_layer <= layers:
            raise CheckpointError(
                f"{CONFIG_FILE}: talker_config.accept_hidden_layer {talker.accept_hidden_layer} is not a hidden state "
                f"of the thinker's {layers} layers",
                param="accept_hidden_layer",
            )
        groups = {
            "talker_config.num_code_groups": talker.num_code_groups,
            "talker_config.code_predictor_config.num_code_groups": talker.code_predictor_config.num_code_groups,
            "code2wav_config.num_quantizers": config.code2wav_config.num_quantizers,
        }
        if len(set(groups.values())) != 1:
            raise CheckpointError(f"{CONFIG_FILE}: code groups disagree: {groups}", param="num_code_groups")
    for name, value in checks.items():
        if value != hidden:
            raise CheckpointError(
                f"{CONFIG_FILE}: {name} = {value}, expected the thinker's hidden size {hidden}", param=name
            )


# --- The loaded checkpoint --------------------------------------------------------------------
@dataclass
class Qwen3OmniLoadedCheckpoint:
    """A Qwen3-Omni checkpoint ready for inference (parts in eval mode on their devices).

    ``thinker`` is the transformers thinker (text model, audio and vision encoders, lm head); ``talker`` (with its code
    predictor) and ``code2wav`` are None for a text-only checkpoint. ``voices``: voice name -> codec id.
    """

    source: str
    path: Path
    config: Any
    thinker: Qwen3OmniMoeThinkerForConditionalGeneration
    talker: Qwen3OmniMoeTalkerForConditionalGeneration | None
    code2wav: Qwen3OmniMoeCode2Wav | None
    tokenizer: Any
    feature_extractor: Any
    special: Qwen3OmniSpecialTokens
    voices: dict[str, int]
    random_weights: bool
    vision: Qwen3OmniVisionPreprocessor | None = None
    """The image processor settings (None: ``preprocessor_config.json`` has none; the checkpoint takes no pictures)."""

    @property
    def audio_output(self) -> bool:
        """Whether the checkpoint can speak (has a talker and code2wav)."""
        return self.talker is not None

    @property
    def default_voice(self) -> str:
        """``Ethan`` when present (the reference's default speaker), else the first voice."""
        return "Ethan" if "Ethan" in self.voices else next(iter(self.voices))


def load_checkpoint(
    name_or_path: str | os.PathLike[str],
    *,
    devices: dict[str, str] | None = None,
    dtypes: dict[str, torch.dtype] | None = None,
) -> Qwen3OmniLoadedCheckpoint:
    """Load a checkpoint folder, or a hub id already in the local Hugging Face cache (never downloads).

    ``devices`` / ``dtypes`` are keyed by stage (``"thinker"``, ``"talker"``, ``"token2wav"``: code2wav); missing keys
    default to ``"cpu"`` and to bfloat16 on CUDA / float32 elsewhere (code2wav: float32). Raises
    :class:`CheckpointError` naming the file or field when something is missing or inconsistent, :class:`ConfigError`
    for bad ``devices``/``dtypes`` arguments.
    """
    placement = _placement(devices, dtypes)
    path = resolve_checkpoint_path(name_or_path)
    config = load_config(path)
    check_weights_present(path)
    tokenizer = load_tokenizer(path)
    feature_extractor = load_feature_extractor(path, config)
    vision = load_vision_preprocessor(path, config)
    thinker, talker, code2wav = _load_parts(path, config, placement)
    return assemble(
        str(name_or_path),
        path,
        config,
        (thinker, talker, code2wav),
        tokenizer,
        feature_extractor,
        is_random_checkpoint(path),
        vision=vision,
    )


def assemble(
    source: str,
    path: Path,
    config: Any,
    parts: tuple[Any, Any, Any],
    tokenizer: Any,
    feature_extractor: Any,
    random_weights: bool,
    *,
    vision: Qwen3OmniVisionPreprocessor | None = None,
) -> Qwen3OmniLoadedCheckpoint:
    """A :class:`Qwen3OmniLoadedCheckpoint` of loaded (or built) parts ``(thinker, talker, code2wav)``, placed on
    their devices: the config validated, the special ids read and cross-checked with the tokenizer, the voices read,
    the thinker's and talker's experts implementation chosen for their placement
    (:mod:`~pipeline.models.qwen3_omni.experts`: one a CUDA graph captures); ``vision``: the image processor settings
    (:func:`load_vision_preprocessor`)."""
    validate_config(config)
    special = Qwen3OmniSpecialTokens.from_config(config, tokenizer)
    voices = speakers_from_config(config) if config.enable_audio_output else {}
    thinker, talker, code2wav = parts
    use_capturable_experts(thinker)
    use_capturable_experts(talker)
    return Qwen3OmniLoadedCheckpoint(
        source=source,
        path=path,
        config=config,
        thinker=thinker,
        talker=talker,
        code2wav=code2wav,
        tokenizer=tokenizer,
        feature_extractor=feature_extractor,
        special=special,
        voices=voices,
        random_weights=random_weights,
        vision=vision,
    )


def load_config(path: Path) -> Any:
    """The folder's ``Qwen3OmniMoeConfig``, validated."""
    from transformers import Qwen3OmniMoeConfig

    quiet_rope_key_warnings()
    config = load_hf_config(path, Qwen3OmniMoeConfig, MODEL_TYPE)
    validate_config(config)
    return config


def load_vision_preprocessor(path: Path, config: Any) -> Qwen3OmniVisionPreprocessor | None:
    """The image processor settings of ``preprocessor_config.json`` (None when it has none), checked against the
    vision tower's config."""
    raw = read_preprocessor_config(path)
    return Qwen3OmniVisionPreprocessor.from_preprocessor_config(raw, config.thinker_config.vision_config)


def _placement(devices: dict[str, str] | None, dtypes: dict[str, torch.dtype] | None) -> dict[str, Placement]:
    """Device and dtype of each part, from arguments keyed by stage."""
    return stage_placement(devices, dtypes, STAGE_OF_PART, float32_parts=("code2wav",))


def _load_parts(path: Path, config: Any, placement: dict[str, Placement]) -> tuple[Any, Any, Any]:
    """The three parts, loaded once and placed (:func:`~pipeline.models.common.hf_loading.load_parts`); talker and
    code2wav are None for a checkpoint without audio output."""
    from transformers import Qwen3OmniMoeForConditionalGeneration

    optional = () if config.enable_audio_output else ("talker", "code2wav")
    thinker, talker, code2wav = load_parts(
        Qwen3OmniMoeForConditionalGeneration.from_pretrained, path, placement, optional=optional
    )
    return thinker, talker, code2wav
