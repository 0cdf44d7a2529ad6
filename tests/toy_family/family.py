"""A toy model family, to show what a family is made of: it borrows the thinker and talker of a Qwen2.5-Omni
checkpoint (the runners drive HF decoder-shaped modules) but has its own prompt format (``[role]: text`` then
``<|endoftext|>``), its own voices (``low`` and ``high``), its own connectors, and its own token2wav: each codec code
becomes :data:`TONE_SAMPLES` samples of a sine whose pitch is the voice's base plus a step per code.

Registered by the tests that use it (``pipeline.models.registered(FAMILY)``), under the name ``toy``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

import numpy as np
import torch

from pipeline.api import TranscriptionPrompt
from pipeline.errors import InvalidInputError
from pipeline.models import family_of
from pipeline.models.common.log_mel import IncrementalLogMel
from pipeline.models.common.tmrope import TMROPE
from pipeline.models.family import Connector, StreamStatus
from pipeline.models.qwen2_5_omni.checkpoint import Qwen25OmniLoadedCheckpoint, load_checkpoint

SAMPLE_RATE = 24_000
TONE_SAMPLES = 480
"""Samples per codec code (20 ms at 24 kHz)."""
CODES_PER_CHUNK = 4
VOICE_BASE_HZ = {"low": 110.0, "high": 440.0}
MAX_CONTEXT = 512


def tone(code: int, voice: str) -> np.ndarray:
    """The toy token2wav's samples for one code (float32, 24 kHz)."""
    t = np.arange(TONE_SAMPLES, dtype=np.float64) / SAMPLE_RATE
    hz = VOICE_BASE_HZ[voice] + 10.0 * (code % 64)
    return (0.25 * np.sin(2 * np.pi * hz * t)).astype(np.float32)


@dataclass
class ToyCheckpoint:
    source: str
    random_weights: bool
    thinker: torch.nn.Module
    talker: torch.nn.Module
    tokenizer: Any
    special: Any
    feature_extractor: Any
    voice_bos: dict[str, int]


def _from_qwen(qwen: Qwen25OmniLoadedCheckpoint) -> ToyCheckpoint:
    bos_ids = [s.bos_token for s in qwen.speakers.values()]
    return ToyCheckpoint(
        source=f"toy:{qwen.source}",
        random_weights=qwen.random_weights,
        thinker=qwen.thinker,
        talker=qwen.talker,
        tokenizer=qwen.tokenizer,
        special=qwen.special,
        feature_extractor=qwen.feature_extractor,
        voice_bos=dict(zip(VOICE_BASE_HZ, bos_ids)),
    )


class ToyRenderer:
    """``[role]: text<|endoftext|>`` per message; ``[assistant]: `` opens a reply."""

    tools = None
    """No function calling."""

    def __init__(self, tokenizer, special) -> None:
        self.tokenizer, self.special = tokenizer, special

    def header(self, role: str) -> list[int]:
        return list(self.tokenizer.encode(f"[{role}]: ", add_special_tokens=False))

    def footer(self) -> list[int]:
        return [self.special.endoftext]

    def text_message(self, role: str, text: str) -> list[int]:
        return [*self.tokenizer.encode(f"[{role}]: {text}", add_special_tokens=False), *self.footer()]

    def decode(self, token_ids: list[int]) -> str:
        return self.tokenizer.decode(token_ids, skip_special_tokens=True)


@dataclass
class ToneChunking:
    quick_first_chunk_frames: int | None = None
    quick_first_chunk_max_open: int = 0


class ToneStream:
    """One utterance: a chunk is :data:`CODES_PER_CHUNK` codes (fewer for the last one)."""

    def __init__(self, voice: str, max_codes: int) -> None:
        self.voice, self.max_codes = voice, max_codes
        self.status = StreamStatus.OPEN
        self.codes: list[int] = []
        self.codes_received = self.chunks_emitted = self._spoken = 0

    @property
    def done(self) -> bool:
        return self.status is StreamStatus.DONE

    def push(self, codes) -> None:
        if self.status is not StreamStatus.OPEN:
            raise InvalidInputError(f"cannot push to a {self.status.value} stream")
        if self.codes_received + len(codes) > self.max_codes:
            raise InvalidInputError(f"stream holds at most {self.max_codes} codes")
        self.codes.extend(int(c) for c in codes)
        self.codes_received = len(self.codes)

    def finish(self) -> None:
        if self.status is StreamStatus.OPEN:
            self.status = StreamStatus.FINISHED if self._pending() else StreamStatus.DONE

    def ready(self) -> bool:
        pending = self._pending()
        if self.status is StreamStatus.FINISHED:
            return pending > 0
        return self.status is StreamStatus.OPEN and pending >= CODES_PER_CHUNK

    def codes_until_ready(self) -> int | None:
        return max(0, CODES_PER_CHUNK - self._pending()) if self.status is StreamStatus.OPEN else None

    def step(self) -> np.ndarray:
        if not self.ready():
            raise InvalidInputError(f"no chunk ready ({self.status.value}, {self._pending()} codes pending)")
        codes = self.codes[self._spoken : self._spoken + CODES_PER_CHUNK]
        self._spoken += len(codes)
        self.chunks_emitted += 1
        if self.status is StreamStatus.FINISHED and not self._pending():
            self.status = StreamStatus.DONE
        return np.concatenate([tone(c, self.voice) for c in codes])

    def close(self) -> None:
        self.status = StreamStatus.CLOSED

    def _pending(self) -> int:
        return len(self.codes) - self._spoken


@dataclass
class ToneSynthesizer:
    max_batch: int
    cfg: ToneChunking = field(default_factory=ToneChunking)

    def warm_up(self, max_batch: int = 1) -> None:
        """Nothing to compile or capture."""

    def step_many(self, streams) -> list[np.ndarray]:
        return [s.step() for s in streams]


class ToyFamily:
    name = "toy"
    display_name = "toy"
    codes_per_second = 50.0
    default_instructions = "You are a toy."
    transcription_prompt = TranscriptionPrompt(
        instructions="You are a toy that writes down speech.",
        request="Write the words.",
        language_hint="Language: {language}.",
        context_hint="Context: {prompt}",
    )
    connectors = MappingProxyType(
        {
            c.name: c
            for c in (
                Connector(
                    "toy_text_to_talker", "thinker", "talker", lambda hidden, embeds, _multimodal: hidden + embeds
                ),
                Connector(
                    "toy_codes_to_tones", "talker", "token2wav", lambda code, stop: None if code in stop else code
                ),
            )
        }
    )

    token2wav_keys = frozenset()
    """The tones have no settings."""
    random_presets = ("tiny",)

    def token2wav_config(self, raw, *, path: str, device) -> None:
        return None

    def resolve_checkpoint(self, model: str) -> Path:
        return family_of("qwen2_5_omni").resolve_checkpoint(model)

    def load_pretrained(self, model: str, *, devices: dict, dtypes: dict) -> ToyCheckpoint:
        return _from_qwen(load_checkpoint(model, devices=devices, dtypes=dtypes))

    def random_spec(self, preset: str, *, seed: int = 0):
        """The tiny Qwen2.5-Omni's (whose thinker and talker the toy borrows)."""
        if preset not in self.random_presets:
            raise KeyError(preset)
        return family_of("qwen2_5_omni").random_spec(preset, seed=seed)

    def build_random(self, spec, *, device, dtype, devices=None) -> ToyCheckpoint:
        qwen = family_of("qwen2_5_omni")
        return _from_qwen(qwen.build_random(spec, device=device, dtype=dtype, devices=devices))

    def write_random(self, out_dir: Path, spec) -> Path:
        return family_of("qwen2_5_omni").write_random(out_dir, spec)

    def random_checkpoint_command(self, argv: Sequence[str], *, prog: str) -> int:
        """The toy loads Qwen2.5-Omni checkpoints: that family's command writes them."""
        return family_of("qwen2_5_omni").random_checkpoint_command(argv, prog=prog)

    def max_context(self, ckpt: ToyCheckpoint) -> int:
        return MAX_CONTEXT

    def special(self, ckpt: ToyCheckpoint):
        return ckpt.special

    def codec_stop_ids(self, ckpt: ToyCheckpoint) -> tuple[int, ...]:
        return (ckpt.special.codec_eos,)

    def codec_suppress_ids(self, ckpt: ToyCheckpoint) -> list[int]:
        """Every other code makes a tone."""
        s = ckpt.special
        return [s.codec_bos, s.codec_pad, s.codec_mask]

    def renderer(self, ckpt: ToyCheckpoint) -> ToyRenderer:
        return ToyRenderer(ckpt.tokenizer, ckpt.special)

    def positions(self, ckpt: ToyCheckpoint):
        """The borrowed thinker's TMRoPE (without pictures: every position at its cache index)."""
        return TMROPE

    def speaks(self, ckpt: ToyCheckpoint) -> bool:
        return True

    def voices(self, ckpt: ToyCheckpoint) -> tuple[str, ...]:
        return tuple(ckpt.voice_bos)

    def default_voice(self, ckpt: ToyCheckpoint) -> str:
        return "low"

    def voice_bos(self, ckpt: ToyCheckpoint, voice: str) -> int:
        return ckpt.voice_bos[voice]

    def audio_features(self, ckpt: ToyCheckpoint) -> IncrementalLogMel:
        return IncrementalLogMel(ckpt.feature_extractor)

    def frame_talker_parts(self, ckpt, *, device: torch.device, dtype: torch.dtype) -> None:
        """None: the talker makes one code per step."""
        return None

    def thinker_parts(self, ckpt: ToyCheckpoint, *, device, cuda_graphs: bool):
        """The tiny Qwen2.5-Omni's thinker modules (the runners need a decoder-shaped stack and an audio encoder)."""
        return family_of("qwen2_5_omni").thinker_parts(ckpt, device=device, cuda_graphs=cuda_graphs)

    def vision_info(self, ckpt: ToyCheckpoint) -> None:
        """The toy family takes no pictures."""
        return None

    def vision_preprocessor(self, ckpt: ToyCheckpoint) -> None:
        return None

    def av_timing(self, ckpt: ToyCheckpoint) -> None:
        return None

    def token2wav(self, ckpt: ToyCheckpoint, stage) -> ToneSynthesizer:
        return ToneSynthesizer(max_batch=stage.max_batch)

    def start_stream(self, synthesizer, ckpt, voice, *, generator, max_codes, quick) -> ToneStream:
        return ToneStream(voice, max_codes)


FAMILY = ToyFamily()
