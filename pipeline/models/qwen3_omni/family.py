"""Qwen3-Omni as a model family (:class:`pipeline.models.family.ModelFamily`): its checkpoint loader, chat format,
voices (codec ids in the talker config), incremental log-mel features and AuT encoder, the vision tower (pictures and
camera video, with deepstack features), the frame talker (codebook 0 by the MoE talker, codebooks 1..15 by the code
predictor) and the streaming code2wav."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import fields
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

import torch

from pipeline.api import VisionInfo
from pipeline.errors import ConfigError, UnsupportedInputError
from pipeline.models.common.chatml import ChatMLRenderer
from pipeline.models.common.hf_checkpoint import resolve_checkpoint_path
from pipeline.models.common.hf_parts import thinker_audio_tower, thinker_text_model, thinker_vision_tower
from pipeline.models.common.settings import reject_unknown
from pipeline.models.common.tmrope import TMROPE, TMRoPE
from pipeline.models.family import Connector, ThinkerParts
from pipeline.models.qwen3_omni.av_interleave import Qwen3OmniAVTiming
from pipeline.models.qwen3_omni.checkpoint import Qwen3OmniLoadedCheckpoint, Qwen3OmniSpecialTokens, load_checkpoint
from pipeline.models.qwen3_omni.frame_talker import Qwen3OmniFrameTalker, thinker_to_talker
from pipeline.models.qwen3_omni.prompt import DEFAULT_SYSTEM_PROMPT, TRANSCRIPTION_PROMPT
from pipeline.models.qwen3_omni.talker import CodecRules, TalkerTokens

if TYPE_CHECKING:
    from pipeline.models.common.log_mel import IncrementalLogMel
    from pipeline.models.qwen3_omni.code2wav_chunking import Code2WavChunking
    from pipeline.models.qwen3_omni.code2wav_stream import Code2WavStream, StreamingCode2Wav
    from pipeline.models.qwen3_omni.vision import Qwen3OmniVisionPreprocessor


def talker_to_token2wav(frame: list[int], stop_ids: tuple[int, ...]) -> list[int] | None:
    """A frame as code2wav takes it, or None when its codebook-0 code ends the utterance (such a frame has no audio)."""
    return None if frame[0] in stop_ids else frame


class Qwen3OmniFamily:
    """Qwen3-Omni's checkpoints (:class:`Qwen3OmniLoadedCheckpoint`) for the engine."""

    name = "qwen3_omni"
    display_name = "Qwen3-Omni"
    codes_per_second = 12.5
    default_instructions = DEFAULT_SYSTEM_PROMPT
    transcription_prompt = TRANSCRIPTION_PROMPT
    connectors = MappingProxyType(
        {
            c.name: c
            for c in (
                Connector("thinker_to_talker", "thinker", "talker", thinker_to_talker),
                Connector("talker_to_token2wav", "talker", "token2wav", talker_to_token2wav),
            )
        }
    )

    token2wav_keys = frozenset({"chunking"})
    """The token2wav section's keys that are Qwen3-Omni's: ``chunking``, code2wav's chunk schedule
    (:class:`~pipeline.models.qwen3_omni.code2wav_stream.Code2WavChunking`'s fields, in codec frames)."""

    def token2wav_config(self, raw: Mapping[str, Any], *, path: str, device: torch.device) -> Code2WavChunking:
        from pipeline.models.qwen3_omni.code2wav_chunking import Code2WavChunking

        chunking = raw.get("chunking", {})
        where = f"{path}.chunking"
        if not isinstance(chunking, Mapping):
            raise ConfigError(f"{where} must be a mapping of chunk settings", param=where)
        known = {f.name for f in fields(Code2WavChunking)}
        reject_unknown(chunking, known, where)
        try:
            return Code2WavChunking(**chunking)
        except ConfigError as exc:
            raise ConfigError(f"{where}: {exc}", param=f"{where}.{exc.param}" if exc.param else where) from exc

    def resolve_checkpoint(self, model: str) -> Path:
        return resolve_checkpoint_path(model)

    def load_pretrained(self, model: str, *, devices: dict, dtypes: dict) -> Qwen3OmniLoadedCheckpoint:
        return load_checkpoint(model, devices=devices, dtypes=dtypes)

    @property
    def random_presets(self) -> tuple[str, ...]:
        from pipeline.models.qwen3_omni.tiny import PRESETS

        return tuple(PRESETS)

    def random_spec(self, preset: str, *, seed: int = 0) -> Any:
        from pipeline.models.qwen3_omni.tiny import PRESETS

        return PRESETS[preset](seed=seed)

    def write_random(self, out_dir: Path, spec: Any) -> Path:
        from pipeline.models.qwen3_omni.tiny import make_random_checkpoint

        return make_random_checkpoint(out_dir, spec)

    def random_checkpoint_command(self, argv: Sequence[str], *, prog: str) -> int:
        from pipeline.models.qwen3_omni.tiny import main

        return main(argv, prog=prog)

    def build_random(
        self, spec: Any, *, device: torch.device | str, dtype: torch.dtype, devices: dict[str, str] | None = None
    ) -> Qwen3OmniLoadedCheckpoint:
        from pipeline.models.qwen3_omni.checkpoint import assemble, load_vision_preprocessor
        from pipeline.models.qwen3_omni.tiny import build_random_model

        built = build_random_model(spec, device=device, dtype=dtype)
        parts = (built.thinker, built.talker, built.code2wav)
        for part in parts:
            if part is not None:
                part.eval()
        if built.code2wav is not None:
            built.code2wav.float()  # as loaded checkpoints run it: in float32
        for part, stage in ((built.talker, "talker"), (built.code2wav, "token2wav")):  # built beside the thinker
            target = (devices or {}).get(stage)
            if part is not None and target is not None and torch.device(target) != torch.device(device):
                part.to(device=target)
        return assemble(
            built.source,
            built.path,
            built.config,
            parts,
            built.tokenizer,
            built.feature_extractor,
            built.random_weights,
            vision=load_vision_preprocessor(built.path, built.config),
        )

    def max_context(self, ckpt: Qwen3OmniLoadedCheckpoint) -> int:
        return ckpt.config.thinker_config.text_config.max_position_embeddings

    def special(self, ckpt: Qwen3OmniLoadedCheckpoint) -> Qwen3OmniSpecialTokens:
        return ckpt.special

    def codec_stop_ids(self, ckpt: Qwen3OmniLoadedCheckpoint) -> tuple[int, ...]:
        return ckpt.special.codec_stop_ids()

    def codec_suppress_ids(self, ckpt: Qwen3OmniLoadedCheckpoint) -> list[int]:
        """The talker's control ids (the last 1024 of its vocabulary), codec eos excepted, as the reference suppresses
        them."""
        if not ckpt.audio_output:
            return []
        return list(CodecRules.of(TalkerTokens.of(ckpt.config)).suppress)

    def renderer(self, ckpt: Qwen3OmniLoadedCheckpoint) -> ChatMLRenderer:
        return ChatMLRenderer(ckpt.tokenizer, ckpt.special)

    def positions(self, ckpt: Qwen3OmniLoadedCheckpoint) -> TMRoPE:
        """TMRoPE: text and audio advance every axis by one; a picture's positions are its grid's offsets."""
        return TMROPE

    def speaks(self, ckpt: Qwen3OmniLoadedCheckpoint) -> bool:
        """False for a checkpoint saved without its talker and code2wav (``enable_audio_output`` false, like the
        released -Thinking ones)."""
        return ckpt.audio_output

    def voices(self, ckpt: Qwen3OmniLoadedCheckpoint) -> tuple[str, ...]:
        return tuple(ckpt.voices)

    def default_voice(self, ckpt: Qwen3OmniLoadedCheckpoint) -> str:
        if not ckpt.voices:
            raise UnsupportedInputError(f"{ckpt.source} has no talker: it answers in text only", param="modalities")
        return ckpt.default_voice

    def voice_bos(self, ckpt: Qwen3OmniLoadedCheckpoint, voice: str) -> int:
        """The voice's codec id (the talker's reply opening carries it; Qwen3-Omni has no thinker-vocabulary voice
        token)."""
        return TalkerTokens.of(ckpt.config).speaker(voice)

    def audio_features(self, ckpt: Qwen3OmniLoadedCheckpoint) -> IncrementalLogMel:
        from pipeline.models.qwen3_omni.audio_features import incremental_log_mel

        return incremental_log_mel(ckpt.feature_extractor, ckpt.config.thinker_config.audio_config)

    def thinker_parts(
        self, ckpt: Qwen3OmniLoadedCheckpoint, *, device: torch.device, cuda_graphs: bool
    ) -> ThinkerParts:
        """The thinker's parts; the vision tower
        (:class:`~pipeline.models.qwen3_omni.vision_encoder.Qwen3OmniVisionEncoder`) returns each item's merged tokens
        with its deepstack features, which the engine adds to the first decoder layers' outputs at the item's
        positions."""
        from pipeline.models.qwen3_omni.audio_encoder import Qwen3OmniBlockEncoder
        from pipeline.models.qwen3_omni.vision_encoder import Qwen3OmniVisionEncoder

        device = torch.device(device)
        audio = Qwen3OmniBlockEncoder(thinker_audio_tower(ckpt.thinker), device=device, cuda_graphs=cuda_graphs)
        vision = None
        if ckpt.vision is not None:
            vision = Qwen3OmniVisionEncoder(thinker_vision_tower(ckpt.thinker), device=device)
        layer = ckpt.config.talker_config.accept_hidden_layer if ckpt.audio_output else None
        return ThinkerParts(
            text_model=thinker_text_model(ckpt.thinker),
            lm_head=ckpt.thinker.lm_head,
            audio=audio,
            talker_hidden_layer=layer,
            vision=vision,
        )

    def frame_talker_parts(
        self, ckpt: Qwen3OmniLoadedCheckpoint, *, device: torch.device, dtype: torch.dtype
    ) -> Qwen3OmniFrameTalker | None:
        if not ckpt.audio_output:
            return None
        header = self.renderer(ckpt).header("assistant")
        embedding = thinker_text_model(ckpt.thinker).get_input_embeddings()
        return Qwen3OmniFrameTalker(ckpt.talker, embedding, ckpt.config, header)

    def vision_info(self, ckpt: Qwen3OmniLoadedCheckpoint) -> VisionInfo | None:
        """The image processor's pixel budget and patch sizes, at the 2 fps the model's video was sampled at (camera
        frames take the same budget as pictures)."""
        return None if ckpt.vision is None else ckpt.vision.info

    def av_timing(self, ckpt: Qwen3OmniLoadedCheckpoint) -> Qwen3OmniAVTiming | None:
        """The thinker's ``position_id_per_seconds`` and ``temporal_patch_size / fps`` seconds per temporal patch."""
        info = self.vision_info(ckpt)
        if info is None:
            return None
        return Qwen3OmniAVTiming(
            position_id_per_seconds=float(ckpt.config.thinker_config.position_id_per_seconds),
            second_per_grid=info.temporal_patch_size / info.fps,
        )

    def vision_preprocessor(self, ckpt: Qwen3OmniLoadedCheckpoint) -> Qwen3OmniVisionPreprocessor | None:
        return ckpt.vision

    def token2wav(self, ckpt: Qwen3OmniLoadedCheckpoint, stage: Any) -> StreamingCode2Wav:
        from pipeline.models.qwen3_omni.code2wav_stream import StreamingCode2Wav

        if ckpt.code2wav is None:
            raise UnsupportedInputError(f"{ckpt.source} has no code2wav: it answers in text only", param="modalities")
        return StreamingCode2Wav(ckpt.code2wav, stage.settings, max_batch=stage.max_batch)

    def start_stream(
        self,
        synthesizer: StreamingCode2Wav,
        ckpt: Qwen3OmniLoadedCheckpoint,
        voice: str,
        *,
        generator: torch.Generator | None,
        max_codes: int,
        quick: bool,
    ) -> Code2WavStream:
        """A code2wav stream of at most ``max_codes`` frames (code2wav takes no voice and draws no noise: the voice is
        in the talker's codes)."""
        del voice, generator
        return synthesizer.start(max_codes, quick=quick)


FAMILY = Qwen3OmniFamily()
