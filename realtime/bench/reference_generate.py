"""The bench's reference: transformers' non-streaming ``generate`` answering one spoken turn, per model family.

:func:`reference_generator` picks the served family's: :class:`Qwen25OmniReference` runs
``Qwen2_5OmniForConditionalGeneration.generate`` (thinker, then talker, then one-shot token2wav),
:class:`Qwen3OmniReference` runs ``Qwen3OmniMoeForConditionalGeneration.generate`` (thinker, then the frame talker,
then code2wav over all frames at once). Both run on the checkpoint objects the engine serves (sharing their modules:
no second copy of the weights), with the bench's forced reply length (min = max new tokens for the thinker and the
talker), the family's default system prompt and voice. Neither returns audio before everything is done, so its time to
first audio is its whole run, feature extraction included. Each call returns a :class:`Served` with the audio's
seconds as generate made them and the tokens it generated; calls run one at a time, on the caller's thread.

The checkpoints are the families' own objects; this module reads the attributes the reference needs of them (the
config, the parts, the special ids and voices, the feature extractor) without importing a family's package.
"""

from __future__ import annotations

import functools
import time
import warnings
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from pipeline.response_events import OUTPUT_SAMPLE_RATE
from realtime.bench.models import BenchConfigError, ReplyLength
from realtime.bench.reference import Served
from realtime.bench.speech import RATE, Speech

if TYPE_CHECKING:
    from pipeline.models.family import ModelFamily

MODEL_INPUT_RATE = 16_000
"""The thinker's audio encoder input rate (Hz)."""


class ReferenceGenerator(Protocol):
    """One spoken turn answered by transformers' ``generate`` (module docstring)."""

    def __call__(self, speech: Speech) -> Served: ...


def reference_generator(
    ckpt: Any, length: ReplyLength, family: ModelFamily, *, instructions: str | None = None
) -> ReferenceGenerator:
    """The reference of ``family`` on its loaded checkpoint ``ckpt``, replies forced to ``length``, under
    ``instructions`` (default: the family's). :class:`BenchConfigError` for a family without a reference here."""
    makers: dict[str, type[Qwen25OmniReference] | type[Qwen3OmniReference]] = {
        "qwen2_5_omni": Qwen25OmniReference,
        "qwen3_omni": Qwen3OmniReference,
    }
    maker = makers.get(family.name)
    if maker is None:
        raise BenchConfigError(
            f"--reference: no transformers reference for the {family.display_name} family "
            f"(there is one for {', '.join(sorted(makers))})"
        )
    return maker(ckpt, length, family, instructions=instructions)


def _spoken_turn_ids(renderer: Any, instructions: str, audio_tokens: int) -> list[int]:
    """The prompt of one spoken user turn after the system prompt, up to the assistant's header."""
    s = renderer.special
    return [
        *renderer.text_message("system", instructions),
        *renderer.header("user"),
        s.audio_start,
        *([s.audio_token] * audio_tokens),
        s.audio_end,
        *renderer.footer(),
        *renderer.header("assistant"),
    ]


def _input_pcm(speech: Speech) -> np.ndarray:
    """The turn's audio at the encoder's rate, float32."""
    import soxr

    return soxr.resample(speech.pcm, RATE, MODEL_INPUT_RATE).astype(np.float32)


def _synchronize(device: Any) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


class Qwen25OmniReference:
    """``Qwen2_5OmniForConditionalGeneration.generate`` on a loaded Qwen2.5-Omni checkpoint; the codec ids the DiT
    cannot embed are banned (the engine bans them too)."""

    def __init__(self, ckpt: Any, length: ReplyLength, family: ModelFamily, *, instructions: str | None = None) -> None:
        import torch
        from transformers import Qwen2_5OmniForConditionalGeneration

        self.ckpt = ckpt
        self.length = length
        self.device = next(ckpt.thinker.parameters()).device
        with torch.device("meta"):
            model = Qwen2_5OmniForConditionalGeneration(ckpt.config)
        model.thinker, model.talker = ckpt.thinker, ckpt.talker
        model.token2wav = _counting_token2wav_class()(ckpt.token2wav)
        model.speaker_map = {
            name: {"bos_token": s.bos_token, "cond": s.cond, "ref_mel": s.ref_mel} for name, s in ckpt.speakers.items()
        }
        self.model = model.eval()
        self.renderer = family.renderer(ckpt)
        self.instructions = instructions or family.default_instructions
        self.banned = self._banned_codes()

    def _banned_codes(self) -> list[list[int]]:
        """Codec ids the DiT cannot embed (random talkers sample them), stop ids excepted."""
        config = self.ckpt.config
        stops = set(self.ckpt.special.codec_stop_ids())
        dit_vocab = config.token2wav_config.dit_config.num_embeds
        return [[i] for i in range(dit_vocab, config.talker_config.vocab_size) if i not in stops]

    def inputs(self, pcm_16k: np.ndarray) -> dict:
        """``generate`` keyword arguments of one spoken user turn after the system prompt."""
        import torch

        ids = _spoken_turn_ids(self.renderer, self.instructions, self.ckpt.audio_tokens_for_samples(len(pcm_16k)))
        features = self.ckpt.feature_extractor(
            pcm_16k,
            sampling_rate=MODEL_INPUT_RATE,
            return_attention_mask=True,
            padding="max_length",
            return_tensors="pt",
        )
        input_ids = torch.tensor([ids], device=self.device)
        return {
            "input_ids": input_ids,
            "attention_mask": torch.ones_like(input_ids),
            "input_features": features["input_features"].to(self.device),
            "feature_attention_mask": features["attention_mask"].to(self.device),
        }

    def __call__(self, speech: Speech) -> Served:
        """Generate the reply to ``speech``; the time includes feature extraction, like a server's."""
        import torch

        start = time.perf_counter()
        kwargs = self.inputs(_input_pcm(speech))
        if self.banned:
            kwargs["talker_bad_words_ids"] = self.banned
        codes_before = self.model.token2wav.codes
        with torch.inference_mode():
            sequences, wav = self.model.generate(
                speaker=self.ckpt.default_speaker,
                thinker_max_new_tokens=self.length.text_tokens,
                thinker_min_new_tokens=self.length.text_tokens,
                talker_max_new_tokens=self.length.codec_tokens,
                talker_min_new_tokens=self.length.codec_tokens,
                talker_eos_token_id=list(self.ckpt.special.codec_stop_ids()),
                **kwargs,
            )
        _synchronize(self.device)
        return Served(
            time.perf_counter() - start,
            wav.numel() / OUTPUT_SAMPLE_RATE,
            thinker_tokens=sequences.shape[-1] - kwargs["input_ids"].shape[-1],
            talker_tokens=self.model.token2wav.codes - codes_before,
        )


class Qwen3OmniReference:
    """``Qwen3OmniMoeForConditionalGeneration.generate`` on a loaded Qwen3-Omni checkpoint (generate itself suppresses
    the talker's control ids, as the engine does). The talker's forced length is ``length.codec_tokens`` frames: its
    last generated token's frame is never completed (its residual codebooks are predicted at the next step), so it is
    asked for one token more, and code2wav decodes exactly that many frames."""

    def __init__(self, ckpt: Any, length: ReplyLength, family: ModelFamily, *, instructions: str | None = None) -> None:
        import torch
        from transformers import Qwen3OmniMoeForConditionalGeneration

        if not family.speaks(ckpt):
            raise BenchConfigError(f"--reference: {ckpt.source} has no talker, so no spoken reply to time")
        self.ckpt = ckpt
        self.length = length
        self.device = next(ckpt.thinker.parameters()).device
        with torch.device("meta"):
            model = Qwen3OmniMoeForConditionalGeneration(ckpt.config)
        model.thinker, model.talker = ckpt.thinker, ckpt.talker
        model.code2wav = _counting_code2wav_class()(ckpt.code2wav)
        self.model = model.eval()
        self.renderer = family.renderer(ckpt)
        self.instructions = instructions or family.default_instructions
        self.voice = family.default_voice(ckpt)

    def inputs(self, pcm_16k: np.ndarray) -> dict:
        """``generate`` keyword arguments of one spoken user turn after the system prompt (features as transformers'
        processor makes them: unpadded, with their mask)."""
        import torch
        from transformers.models.qwen3_omni_moe.modeling_qwen3_omni_moe import _get_feat_extract_output_lengths

        features = self.ckpt.feature_extractor(
            pcm_16k,
            sampling_rate=MODEL_INPUT_RATE,
            return_attention_mask=True,
            padding=True,
            truncation=False,
            return_tensors="pt",
        )
        mask = features["attention_mask"]
        n_window = self.ckpt.config.thinker_config.audio_config.n_window
        audio_tokens = int(_get_feat_extract_output_lengths(mask.sum(-1), n_window)[0])
        input_ids = torch.tensor([_spoken_turn_ids(self.renderer, self.instructions, audio_tokens)], device=self.device)
        return {
            "input_ids": input_ids,
            "attention_mask": torch.ones_like(input_ids),
            "input_features": features["input_features"].to(self.device),
            "feature_attention_mask": mask.to(self.device),
        }

    def __call__(self, speech: Speech) -> Served:
        """Generate the reply to ``speech``; the time includes feature extraction, like a server's."""
        import torch

        start = time.perf_counter()
        kwargs = self.inputs(_input_pcm(speech))
        frames_before = self.model.code2wav.frames
        talker_tokens = self.length.codec_tokens + 1  # the last token's frame is never completed (class docstring)
        with torch.inference_mode(), warnings.catch_warnings():
            # generate's own talker call passes embeddings with its default repetition penalty, and transformers warns
            # on every reply that the penalty covers the new tokens only: that is the reference as it is
            warnings.filterwarnings("ignore", "Passing `repetition_penalty` with `inputs_embeds`", UserWarning)
            sequences, wav = self.model.generate(
                speaker=self.voice,
                thinker_max_new_tokens=self.length.text_tokens,
                thinker_min_new_tokens=self.length.text_tokens,
                thinker_eos_token_id=self.ckpt.special.im_end,
                talker_max_new_tokens=talker_tokens,
                talker_min_new_tokens=talker_tokens,
                **kwargs,
            )
        _synchronize(self.device)
        return Served(
            time.perf_counter() - start,
            wav.numel() / OUTPUT_SAMPLE_RATE,
            thinker_tokens=sequences.shape[-1] - kwargs["input_ids"].shape[-1],
            talker_tokens=self.model.code2wav.frames - frames_before,
        )


@functools.cache
def _counting_token2wav_class():
    """The class below, defined on first use (this module does not import torch at import time)."""
    import torch
    from transformers import PreTrainedModel

    class CountingToken2Wav(torch.nn.Module):
        """The checkpoint's token2wav, counting the codec tokens ``generate`` hands it (the talker's
        output up to its stop token). Only the reference's own model holds it: the shared module
        the engine uses is not touched."""

        def __init__(self, inner: PreTrainedModel) -> None:
            super().__init__()
            self.inner = inner
            self.codes = 0

        @property
        def dtype(self) -> torch.dtype:
            return self.inner.dtype

        def forward(self, code, *args, **kwargs):
            self.codes += int(code.shape[-1])
            return self.inner(code, *args, **kwargs)

    return CountingToken2Wav


@functools.cache
def _counting_code2wav_class():
    """The class below, defined on first use (this module does not import torch at import time)."""
    import torch

    class CountingCode2Wav(torch.nn.Module):
        """The checkpoint's code2wav, counting the frames ``generate`` decodes (``chunked_decode`` of (batch, 16,
        frames) codes). Only the reference's own model holds it: the shared module the engine uses is not touched."""

        def __init__(self, inner: Any) -> None:
            super().__init__()
            self.inner = inner
            self.frames = 0

        @property
        def total_upsample(self) -> int:
            return int(self.inner.total_upsample)

        def chunked_decode(self, codes, *args, **kwargs):
            self.frames += int(codes.shape[-1])
            return self.inner.chunked_decode(codes, *args, **kwargs)

    return CountingCode2Wav
