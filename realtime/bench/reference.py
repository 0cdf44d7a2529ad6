"""The reference: transformers' non-streaming ``generate`` on the bench's inputs, one at a time.

:class:`ReferenceGenerator` runs ``Qwen2_5OmniForConditionalGeneration.generate`` (thinker, then
talker, then one-shot token2wav) on the same checkpoint objects the engine serves, with the same
forced reply lengths, the same system prompt and speaker, and the codec ids the DiT cannot embed
banned (the engine bans them too). It returns audio only when everything is done, so its time to
first audio is its whole run.

:func:`serve_one_worker` measures the reference under load the way it would serve it: every user of
a concurrency level speaks the same turns as in the streaming sweep, each request joins one queue,
and one worker serves the queue in arrival order. Every request is really run; only the worker's
idle time (no request waiting) is skipped on a virtual clock, which changes no figure of a
one-worker FIFO queue. A user's next request arrives after it heard the whole reply (its audio
duration), then spoke its next file up to the end of speech, plus the server's VAD silence window.
"""

from __future__ import annotations

import functools
import heapq
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from pipeline.response_events import OUTPUT_SAMPLE_RATE
from realtime.bench.client import UserPlan
from realtime.bench.metrics import ResponseOutcome, TurnMetrics
from realtime.bench.models import ReplyLength
from realtime.bench.speech import RATE, Speech

if TYPE_CHECKING:
    from pipeline.models.family import ModelFamily

MODEL_INPUT_RATE = 16_000
"""The thinker's audio encoder input rate (Hz)."""


@dataclass(frozen=True)
class Served:
    """One reference run: wall time (s), the reply audio's duration (s), and the tokens it
    generated (thinker reply tokens; talker codec tokens handed to token2wav)."""

    seconds: float
    audio_s: float
    thinker_tokens: int = 0
    talker_tokens: int = 0


@dataclass(frozen=True)
class QueuedTurn:
    """One request of the one-worker queue (seconds from the level's start, virtual clock)."""

    user: int
    turn: int
    wav: str
    arrival_s: float
    start_s: float
    done_s: float
    audio_s: float
    silence_window_s: float
    thinker_tokens: int = 0
    talker_tokens: int = 0

    @property
    def service_s(self) -> float:
        return self.done_s - self.start_s

    def metrics(self) -> TurnMetrics:
        """As a streaming turn's metrics: audio and transcript both come at the end of the run; the
        player gets the whole reply at once (no underrun); RTF is run time / audio duration."""
        ttfa = 1000.0 * (self.done_s - self.arrival_s)
        return TurnMetrics(
            self.user,
            self.turn,
            self.wav,
            ResponseOutcome.COMPLETED.value,
            ttfa_ms=ttfa,
            voice_to_voice_ms=ttfa + 1000.0 * self.silence_window_s,
            first_transcript_ms=ttfa,
            end_of_turn_ms=1000.0 * self.silence_window_s,
            rtf=self.service_s / self.audio_s if self.audio_s > 0 else None,
            audio_ms=1000.0 * self.audio_s,
            underruns=0,
            starved_ms=0.0,
        )


def serve_one_worker(
    plans: Sequence[UserPlan],
    serve: Callable[[Speech], Served],
    *,
    silence_window_s: float,
    on_done: Callable[[QueuedTurn], None] | None = None,
) -> list[QueuedTurn]:
    """Run every plan's turns through ``serve`` on one worker, first come first served (module
    docstring). A user's first request arrives at its start delay + its first file's end of speech
    + ``silence_window_s``. Returns the turns in the order they were served."""
    queue: list[tuple[float, int, int]] = []
    for plan in plans:
        if plan.speeches:
            heapq.heappush(queue, (_arrival(plan.start_delay_s, plan.speeches[0], silence_window_s), plan.user, 0))
    by_user = {plan.user: plan for plan in plans}
    clock, served = 0.0, []
    while queue:
        arrival, user, turn = heapq.heappop(queue)
        speech = by_user[user].speeches[turn]
        start = max(clock, arrival)
        result = serve(speech)
        clock = start + result.seconds
        done = QueuedTurn(
            user,
            turn,
            speech.name,
            arrival,
            start,
            clock,
            result.audio_s,
            silence_window_s,
            result.thinker_tokens,
            result.talker_tokens,
        )
        served.append(done)
        if on_done is not None:
            on_done(done)
        if turn + 1 < len(by_user[user].speeches):
            heard = clock + result.audio_s
            heapq.heappush(queue, (_arrival(heard, by_user[user].speeches[turn + 1], silence_window_s), user, turn + 1))
    return served


def _arrival(speech_start_s: float, speech: Speech, silence_window_s: float) -> float:
    return speech_start_s + speech.speech_end_ms / 1000.0 + silence_window_s


class ReferenceGenerator:
    """``generate`` on a loaded checkpoint (sharing its modules: no second copy of the weights); ``family`` is the
    checkpoint's (its prompt format and default instructions)."""

    def __init__(self, ckpt, length: ReplyLength, family: ModelFamily, *, instructions: str | None = None) -> None:
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

        r, s = self.renderer, self.renderer.special
        n_audio = self.ckpt.audio_tokens_for_samples(len(pcm_16k))
        ids = [
            *r.text_message("system", self.instructions),
            *r.header("user"),
            s.audio_start,
            *([s.audio_token] * n_audio),
            s.audio_end,
            *r.footer(),
            *r.header("assistant"),
        ]
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
        import soxr
        import torch

        start = time.perf_counter()
        kwargs = self.inputs(soxr.resample(speech.pcm, RATE, MODEL_INPUT_RATE).astype(np.float32))
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
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        return Served(
            time.perf_counter() - start,
            wav.numel() / OUTPUT_SAMPLE_RATE,
            thinker_tokens=sequences.shape[-1] - kwargs["input_ids"].shape[-1],
            talker_tokens=self.model.token2wav.codes - codes_before,
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
