"""Loading a Qwen2.5-Omni checkpoint in the Hugging Face layout, with named special tokens and speakers.

A checkpoint folder holds ``config.json`` (thinker / talker / token2wav sub-configs),
``model.safetensors`` or ``model-0000X-of-0000N.safetensors`` + ``model.safetensors.index.json``,
``spk_dict.pt`` (the voices), tokenizer files and ``preprocessor_config.json`` (the Whisper feature
extractor's settings and, for a checkpoint that takes pictures, the image processor's beside them).
Random-weight test checkpoints made by :mod:`.tiny` also carry :data:`RANDOM_MARKER_FILE`.

Every special id the engine needs is read from the checkpoint config and cross-checked against the
tokenizer here, once; the rest of the engine takes them from :class:`SpecialTokens` and never
writes an id literally.

Units: user audio is 16 kHz mono; the feature extractor's hop is 10 ms (one mel frame); the audio
encoder emits one token per 4 mel frames (25 tokens/s).
"""

from __future__ import annotations

import json
import logging
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import torch

from pipeline.errors import CheckpointError, ConfigError
from pipeline.models.common.random_checkpoint import RANDOM_MARKER_FILE
from pipeline.models.qwen2_5_omni.hf_logging import quiet_talker_token_id_warnings
from pipeline.models.qwen2_5_omni.vision import VisionPreprocessor

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
""":class:`SpecialTokens` field -> the tokenizer token that must carry the same id."""

CONFIG_FILE = "config.json"
SINGLE_WEIGHTS_FILE = "model.safetensors"
WEIGHTS_INDEX_FILE = "model.safetensors.index.json"
SPEAKERS_FILE = "spk_dict.pt"
PREPROCESSOR_FILE = "preprocessor_config.json"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")

SUBMODELS = ("thinker", "talker", "token2wav")
TOKEN2WAV_DTYPE = torch.float32
"""The DiT's ODE and the vocoder are only numerically sound in float32 (the reference does the same)."""

BIGVGAN_HOP_SAMPLES = 240
"""24 kHz output samples per mel frame: the BigVGAN upsample rates must multiply to this."""


# --- Special tokens ---------------------------------------------------------------------------
@dataclass(frozen=True)
class SpecialTokens:
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
    def from_config(cls, config: Any, tokenizer: Any) -> SpecialTokens:
        """Read the ids from a ``Qwen2_5OmniConfig``; ``im_start/im_end/endoftext`` (absent from
        the Omni config) come from the tokenizer by name. Raises :class:`CheckpointError` when an id
        is missing, out of its vocabulary, or disagrees with the tokenizer."""
        thinker, talker = config.thinker_config, config.talker_config
        by_name = _tokenizer_ids(tokenizer)
        special = cls(
            im_start=by_name[IM_START],
            im_end=by_name[IM_END],
            endoftext=by_name[ENDOFTEXT],
            audio_token=_config_id(thinker, "thinker_config", "audio_token_index"),
            audio_start=_config_id(thinker, "thinker_config", "audio_start_token_id"),
            audio_end=_config_id(thinker, "thinker_config", "audio_end_token_id"),
            image_token=_config_id(thinker, "thinker_config", "image_token_index"),
            video_token=_config_id(thinker, "thinker_config", "video_token_index"),
            # The thinker config of the released checkpoints may lack the vision ids; the talker's has them.
            vision_start=_config_id_with_fallback(thinker, talker, "vision_start_token_id"),
            vision_end=_config_id_with_fallback(thinker, talker, "vision_end_token_id"),
            tts_text_start=_config_id(talker, "talker_config", "tts_text_start_token_id"),
            tts_text_end=_config_id(talker, "talker_config", "tts_text_end_token_id"),
            tts_text_pad=_config_id(talker, "talker_config", "tts_text_pad_token_id"),
            codec_bos=_config_id(talker, "talker_config", "tts_codec_start_token_id"),
            codec_eos=_config_id(talker, "talker_config", "tts_codec_end_token_id"),
            codec_pad=_config_id(talker, "talker_config", "tts_codec_pad_token_id"),
            codec_mask=_config_id(talker, "talker_config", "tts_codec_mask_token_id"),
        )
        special.check(config, by_name)
        return special

    def check(self, config: Any, tokenizer_ids: Mapping[str, int]) -> None:
        """Ranges, distinctness, and agreement of the config's marker ids with the tokenizer."""
        thinker_vocab = config.thinker_config.text_config.vocab_size
        talker_vocab = config.talker_config.vocab_size
        for name, value in self.thinker_ids().items():
            _check_in_vocab(value, thinker_vocab, f"thinker id {name}")
        for name, value in self.codec_ids().items():
            _check_in_vocab(value, talker_vocab, f"talker codec id {name}")
        _check_distinct(self.thinker_ids(), "thinker special ids")
        _check_distinct(self.codec_ids(), "codec special ids")
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


def _tokenizer_ids(tokenizer: Any) -> dict[str, int]:
    ids: dict[str, int] = {}
    for token in TOKENIZER_NAMED_FIELDS.values():
        token_id = tokenizer.convert_tokens_to_ids(token)
        unknown = tokenizer.unk_token_id is not None and token_id == tokenizer.unk_token_id
        if token_id is None or (unknown and token != tokenizer.unk_token):
            raise CheckpointError(f"tokenizer: special token {token} is missing", param=token)
        ids[token] = int(token_id)
    return ids


def _config_id(sub_config: Any, where: str, attr: str) -> int:
    value = getattr(sub_config, attr, None)
    if not isinstance(value, int) or isinstance(value, bool):
        raise CheckpointError(f"{CONFIG_FILE}: {where}.{attr} is missing or not an integer", param=f"{where}.{attr}")
    return value


def _config_id_with_fallback(thinker: Any, talker: Any, attr: str) -> int:
    if isinstance(getattr(thinker, attr, None), int):
        return _config_id(thinker, "thinker_config", attr)
    return _config_id(talker, "talker_config", attr)


def _check_in_vocab(value: int, vocab_size: int, what: str) -> None:
    if not 0 <= value < vocab_size:
        raise CheckpointError(f"{CONFIG_FILE}: {what} = {value} is outside the vocabulary [0, {vocab_size})")


def _check_distinct(ids: Mapping[str, int], what: str) -> None:
    seen: dict[int, str] = {}
    for name, value in ids.items():
        if value in seen:
            raise CheckpointError(f"{CONFIG_FILE}: {what} {seen[value]} and {name} share the id {value}")
        seen[value] = name


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
        _check_in_vocab(bos, thinker_vocab, f"{source} speaker {name!r} bos_token")
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
class LoadedCheckpoint:
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
    special: SpecialTokens
    random_weights: bool
    vision: VisionPreprocessor | None = None
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
) -> LoadedCheckpoint:
    """Load a checkpoint folder, or a hub id already in the local Hugging Face cache (never downloads).

    ``devices`` / ``dtypes`` are keyed by ``"thinker"``, ``"talker"``, ``"token2wav"``; missing
    keys default to ``"cpu"`` and to bfloat16 on CUDA / float32 elsewhere; token2wav is always
    float32. Raises :class:`CheckpointError` naming the file or field when something is missing or
    inconsistent, :class:`ConfigError` for bad ``devices``/``dtypes`` arguments.
    """
    placement = _placement(devices, dtypes)
    path = resolve_checkpoint_path(name_or_path)
    config = _load_config(path)
    _check_weights_present(path)
    tokenizer = load_tokenizer(path)
    special = SpecialTokens.from_config(config, tokenizer)
    speakers = load_speakers(_required_file(path, SPEAKERS_FILE), config)
    feature_extractor = load_feature_extractor(path, config)
    vision = load_vision_preprocessor(path, config)
    thinker, talker, token2wav = _load_submodels(path, placement)
    return LoadedCheckpoint(
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


@dataclass(frozen=True)
class Placement:
    device: str
    dtype: torch.dtype


def _placement(devices: dict[str, str] | None, dtypes: dict[str, torch.dtype] | None) -> dict[str, Placement]:
    devices, dtypes = dict(devices or {}), dict(dtypes or {})
    for arg, given in (("devices", devices), ("dtypes", dtypes)):
        unknown = set(given) - set(SUBMODELS)
        if unknown:
            raise ConfigError(f"{arg}: unknown sub-model(s) {sorted(unknown)}; expected {SUBMODELS}", param=arg)
    if dtypes.get("token2wav", TOKEN2WAV_DTYPE) != TOKEN2WAV_DTYPE:
        raise ConfigError("dtypes.token2wav: token2wav always runs in float32", param="dtypes.token2wav")
    placement = {}
    for part in SUBMODELS:
        device = str(devices.get(part, "cpu"))
        default = torch.bfloat16 if torch.device(device).type == "cuda" else torch.float32
        dtype = TOKEN2WAV_DTYPE if part == "token2wav" else dtypes.get(part, default)
        placement[part] = Placement(device=device, dtype=dtype)
    return placement


def resolve_checkpoint_path(name_or_path: str | os.PathLike[str]) -> Path:
    """A local folder as is; otherwise a hub id (``Org/Name``) looked up in the local HF cache only. Cheap (no
    weights read): callers check a model this way before loading it. :class:`CheckpointError` says which of
    "no such folder", "a file, not a folder" or "not in the local cache" (with the download command) it is."""
    local = Path(name_or_path).expanduser()
    if local.is_dir():
        return local.resolve()
    name = str(name_or_path)
    if local.exists():
        raise CheckpointError(f"{name}: a file, not a checkpoint folder", param="model")
    if name.count("/") != 1 or name.startswith((".", "/", "~")):
        raise CheckpointError(f"{name}: no such folder (nor a hub id of the form Org/Name)", param="model")
    from huggingface_hub import snapshot_download

    try:
        return Path(snapshot_download(name, local_files_only=True))
    except Exception as exc:  # huggingface_hub raises LocalEntryNotFoundError and friends
        raise CheckpointError(
            f"{name}: no such folder, and not in the local Hugging Face cache as a hub id (nothing is "
            f"downloaded here). Fetch it first with `hf download {name}` (huggingface_hub's command), or pass "
            f"a checkpoint folder. ({type(exc).__name__})",
            param="model",
        ) from exc


def is_random_checkpoint(path: Path) -> bool:
    marker = path / RANDOM_MARKER_FILE
    if not marker.is_file():
        return False
    try:
        return bool(json.loads(marker.read_text())["random_weights"])
    except (ValueError, KeyError, TypeError) as exc:
        raise CheckpointError(f"{RANDOM_MARKER_FILE}: malformed ({exc})") from exc


def _required_file(path: Path, name: str) -> Path:
    file = path / name
    if not file.is_file():
        raise CheckpointError(f"{name}: missing from checkpoint folder {path}", param=name)
    return file


def _load_config(path: Path) -> Any:
    from transformers import Qwen2_5OmniConfig

    quiet_talker_token_id_warnings()
    file = _required_file(path, CONFIG_FILE)
    try:
        raw = json.loads(file.read_text())
    except ValueError as exc:
        raise CheckpointError(f"{CONFIG_FILE}: not valid JSON ({exc})") from exc
    if raw.get("model_type") != "qwen2_5_omni":
        raise CheckpointError(f"{CONFIG_FILE}: model_type is {raw.get('model_type')!r}, expected 'qwen2_5_omni'")
    try:
        config = Qwen2_5OmniConfig.from_pretrained(path)
    except Exception as exc:  # transformers validates configs with assorted exception types
        raise CheckpointError(f"{CONFIG_FILE}: rejected by transformers: {exc}") from exc
    validate_config(config)
    return config


def _check_weights_present(path: Path) -> None:
    if (path / SINGLE_WEIGHTS_FILE).is_file():
        return
    index = path / WEIGHTS_INDEX_FILE
    if not index.is_file():
        raise CheckpointError(f"{SINGLE_WEIGHTS_FILE} / {WEIGHTS_INDEX_FILE}: no weights in {path}", param="weights")
    try:
        shards = set(json.loads(index.read_text())["weight_map"].values())
    except (ValueError, KeyError, AttributeError) as exc:
        raise CheckpointError(f"{WEIGHTS_INDEX_FILE}: malformed ({exc})") from exc
    missing = sorted(s for s in shards if not (path / s).is_file())
    if missing:
        raise CheckpointError(f"{WEIGHTS_INDEX_FILE}: shard(s) missing: {', '.join(missing)}", param="weights")


def load_tokenizer(path: Path) -> Any:
    from transformers import AutoTokenizer

    if not any((path / name).is_file() for name in (*TOKENIZER_FILES, "vocab.json")):
        raise CheckpointError(f"tokenizer: no tokenizer files ({', '.join(TOKENIZER_FILES)}) in {path}")
    try:
        return AutoTokenizer.from_pretrained(path)
    except Exception as exc:  # tokenizers / transformers raise assorted types on bad files
        raise CheckpointError(f"tokenizer: cannot be loaded from {path}: {exc}") from exc


def load_feature_extractor(path: Path, config: Any) -> Any:
    from transformers import WhisperFeatureExtractor

    _required_file(path, PREPROCESSOR_FILE)
    try:
        fe = WhisperFeatureExtractor.from_pretrained(path)
    except Exception as exc:  # as above
        raise CheckpointError(f"{PREPROCESSOR_FILE}: cannot be loaded: {exc}") from exc
    mel_bins = config.thinker_config.audio_config.num_mel_bins
    if fe.feature_size != mel_bins:
        raise CheckpointError(
            f"{PREPROCESSOR_FILE}: feature_size {fe.feature_size} != audio_config.num_mel_bins {mel_bins}",
            param="feature_size",
        )
    if fe.sampling_rate != 16_000:
        raise CheckpointError(f"{PREPROCESSOR_FILE}: sampling_rate {fe.sampling_rate}, expected 16000")
    return fe


def load_vision_preprocessor(path: Path, config: Any) -> VisionPreprocessor | None:
    """The image processor settings of ``preprocessor_config.json`` (None when it has none), checked against the
    vision tower's config."""
    file = _required_file(path, PREPROCESSOR_FILE)
    try:
        raw = json.loads(file.read_text())
    except ValueError as exc:
        raise CheckpointError(f"{PREPROCESSOR_FILE}: not valid JSON ({exc})") from exc
    if not isinstance(raw, dict):
        raise CheckpointError(f"{PREPROCESSOR_FILE}: expected a JSON object")
    return VisionPreprocessor.from_preprocessor_config(raw, config.thinker_config.vision_config)


def _load_submodels(path: Path, placement: dict[str, Placement]) -> tuple[Any, Any, Any]:
    """Load the full model once (transformers maps the released key layout), then place each part.

    Loading keeps the checkpoint's stored dtype (``dtype="auto"``) so that casting each part
    afterwards never widens already-rounded values. A single target device is passed as
    ``device_map`` (no dispatch hooks); parts bound elsewhere are moved after loading.
    """
    from transformers import Qwen2_5OmniForConditionalGeneration

    devices = {p.device for p in placement.values()}
    load_device = placement["thinker"].device if len(devices) == 1 and "cpu" not in devices else None
    # The class's own from_pretrained only adds speaker loading (done by us, with checks) and cannot
    # return the loading info; the generic PreTrainedModel one can, so call that for this class.
    model_class = Qwen2_5OmniForConditionalGeneration
    generic_from_pretrained = super(model_class, model_class).from_pretrained
    try:
        model, info = generic_from_pretrained(path, dtype="auto", device_map=load_device, output_loading_info=True)
    except Exception as exc:  # safetensors / transformers raise assorted types on bad weights
        raise CheckpointError(f"weights: cannot be loaded from {path}: {exc}", param="weights") from exc
    _check_loading_info(info)
    parts = []
    for name in SUBMODELS:
        module = getattr(model, name, None)
        if module is None:
            raise CheckpointError(f"weights: the loaded model has no {name}", param="weights")
        module.to(device=placement[name].device, dtype=placement[name].dtype)
        module.eval()
        parts.append(module)
    return parts[0], parts[1], parts[2]


def _check_loading_info(info: Mapping[str, Any]) -> None:
    """transformers fills missing tensors with random values and only warns: refuse that here."""
    missing = sorted(info.get("missing_keys") or [])
    mismatched = list(info.get("mismatched_keys") or [])
    if missing:
        shown = ", ".join(missing[:5]) + (" ..." if len(missing) > 5 else "")
        raise CheckpointError(f"weights: {len(missing)} tensor(s) missing: {shown}", param="weights")
    if mismatched:
        raise CheckpointError(f"weights: tensor shapes disagree with {CONFIG_FILE}: {mismatched[:3]}", param="weights")
    unexpected = sorted(info.get("unexpected_keys") or [])
    if unexpected:
        logger.warning("weights: %d unexpected tensor(s) ignored, e.g. %s", len(unexpected), unexpected[:3])
