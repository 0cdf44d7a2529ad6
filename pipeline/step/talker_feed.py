"""What both talker stages share (:class:`~pipeline.step.talker_stage.TalkerStage`, one code a step, and
:class:`~pipeline.step.frame_talker_stage.FrameTalkerStage`, one frame a step): which input each reply's talker takes
next, and how a reply's talker ends.

A talker's inputs are the thinker's vectors of the reply tokens (queued by the thinker's decode), then the text-end
vector once, then the text-pad vector for as long as it speaks; it never runs ahead of the text. A talker not started
is started by the stage (its prefill and first code) when the step's plan lists it
(:class:`~pipeline.scheduler.plan.TalkerStart`: its slot is assigned). Engine thread only.
"""

from __future__ import annotations

import abc
from collections.abc import Callable

import torch

from pipeline.core.response_state import ResponseState, TalkerStatus
from pipeline.scheduler.plan import TalkerStart

__all__ = ["TalkerFeed"]


class TalkerFeed(abc.ABC):
    """The feeding and ending of replies' talkers; a stage implements :meth:`start`."""

    def __init__(
        self,
        *,
        min_codes: int,
        observer,
        text_end_vectors: tuple[torch.Tensor, torch.Tensor],
        fail: Callable[[ResponseState, Exception], None],
    ) -> None:
        self.min_codes = min_codes
        """Codes before which a reply's stop code is suppressed."""
        self.observer = observer
        self.text_end_vectors = text_end_vectors
        """(text-end, text-pad) thinker vectors: two fixed tensors, so text-pad is recognised by identity (chains)."""
        self.fail = fail

    @abc.abstractmethod
    def start(self, r: ResponseState, plan: TalkerStart) -> None:
        """Prefill the reply's talker into the slot the plan assigned and take its first code."""

    def force_codes(self, r: ResponseState) -> bool:
        return r.codec_tokens < self.min_codes

    def inputs(
        self, rows: list[ResponseState], starts: dict[str, TalkerStart]
    ) -> list[tuple[ResponseState, torch.Tensor]]:
        """Each row's talker work this step: a talker the plan starts (``starts``, by response id) is started here
        (prefill and first code, one at a time: prompt lengths differ); the others yield (row, next input vector) for
        the batched decode, or nothing while they wait for the thinker."""
        batch = []
        for r in rows:
            try:
                vector = self.next_input(r, starts)
            except Exception as exc:  # noqa: BLE001 - isolate one response's failure from the others
                self.fail(r, exc)
                continue
            if vector is not None:
                batch.append((r, vector))
        return batch

    def next_input(self, r: ResponseState, starts: dict[str, TalkerStart]) -> torch.Tensor | None:
        """Start the talker (prefill and first code) if the plan says so, or return the input vector of its next
        decode step: reply vectors, then text-end once, then text-pad. The talker never runs ahead of the text."""
        talker = r.talker
        if talker.done:
            return None
        if talker.started:
            if talker.queue:
                return talker.queue.popleft()
            if not r.thinker.done and not r.thinker.silent:
                return None
            vector = self.text_end_vectors[1 if talker.eos_sent else 0]
            talker.eos_sent = True
            return vector
        if not talker.queue:
            if r.thinker.done or r.thinker.silent:  # the reply had no token the talker could start from
                self.end(r)
            return None
        start = starts.get(r.id)
        if start is not None:  # else it waits: the step's budget or every talker slot is taken
            self.start(r, start)
        return None

    def end(self, r: ResponseState) -> None:
        r.talker.status = TalkerStatus.DONE
        self.observer.milestone(r.id, "codes_done")
        r.talker.length = 0  # the reply's positions lie past the prompt in the slot: the next prefill overwrites them
        if r.audio.stream is not None:
            r.audio.stream.finish()
