"""The talker stage of a step for a frame talker (several codebooks per step, see :mod:`pipeline.models.frame_talker`):
starting each reply's talker, feeding it, decoding its frames and accepting them.

Same duties and interface as :class:`~pipeline.step.talker_stage.TalkerStage`, for a talker that reads only some of
the conversation's positions (its prompt keys are a subsequence of the thinker's cached keys, kept in the
conversation's talker slot across turns) and makes one frame per step (or a chain of frames, fed on the device, while
the talker is the engine's only work). A talker's inputs are the thinker's vectors of the reply tokens from the second
on (the first is part of its prefill), then the text-end vector once, then text-pad; it never runs ahead of the text. A
response's failure is isolated (``fail``). Engine thread only.

Positions: the talker's sequence is its own (the positions it reads, then each reply's opening and frames), and its
rope positions are the family's :class:`~pipeline.models.positions.PositionScheme` over that sequence: the thinker's
explicit-position spans of the positions it reads (pictures, video) placed at their talker indices
(:func:`subsequence_spans`), text and audio advancing by one. A reply's opening and frames run at their cache index
plus the rope shift after its prompt (0 without pictures or video).
"""

from __future__ import annotations

import bisect
import logging
from collections.abc import Callable, Sequence

import numpy as np
import torch

from pipeline.core.conversation_state import ConversationState
from pipeline.core.response_state import ResponseState, TalkerCode, TalkerStatus
from pipeline.kernels.cuda_graphs import host_to_device
from pipeline.models.positions import GridSpan, PositionScheme
from pipeline.runners.frame_talker import FrameTalkerRunner
from pipeline.runners.model_runner import Sampled
from pipeline.runners.sampling import SampleRows
from pipeline.scheduler.plan import TalkerStart
from pipeline.step.talker_feed import TalkerFeed

__all__ = ["FrameTalkerStage", "subsequence_spans"]

log = logging.getLogger("pipeline.core.engine_core")


def subsequence_spans(spans: Sequence[GridSpan], picked: Sequence[int], length: int) -> list[GridSpan]:
    """``spans`` of a rendering's first ``length`` positions placed on the subsequence ``picked`` of those positions
    (increasing indices): a span whose positions (those before ``length``) are all picked starts at the index of its
    first one in ``picked``, with the same offsets and advance; a span none of whose positions is picked is left out.
    ValueError for a span only partly picked (no layout of the subsequence would place it)."""
    out = []
    for span in spans:
        if span.at >= length:
            continue
        n = min(span.length, length - span.at)
        j = bisect.bisect_left(picked, span.at)
        if j < len(picked) and picked[j] == span.at:
            if list(picked[j : j + n]) != list(range(span.at, span.at + n)):
                raise ValueError(f"the explicit-position span at {span.at} is only partly read by the talker")
            out.append(GridSpan(at=j, offsets=span.offsets, advance=span.advance))
        elif j < len(picked) and picked[j] < span.at + n:
            raise ValueError(f"the explicit-position span at {span.at} is only partly read by the talker")
    return out


def _frame(code: TalkerCode | None) -> tuple[int, ...]:
    """A frame talker's last frame (set by its start's first frame before any decode step)."""
    if not isinstance(code, tuple):
        raise TypeError(f"a frame talker's last code is a frame, not {code!r}")
    return code


class FrameTalkerStage(TalkerFeed):
    def __init__(
        self,
        *,
        min_codes: int,
        talker: FrameTalkerRunner,
        observer,
        family,
        ckpt,
        synthesizer,
        text_end_vectors: tuple[torch.Tensor, torch.Tensor],
        codec_stop: tuple[int, ...],
        max_codes: int,
        generator: Callable[[], torch.Generator | None],
        fail: Callable[[ResponseState, Exception], None],
        positions: PositionScheme,
    ) -> None:
        """``positions``: the family's rotary positions, which the talker's sequence follows (module docstring)."""
        super().__init__(min_codes=min_codes, observer=observer, text_end_vectors=text_end_vectors, fail=fail)
        self.positions = positions
        self.talker = talker
        self.parts = talker.parts
        self.family = family
        self.ckpt = ckpt
        self.synthesizer = synthesizer
        """The family's streaming code2wav: each reply's stream is opened on it when its talker starts."""
        self.codec_stop = frozenset(codec_stop)
        self.max_codes = max_codes
        """Frames a reply may have."""
        self.generator = generator

    def prompt_keys(self, keys: list) -> tuple[list[int], list]:
        """The positions of ``keys`` the talker reads, and their keys."""
        picked = self.parts.prompt_positions(keys)
        return picked, [keys[i] for i in picked]

    def prompt_rope(self, conv: ConversationState, picked: list[int], length: int, start: int) -> np.ndarray | None:
        """(3, len(picked) - start) rope positions of the talker's prompt positions ``start ..`` (``picked``: the
        thinker positions before ``length`` it reads); None when they equal the cache indices."""
        spans = subsequence_spans(conv.cached_spans, picked, length)
        return self.positions.rope_positions(len(picked), spans, start=start)

    def listen(self, conv: ConversationState, slot: int) -> None:
        """While a conversation is idle, bring its talker cache up to what the talker reads of its thinker cache, so
        that a reply's talker prefill covers only the turn's last positions and the reply's opening. Into the talker
        slot the plan gave it (:class:`~pipeline.scheduler.plan.TalkerListen`: only when there is something new to
        read). A failure is logged and leaves the talker cache as it was: the reply's own prefill then covers the
        rest."""
        if conv.active_response is not None or not conv.cached_keys:
            return
        picked, keys = self.prompt_keys(conv.cached_keys)
        start = conv.common_prefix_of(conv.talker_keys, keys)
        if start == len(keys):
            return
        conv.crop_talker(start)
        try:
            inputs = self._prompt_inputs(conv, picked[start:], keys[start:])
            rope = self.prompt_rope(conv, picked, len(conv.cached_keys), start)
            self.talker.prefill_prompt(inputs, slot=slot, start=start, rope=rope)
        except Exception:  # noqa: BLE001 - a background failure must not stop the engine thread
            log.exception("background talker prefill of %s failed; its talker cache is dropped", conv.id)
            return
        conv.talker_keys = list(keys)

    def _prompt_inputs(self, conv: ConversationState, picked: list[int], keys: list) -> torch.Tensor:
        vectors = conv.talker_prompt()
        index = host_to_device(picked, torch.long, vectors.device)  # queued: no wait for the device
        return self.parts.prompt_inputs(vectors.index_select(0, index), keys)

    def start(self, r: ResponseState, plan: TalkerStart) -> None:
        """Talker prefill — the prompt positions the talker reads that its slot does not hold yet (kept across turns),
        then the reply's opening with the first reply vector — its first frame, and the reply's code2wav stream (with
        the quick first chunk if the plan says so)."""
        conv = r.conv
        end = r.thinker.prompt_len
        picked, keys = self.prompt_keys(conv.cached_keys[:end])
        spans = subsequence_spans(conv.cached_spans, picked, end)
        shift = self.positions.rope_shift(spans, len(keys))
        reuse = conv.common_prefix_of(conv.talker_keys, keys)
        conv.crop_talker(reuse)
        conv.talker_keys = list(keys)
        prompt = self._prompt_inputs(conv, picked[reuse:], keys[reuse:])
        opening = self.parts.reply_start(r.talker.queue.popleft(), r.spec.spoken_voice)
        inputs = torch.cat([prompt.to(opening.device, opening.dtype), opening])
        rope = self.positions.rope_positions(len(keys), spans, start=reuse)
        if rope is not None or shift:  # the prompt at its own positions, the opening at the reply's shift
            head = rope if rope is not None else np.tile(np.arange(reuse, len(keys)), (3, 1))
            after = np.arange(len(keys), len(keys) + opening.shape[0]) + shift
            rope = np.concatenate([head, np.tile(after, (3, 1))], axis=1)
        r.talker.status = TalkerStatus.RUNNING
        r.talker.length = len(keys) + opening.shape[0]
        r.talker.rope_shift = shift
        self.talker.sampler.reset(plan.slot, set())
        r.audio.stream = self.family.start_stream(
            self.synthesizer,
            self.ckpt,
            r.spec.spoken_voice,
            generator=self.generator(),
            max_codes=self.max_codes,
            quick=plan.quick,
        )
        frame = self.talker.start(inputs, slot=plan.slot, start=reuse, sample=self._sample_rows([r]), rope=rope)
        self.accept_code(r, frame.tolist())

    def _sample_rows(self, rows: list[ResponseState]) -> SampleRows:
        return SampleRows.of(
            [r.conv.held_talker_slot() for r in rows],
            force_continue=[self.force_codes(r) for r in rows],
            seeds=[r.seed for r in rows],
            counters=[r.codec_tokens for r in rows],
        )

    def decode(self, rows: list[tuple[ResponseState, torch.Tensor]], *, steps: int) -> list[Sampled]:
        """One frame for every row in one batched step, or a chain of ``steps`` frames (the plan's ``chain_steps``; its
        rows are all past their text). A batch that raises is retried row by row, so only a faulty response fails.
        Returns each batch with its frames as a (steps, B, groups) device tensor, not read yet."""
        if not rows:
            return []
        try:
            return [self._decode([r for r, _ in rows], [v for _, v in rows], steps)]
        except Exception:  # noqa: BLE001 - find the faulty row by retrying one by one
            if len(rows) == 1:
                self.fail(rows[0][0], RuntimeError("the talker step failed"))
                log.exception("talker step of %s failed", rows[0][0].id)
                return []
            log.exception("batched talker step of %d rows failed; retrying each alone", len(rows))
        sampled = []
        for r, vector in rows:
            try:
                sampled.append(self._decode([r], [vector], steps))
            except Exception as exc:  # noqa: BLE001 - isolate this response's failure
                self.fail(r, exc)
        return sampled

    def _decode(self, rows: list[ResponseState], vectors: list[torch.Tensor], steps: int) -> Sampled:
        inputs = (
            [_frame(r.talker.last_code) for r in rows],
            torch.stack(vectors),
            [r.conv.held_talker_slot() for r in rows],
            [r.talker.length for r in rows],
            self._sample_rows(rows),
        )
        shifts = [r.talker.rope_shift for r in rows]
        if steps > 1:
            out = self.talker.decode_chain(*inputs, steps=steps, rope_shifts=shifts)
            self.observer.count("talker_chains_total")
        else:
            out = self.talker.decode(*inputs, rope_shifts=shifts).unsqueeze(0)
        for r in rows:
            r.talker.length += steps
        return rows, out

    def accept_code(self, r: ResponseState, frame: list[int]) -> None:
        """Take one frame: a stop code in codebook 0 ends the utterance; otherwise the frame goes to the stream."""
        if r.talker.done:
            return
        self.observer.count("talker_tokens_total")
        if frame[0] in self.codec_stop:
            self.end(r)
            return
        r.talker.codes.append(tuple(frame))
        if len(r.talker.codes) == 1:
            self.observer.milestone(r.id, "first_code")
        r.mark("talker_first_code_ms")
        r.talker.last_code = tuple(frame)
        r.audio.live_stream().push([frame])
        if r.codec_tokens >= self.max_codes:
            self.end(r)
