"""The phases of one engine step that run the scheduler's plan and accept what it sampled.

:class:`StepPhases` runs a :class:`~pipeline.scheduler.plan.StepPlan` in the order its contract gives — prefill
chunks (and the first tokens of the prompts they completed), one batched thinker decode beside the talker's step,
then one token2wav job of the streams whose next chunk is ready — and hands each sampled id to the output side or the
talker stage. A row whose response ended meanwhile is skipped; one response's failure ends only that response
(``fail``). An engine without a talker (``talker_stage`` None) runs the thinker's phases only. Engine thread only.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from pipeline.core.response_state import ResponseState
from pipeline.observe.observer import EngineObserver
from pipeline.output.processor import OutputProcessor
from pipeline.response_events import ResponseStatus
from pipeline.runners.image_encodes import ImageEncodes
from pipeline.runners.model_runner import ModelRunner, Sampled
from pipeline.scheduler.plan import StepPlan
from pipeline.scheduler.prefill_batch import PrefillJob
from pipeline.scheduler.scheduler import Scheduler
from pipeline.step.frame_talker_stage import FrameTalkerStage
from pipeline.step.talker_stage import TalkerStage

__all__ = ["StepPhases"]

log = logging.getLogger("pipeline.core.engine_core")


class StepPhases:
    def __init__(
        self,
        *,
        scheduler: Scheduler,
        runner: ModelRunner,
        image_encodes: ImageEncodes | None,
        output: OutputProcessor,
        talker_stage: TalkerStage | FrameTalkerStage | None,
        observer: EngineObserver,
        fail: Callable[[ResponseState, Exception], None],
    ) -> None:
        self.scheduler = scheduler
        self.runner = runner
        self.image_encodes = image_encodes
        self.output = output
        self.talker_stage = talker_stage
        """None: the engine has no talker (its responses are never spoken)."""
        self.observer = observer
        self.fail = fail

    def encode(self) -> int:
        """Run the audio and picture encodes the requests queued, every conversation's in one call each. Returns
        how many blocks and pictures were encoded."""
        encoded = self.runner.audio_encodes.flush()
        return encoded + (self.image_encodes.flush() if self.image_encodes is not None else 0)

    def in_worker(self) -> set[str]:
        """The ids of the responses whose stream the token2wav worker holds now."""
        return {r.id for r in self.runner.jobs.values()}

    def live(self, r: ResponseState) -> bool:
        return r.id in self.scheduler.responses

    # -- prefill ------------------------------------------------------------------------------------
    def prefill(self, plan: StepPlan) -> None:
        """Run the plan's prefill chunks; responses whose prompt is complete sample their first tokens together;
        conversations still being spoken bring their talker cache up to their thinker cache."""
        self.runner.reset_samplers(plan.sampler_resets)
        ran, failed = self.runner.run_prefills(plan.prefills)
        for job, exc in failed:
            self._prefill_failed(job, exc)
        started, listening = [], []
        for job, out in ran:
            if job.owner is None:
                job.conv.dirty = not job.last
                listening.append(job.conv)
            elif job.last and self.live(job.owner):
                job.owner.advance(ResponseStatus.DECODING)
                job.owner.mark("prefill_done_ms")
                started.append((job.owner, out.last_logits))
        if started:
            rows = [r for r, _ in started]
            tokens = self.runner.sample_first(
                rows, [logits for _, logits in started], force=[self._force_text(r) for r in rows]
            )
            self._accept_each(rows, tokens, self.output.accept_text_token)
        if self.talker_stage is not None:
            for conv in listening:
                self.talker_stage.listen(conv)

    def _prefill_failed(self, job: PrefillJob, exc: Exception) -> None:
        if job.owner is None:
            log.error("background prefill of %s failed; its cache is dropped", job.conv.id, exc_info=exc)
            job.conv.free()
            job.conv.dirty = False
        elif self.live(job.owner):
            self.fail(job.owner, exc)

    # -- decode -------------------------------------------------------------------------------------
    def decode(self, plan: StepPlan) -> None:
        """One batched thinker decode and the talker's step; both stages are queued before either's ids are read (the
        talker needs the thinker's vectors, device tensors, not its new tokens). With overlap the talker decodes
        beside the thinker on the vectors of earlier steps (one thinker step behind the text); its prefills follow
        the thinker on the engine's stream. Without a talker, the thinker's decode alone."""
        if plan.decoding:
            self.observer.count("decode_steps_total")
        talker = self.talker_stage
        if talker is None:
            tokens = self.runner.thinker_decode(plan.thinker_rows, force=self._force_text)
            self._accept_sampled(tokens, self.output.accept_text_token)
            return
        talker.prefills_left = plan.talker_prefills
        alone = not plan.thinker_rows
        if self.runner.overlap:
            talker_rows = talker.inputs([r for r in plan.talker_rows if r.talker.started])
            codes, join = (
                self.runner.beside_thinker(lambda: talker.decode(talker_rows, plan, alone=alone))
                if talker_rows
                else ([], lambda: None)
            )
            tokens = self.runner.thinker_decode(plan.thinker_rows, force=self._force_text)
            talker.inputs([r for r in plan.talker_rows if not r.talker.started and self.live(r)])
            join()
        else:
            tokens = self.runner.thinker_decode(plan.thinker_rows, force=self._force_text)
            talker_rows = talker.inputs([r for r in plan.talker_rows if self.live(r)])
            codes = talker.decode(talker_rows, plan, alone=alone)
        self._accept_sampled(tokens, self.output.accept_text_token)
        self._accept_sampled(codes, talker.accept_code)
        for r in plan.decoding:
            if r.status is ResponseStatus.DECODING and r.spec.audio and r.tokens_done() and self.live(r):
                r.advance(ResponseStatus.SYNTHESIZING)

    def _force_text(self, r: ResponseState) -> bool:
        return len(r.item.reply_ids) < self.scheduler.cfg.min_text_tokens

    def _accept_sampled(self, sampled: list[Sampled], accept: Callable[[ResponseState, int], None]) -> None:
        """Read each batch's sampled ids (one host transfer per batch) and ``accept(row, id)`` them, in row order; a
        chain's (steps, rows) ids step by step; a frame talker's (1, rows, groups) frames as one list per row."""
        for batch, tokens in sampled:
            values = tokens.tolist()
            for step in values if tokens.dim() >= 2 else [values]:
                self._accept_each(batch, step, accept)

    def _accept_each(
        self, rows: list[ResponseState], tokens: list[int], accept: Callable[[ResponseState, int], None]
    ) -> None:
        for r, token in zip(rows, tokens):
            if not self.live(r):
                continue
            try:
                accept(r, token)
            except Exception as exc:  # noqa: BLE001 - isolate one response's failure from the others
                self.fail(r, exc)

    # -- token2wav ----------------------------------------------------------------------------------
    def ready_streams(self, decoding: list[ResponseState]) -> list[ResponseState]:
        """The live responses whose stream has the codes (look-ahead included) of its next chunk and is not in the
        worker; their players note that the chunk could be made now."""
        ready = [
            r
            for r in decoding
            if self.live(r) and r.audio.stream is not None and not self.runner.in_worker(r) and r.audio.stream.ready()
        ]
        now = time.perf_counter()
        for r in ready:
            r.audio.playout.chunk_ready(now)
            if r.audio.first_made_at is None:
                r.mark("talker_first_chunk_ms")  # its codes are in; its job may still wait for the worker
        return ready

    def synthesize(self, ready: list[ResponseState]) -> None:
        """One token2wav job of the scheduler's choosing: handed to the worker if it is idle, or made here without
        one."""
        if not ready or not self.runner.worker_idle():
            return
        job = self.scheduler.audio_job(ready, time.perf_counter())
        if self.runner.worker is None:
            self.runner.synthesize(job, self.output.emit_audio, self.record_job)
        else:
            self.runner.submit_audio(job)

    def collect_audio(self) -> bool:
        """Emit what the token2wav worker finished (from the engine thread, so events stay in order)."""
        return self.runner.collect_audio(self.output.emit_audio, self.record_job, self.live)

    def close_audio(self) -> None:
        """Stop the token2wav worker after its running job, emitting what it finished."""
        self.runner.close(self.output.emit_audio, self.record_job, self.live)

    def record_job(self, started: float, urgent: bool, streams: int) -> None:
        self.scheduler.recent_jobs.record(urgent, (time.perf_counter() - started) * 1000)
        self.observer.job(started, streams=streams, first=urgent)
