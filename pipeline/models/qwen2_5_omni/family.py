"""Qwen2.5-Omni as a model family (:class:`pipeline.models.family.ModelFamily`): its checkpoint loader, chat format,
voices (``spk_dict.pt``), Whisper log-mel features, picture preprocessing and the streaming DiT + BigVGAN
token2wav."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

import torch

from pipeline.api import VisionInfo
from pipeline.models.common.log_mel import IncrementalLogMel
from pipeline.models.common.tmrope import TMROPE, TMRoPE
from pipeline.models.family import Connector, ThinkerParts
from pipeline.models.qwen2_5_omni import connectors
from pipeline.models.qwen2_5_omni.av_interleave import Qwen25OmniAVTiming
from pipeline.models.qwen2_5_omni.checkpoint import (
    Qwen25OmniLoadedCheckpoint,
    Qwen25OmniSpecialTokens,
    load_checkpoint,
    resolve_checkpoint_path,
)
from pipeline.models.qwen2_5_omni.chunk_schedule import ChunkingConfig
from pipeline.models.qwen2_5_omni.prompt import DEFAULT_SYSTEM_PROMPT, TRANSCRIPTION_PROMPT, ChatMLRenderer
from pipeline.models.qwen2_5_omni.token2wav_settings import KEYS, Token2WavSettings, parse_token2wav_settings
from pipeline.models.qwen2_5_omni.vision import Qwen25OmniVisionPreprocessor

if TYPE_CHECKING:
    from pipeline.models.qwen2_5_omni.tiny import Qwen25OmniRandomModelSpec
    from pipeline.models.qwen2_5_omni.token2wav_stream import (
        Qwen25OmniToken2WavStream,
        StreamingToken2Wav,
    )


class Qwen25OmniFamily:
    """Qwen2.5-Omni's checkpoints (:class:`Qwen25OmniLoadedCheckpoint`) for the engine."""

    name = "qwen2_5_omni"
    display_name = "Qwen2.5-Omni"
    codes_per_second = 50.0
    default_instructions = DEFAULT_SYSTEM_PROMPT
    transcription_prompt = TRANSCRIPTION_PROMPT
    connectors = MappingProxyType(
        {
            c.name: c
            for c in (
                Connector("thinker_to_talker", "thinker", "talker", connectors.thinker_to_talker),
                Connector("talker_to_token2wav", "talker", "token2wav", connectors.talker_to_token2wav),
            )
        }
    )

    token2wav_keys = KEYS

    def token2wav_config(self, raw: Mapping[str, Any], *, path: str, device: torch.device) -> Token2WavSettings:
        return parse_token2wav_settings(raw, path=path, device=device)

    def resolve_checkpoint(self, model: str) -> Path:
        return resolve_checkpoint_path(model)

    def load_pretrained(self, model: str, *, devices: dict, dtypes: dict) -> Qwen25OmniLoadedCheckpoint:
        return load_checkpoint(model, devices=devices, dtypes=dtypes)

    @property
    def random_presets(self) -> tuple[str, ...]:
        from pipeline.models.qwen2_5_omni.tiny import PRESETS

        return tuple(PRESETS)

    def random_spec(self, preset: str, *, seed: int = 0) -> Qwen25OmniRandomModelSpec:
        from pipeline.models.qwen2_5_omni.tiny import PRESETS

        return PRESETS[preset](seed=seed)

    def build_random(
        self,
        spec: Qwen25OmniRandomModelSpec,
        *,
        device: torch.device | str,
        dtype: torch.dtype,
        devices: dict[str, str] | None = None,
    ) -> Qwen25OmniLoadedCheckpoint:
        from pipeline.models.qwen2_5_omni.tiny import build_random_model

        ckpt = build_random_model(spec, device=device, dtype=dtype)
        for name in ("talker", "token2wav"):  # built beside the thinker; moved where their stage runs
            target = (devices or {}).get(name)
            if target is not None and torch.device(target) != torch.device(device):
                getattr(ckpt, name).to(device=target)
        return ckpt

    def write_random(self, out_dir: Path, spec: Qwen25OmniRandomModelSpec) -> Path:
        """Weights in float32 (``random_checkpoint_command`` writes the 7B preset in bfloat16, as released)."""
        from pipeline.models.qwen2_5_omni.tiny import make_random_checkpoint

        return make_random_checkpoint(out_dir, spec)

    def random_checkpoint_command(self, argv: Sequence[str], *, prog: str) -> int:
        from pipeline.models.qwen2_5_omni.tiny import main

        return main(argv, prog=prog)

    def max_context(self, ckpt: Qwen25OmniLoadedCheckpoint) -> int:
        return ckpt.config.thinker_config.text_config.max_position_embeddings

    def special(self, ckpt: Qwen25OmniLoadedCheckpoint) -> Qwen25OmniSpecialTokens:
        return ckpt.special

    def codec_stop_ids(self, ckpt: Qwen25OmniLoadedCheckpoint) -> tuple[int, ...]:
        return tuple(ckpt.special.codec_stop_ids())

    def codec_suppress_ids(self, ckpt: Qwen25OmniLoadedCheckpoint) -> list[int]:
        """Codec bos, and the talker ids past the DiT's code embedding table (except stop ids)."""
        dit_vocab = ckpt.config.token2wav_config.dit_config.num_embeds
        talker_vocab = ckpt.config.talker_config.vocab_size
        stop = self.codec_stop_ids(ckpt)
        return [ckpt.special.codec_bos, *(i for i in range(dit_vocab, talker_vocab) if i not in stop)]

    def renderer(self, ckpt: Qwen25OmniLoadedCheckpoint) -> ChatMLRenderer:
        return ChatMLRenderer(ckpt.tokenizer, ckpt.special)

    def positions(self, ckpt: Qwen25OmniLoadedCheckpoint) -> TMRoPE:
        """TMRoPE (the thinker config's ``mrope_section`` splits each head over the three axes)."""
        return TMROPE

    def speaks(self, ckpt: Qwen25OmniLoadedCheckpoint) -> bool:
        """Always: the loader refuses a checkpoint without a talker (``enable_audio_output`` false)."""
        return True

    def voices(self, ckpt: Qwen25OmniLoadedCheckpoint) -> tuple[str, ...]:
        return tuple(ckpt.speakers)

    def default_voice(self, ckpt: Qwen25OmniLoadedCheckpoint) -> str:
        return ckpt.default_speaker

    def voice_bos(self, ckpt: Qwen25OmniLoadedCheckpoint, voice: str) -> int:
        return ckpt.speakers[voice].bos_token

    def audio_features(self, ckpt: Qwen25OmniLoadedCheckpoint) -> IncrementalLogMel:
        return IncrementalLogMel(ckpt.feature_extractor)

    def frame_talker_parts(self, ckpt: Qwen25OmniLoadedCheckpoint, *, device: torch.device, dtype: torch.dtype) -> None:
        """None: the talker makes one code per step."""
        return None

    def thinker_parts(
        self, ckpt: Qwen25OmniLoadedCheckpoint, *, device: torch.device, cuda_graphs: bool
    ) -> ThinkerParts:
        from pipeline.models.common.hf_parts import thinker_audio_tower, thinker_text_model, thinker_vision_tower
        from pipeline.models.qwen2_5_omni.audio_encoder import Qwen25OmniBlockEncoder
        from pipeline.models.qwen2_5_omni.vision_encoder import Qwen25OmniVisionEncoder

        device = torch.device(device)
        audio = Qwen25OmniBlockEncoder(thinker_audio_tower(ckpt.thinker), device=device, cuda_graphs=cuda_graphs)
        vision = None
        if getattr(ckpt, "vision", None) is not None:
            vision = Qwen25OmniVisionEncoder(thinker_vision_tower(ckpt.thinker), device=device)
        return ThinkerParts(
            text_model=thinker_text_model(ckpt.thinker), lm_head=ckpt.thinker.lm_head, audio=audio, vision=vision
        )

    def vision_info(self, ckpt: Qwen25OmniLoadedCheckpoint) -> VisionInfo | None:
        return None if ckpt.vision is None else ckpt.vision.info

    def av_timing(self, ckpt: Qwen25OmniLoadedCheckpoint) -> Qwen25OmniAVTiming | None:
        info = self.vision_info(ckpt)
        if info is None:
            return None
        config = ckpt.thinker.config
        return Qwen25OmniAVTiming(
            int(config.position_id_per_seconds),
            int(config.seconds_per_chunk),
            second_per_grid=info.temporal_patch_size / info.fps,
        )

    def vision_preprocessor(self, ckpt: Qwen25OmniLoadedCheckpoint) -> Qwen25OmniVisionPreprocessor | None:
        return ckpt.vision

    def token2wav(self, ckpt: Qwen25OmniLoadedCheckpoint, stage: Any) -> StreamingToken2Wav:
        """``stage.settings`` is :meth:`token2wav_config`'s :class:`Token2WavSettings`."""
        from pipeline.models.qwen2_5_omni.token2wav_stream import StreamingToken2Wav

        on_cuda = stage.torch_device.type == "cuda"
        own: Token2WavSettings = stage.settings
        return StreamingToken2Wav(
            ckpt.token2wav,
            ChunkingConfig(**own.chunking),
            max_batch=stage.max_batch,
            tf32_matmul=own.tf32_matmul and on_cuda,
            compile_dit=own.compile,
            fused_vocoder=own.compile and on_cuda,
            dit_dtype=own.torch_dit_dtype,
            dit_attention=own.dit_attention,
        )

    def start_stream(
        self,
        synthesizer: StreamingToken2Wav,
        ckpt: Qwen25OmniLoadedCheckpoint,
        voice: str,
        *,
        generator: torch.Generator | None,
        max_codes: int,
        quick: bool,
    ) -> Qwen25OmniToken2WavStream:
        """The voice's ``cond`` / ``ref_mel`` are the checkpoint's own tensors: the synthesizer's speaker cache hits
        them by identity."""
        speaker = ckpt.speakers[voice]
        return synthesizer.start(
            speaker.cond, speaker.ref_mel, voice=voice, generator=generator, max_codes=max_codes, quick=quick
        )


FAMILY = Qwen25OmniFamily()
