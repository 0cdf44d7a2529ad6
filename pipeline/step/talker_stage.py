"""The talker stage of a step: starting each reply's talker, feeding it, decoding its codes, and accepting them.

:class:`TalkerStage` turns the scheduler's talker rows into the runner's talker work and the sampled codes into each
reply's :class:`~pipeline.core.response_state.TalkerState` and token2wav stream. A talker's inputs are the thinker's
vectors of
the reply tokens, then the text-eos vector once, then text-pad; it never runs ahead of the text. While a conversation
is idle, its talker cache follows its thinker cache (``listen``), so a reply's talker prefill covers only what the
turn added. A response's failure is isolated (``fail``); the others go on. Engine thread only.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import torch

from pipeline.core.conversation_state import ConversationState
from pipeline.core.response_state import ResponseState, TalkerStatus
from pipeline.runners.model_runner import ModelRunner
from pipeline.scheduler.plan import TalkerStart
from pipeline.step.talker_feed import TalkerFeed

__all__ = ["TalkerStage"]

log = logging.getLogger("pipeline.core.engine_core")


class TalkerStage(TalkerFeed):
    def __init__(
        self,
        *,
        min_codes: int,
        runner: ModelRunner,
        observer,
        family,
        ckpt,
        synthesizer,
        special,
        text_end_vectors: tuple[torch.Tensor, torch.Tensor],
        to_token2wav,
        codec_stop: tuple[int, ...],
        max_codes: int,
        generator: Callable[[], torch.Generator | None],
        fail: Callable[[ResponseState, Exception], None],
    ) -> None:
        super().__init__(min_codes=min_codes, observer=observer, text_end_vectors=text_end_vectors, fail=fail)
        self.runner = runner
        self.family = family
        self.ckpt = ckpt
        self.synthesizer = synthesizer
        """The family's streaming token2wav: each reply's stream is opened on it when its talker starts."""
        self.special = special
        self.to_token2wav = to_token2wav
        self.codec_stop = codec_stop
        self.max_codes = max_codes
        self.generator = generator
        """The noise generator of a new stream (None: the synthesizer's own)."""

    def listen(self, conv: ConversationState, slot: int) -> None:
        """While a conversation is idle, bring its talker cache up to its thinker cache (the talker's prompt is the
        thinker's vectors of the same positions), so that a reply's talker prefill at the end of the turn covers only
        the turn's last chunk, the speaker's bos and the first reply vector. Into the talker slot the plan gave it
        (:class:`~pipeline.scheduler.plan.TalkerListen`). A failure is logged and leaves the talker cache as it was:
        the reply's own prefill then covers the rest."""
        if conv.active_response is not None or not conv.cached_keys:
            return
        keys = conv.cached_keys
        start = conv.common_prefix_of(conv.talker_keys, keys)
        if start == len(keys):
            return
        conv.crop_talker(start)
        try:
            self.runner.talker_prompt_prefill(conv, start, slot=slot)
        except Exception:  # noqa: BLE001 - a background failure must not stop the engine thread
            log.exception("background talker prefill of %s failed; its talker cache is dropped", conv.id)
            return
        conv.talker_keys = list(keys)

    def start(self, r: ResponseState, plan: TalkerStart) -> None:
        """Talker prefill — the prompt positions not already in the conversation's talker slot (kept across turns),
        then the speaker's bos and the first reply vector — its first code, and the reply's token2wav stream (with the
        quick first chunk if the plan says so)."""
        conv = r.conv
        prompt_keys = conv.cached_keys[: r.thinker.prompt_len]
        reuse = conv.common_prefix_of(conv.talker_keys, prompt_keys)
        conv.crop_talker(reuse)
        conv.talker_keys = list(prompt_keys)
        r.talker.status = TalkerStatus.RUNNING
        r.talker.length = r.thinker.prompt_len + 2
        r.talker.rope_shift = conv.rope_shift  # set by the prompt's last prefill chunk; the reply's text shares it
        seen = {self.special.codec_pad, self.special.codec_bos}
        if r.thinker.prompt_len:
            seen.add(self.special.codec_mask)
        self.runner.talker.sampler.reset(plan.slot, seen)
        r.audio.stream = self.family.start_stream(
            self.synthesizer,
            self.ckpt,
            r.spec.spoken_voice,
            generator=self.generator(),
            max_codes=self.max_codes,
            quick=plan.quick,
        )
        logits = self.runner.talker_prefill(
            r,
            reuse=reuse,
            speaker_bos=self.family.voice_bos(self.ckpt, r.spec.spoken_voice),
            codec={"pad": self.special.codec_pad, "bos": self.special.codec_bos},
        )
        (code,) = self.runner.talker.sampler.sample(
            logits.unsqueeze(0),
            [plan.slot],
            force_continue=[self.force_codes(r)],
            seeds=[r.seed],
            counters=[r.codec_tokens],
        )
        self.accept_code(r, code)

    def decode(self, rows: list[tuple[ResponseState, torch.Tensor]], *, steps: int):
        """One code for every row in one batched step, or a chain of ``steps`` steps (the plan's ``chain_steps``).
        Returns the batches and their codes, not read yet."""
        return self.runner.talker_decode(
            rows, steps=steps, force=self.force_codes, chains=lambda: self.observer.count("talker_chains_total")
        )

    def accept_code(self, r: ResponseState, code: int) -> None:
        if r.talker.done:
            return  # a chained step after the reply's last code: its code means nothing
        self.observer.count("talker_tokens_total")
        dit_code = self.to_token2wav(code, self.codec_stop)
        if dit_code is None:
            self.end(r)
            return
        r.talker.codes.append(code)
        if len(r.talker.codes) == 1:
            self.observer.milestone(r.id, "first_code")
        r.mark("talker_first_code_ms")
        r.talker.last_code = code
        r.audio.live_stream().push([dit_code])
        if r.codec_tokens >= self.max_codes:
            self.end(r)
