"""The phases of one engine step: they execute the scheduler's plan and accept what it sampled.

:meth:`StepPhases.execute` runs a :class:`~pipeline.scheduler.plan.StepPlan` in the order its contract gives — prefill
chunks (and the first tokens of the prompts they completed), the talker listens, one batched thinker decode beside the
talker's step (its planned starts, then one decode or a chain), then one token2wav job picked by the plan's rule among
the streams whose next chunk is ready — hands each sampled id to the output side or the talker stage, and returns a
:class:`~pipeline.scheduler.plan.StepOutput`. Nothing is decided here that the plan decided, and no response ends here:
a response that fails is recorded in the output (the rest of the step skips it) and ended by the update. An engine
without a talker (``talker_stage`` None) runs the thinker's phases only. Engine thread only.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import cast

from pipeline.core.response_state import ResponseState
from pipeline.observe.observer import EngineObserver
from pipeline.output.processor import OutputProcessor
from pipeline.response_events import ResponseStatus
from pipeline.runners.image_encodes import ImageEncodes
from pipeline.runners.model_runner import AudioJob, ModelRunner, Sampled
from pipeline.scheduler.plan import StepOutput, StepPlan
from pipeline.scheduler.prefill_batch import PrefillJob
from pipeline.scheduler.scheduler import Scheduler
from pipeline.scheduler.token2wav_jobs import ChunkCandidate
from pipeline.step.frame_talker_stage import FrameTalkerStage
from pipeline.step.talker_stage import TalkerStage

__all__ = ["StepPhases", "chunk_candidates"]

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
        fail_now: Callable[[ResponseState, Exception], None],
        clock: Callable[[], float] | None = None,
    ) -> None:
        """``fail_now``: ends a response ``failed`` at once (a failure outside a step: collecting the worker's
        chunks). ``clock``: the engine's clock in seconds, on which the players' times and the responses' starts are
        kept, read when the step's streams are found ready and when its token2wav job is picked (None:
        ``time.perf_counter``, looked up at each call)."""
        self.clock: Callable[[], float] = clock if clock is not None else _perf_counter
        self.scheduler = scheduler
        self.runner = runner
        self.image_encodes = image_encodes
        self.output = output
        self.talker_stage = talker_stage
        """None: the engine has no talker (its responses are never spoken)."""
        self.observer = observer
        self.fail_now = fail_now
        self._out: StepOutput | None = None
        """The output of the plan being executed (None between steps)."""

    def encode(self) -> int:
        """Run the audio and picture encodes the requests queued, every conversation's in one call each. Returns
        how many blocks and pictures were encoded."""
        encoded = self.runner.audio_encodes.flush()
        return encoded + (self.image_encodes.flush() if self.image_encodes is not None else 0)

    def in_worker(self) -> frozenset[str]:
        """The ids of the responses whose stream the token2wav worker holds now."""
        return frozenset(r.id for r in self.runner.jobs.values())

    def live(self, r: ResponseState) -> bool:
        """Whether ``r`` still runs: live in the scheduler and not failed in the step being executed."""
        return r.id in self.scheduler.responses and (self._out is None or r.id not in self._out.failures)

    def fail(self, r: ResponseState, exc: Exception) -> None:
        """A response failed: while a plan runs, recorded in its output (the rest of the step skips it, the update
        ends it); between steps, ended at once."""
        if self._out is not None:
            self._out.fail(r.id, exc)
        elif r.id in self.scheduler.responses:
            self.fail_now(r, exc)

    def _rows(self, ids: list[str]) -> list[ResponseState]:
        responses = self.scheduler.responses
        return [responses[rid] for rid in ids]

    # -- the plan -----------------------------------------------------------------------------------
    def execute(self, plan: StepPlan) -> StepOutput:
        """Run ``plan`` in the order its contract gives (:mod:`pipeline.scheduler.plan`) and return what it made. A
        response that fails meanwhile is recorded and skipped; no response ends here."""
        out = self._out = StepOutput()
        try:
            self.prefill(plan)
            self.decode(plan)
            self.synthesize(plan, self.ready_streams(plan.decoding))
            out.in_worker = set(self.in_worker())
        finally:
            self._out = None
        return out

    # -- prefill ------------------------------------------------------------------------------------
    def prefill(self, plan: StepPlan) -> None:
        """Run the plan's prefill chunks; responses whose prompt is complete sample their first tokens together;
        conversations still being spoken bring their talker cache up to their thinker cache."""
        self.runner.reset_samplers(plan.sampler_resets)
        convs = self.scheduler.conversations
        ran, failed = self.runner.run_prefills(plan.prefills, convs)
        for job, exc in failed:
            self._prefill_failed(job, exc)
        started, listening = [], []
        listens = {listen.conv_id: listen.slot for listen in plan.talker_listens}
        for job, out in ran:
            if job.response_id is None:
                convs[job.conv_id].dirty = not job.last
                if job.conv_id in listens:
                    listening.append((convs[job.conv_id], listens[job.conv_id]))
                continue
            owner = self.scheduler.responses[job.response_id]
            if job.last and self.live(owner):
                assert out.last_logits is not None, "a prompt's last chunk has the logits of its last position"
                owner.advance(ResponseStatus.DECODING)
                owner.mark("prefill_done_ms")
                started.append((owner, out.last_logits))
        if started:
            rows = [r for r, _ in started]
            tokens = self.runner.sample_first(
                rows, [logits for _, logits in started], force=[self._force_text(r) for r in rows]
            )
            self._accept_each(rows, tokens, self._accept_text)
        if self.talker_stage is not None:
            for conv, slot in listening:
                self.talker_stage.listen(conv, slot)

    def _prefill_failed(self, job: PrefillJob, exc: Exception) -> None:
        if job.response_id is None:
            log.error("background prefill of %s failed; its cache is dropped", job.conv_id, exc_info=exc)
            conv = self.scheduler.conversations[job.conv_id]
            conv.free()
            conv.dirty = False
        else:
            owner = self.scheduler.responses[job.response_id]
            if self.live(owner):
                self.fail(owner, exc)

    # -- decode -------------------------------------------------------------------------------------
    def decode(self, plan: StepPlan) -> None:
        """One batched thinker decode and the talker's step; both stages are queued before either's ids are read (the
        talker needs the thinker's vectors, device tensors, not its new tokens). With overlap the talker decodes
        beside the thinker on the vectors of earlier steps (one thinker step behind the text); its starts follow the
        thinker on the engine's stream. Without a talker, the thinker's decode alone."""
        if plan.decoding:
            self.observer.count("decode_steps_total")
        thinker_rows = self._rows(plan.thinker_rows)
        talker = self.talker_stage
        if talker is None:
            tokens = self.runner.thinker_decode(thinker_rows, force=self._force_text)
            self._accept_sampled(tokens, self._accept_text)
            return
        talker_rows = self._rows(plan.talker_rows)
        starts = {start.response_id: start for start in plan.talker_starts}
        if self.runner.overlap:
            batch = talker.inputs([r for r in talker_rows if r.talker.started], starts)
            codes, join = (
                self.runner.beside_thinker(lambda: talker.decode(batch, steps=plan.chain_steps))
                if batch
                else ([], lambda: None)
            )
            tokens = self.runner.thinker_decode(thinker_rows, force=self._force_text)
            talker.inputs([r for r in talker_rows if not r.talker.started and self.live(r)], starts)
            join()
        else:
            tokens = self.runner.thinker_decode(thinker_rows, force=self._force_text)
            batch = talker.inputs([r for r in talker_rows if self.live(r)], starts)
            codes = talker.decode(batch, steps=plan.chain_steps)
        self._accept_sampled(tokens, self._accept_text)
        self._accept_sampled(codes, self._accept_code)
        for r in self._rows(plan.decoding):
            if r.status is ResponseStatus.DECODING and r.spec.audio and r.tokens_done() and self.live(r):
                r.advance(ResponseStatus.SYNTHESIZING)

    def _force_text(self, r: ResponseState) -> bool:
        return len(r.item.reply_ids) < self.scheduler.cfg.min_text_tokens

    def _accept_text(self, r: ResponseState, token: int) -> None:
        self.output.accept_text_token(r, token)
        if self._out is not None:
            self._out.tokens.append((r.id, token))

    def _accept_code(self, r: ResponseState, code) -> None:
        talker = self.talker_stage
        if talker is None:
            raise RuntimeError("a code was sampled in an engine without a talker")
        talker.accept_code(r, code)
        if self._out is not None:
            self._out.codes.append((r.id, code))

    def _accept_sampled(self, sampled: list[Sampled], accept: Callable[[ResponseState, int], None]) -> None:
        """Read each batch's sampled ids (one host transfer per batch) and ``accept(row, id)`` them, in row order; a
        chain's (steps, rows) ids step by step; a frame talker's (steps, rows, groups) frames as one list per row."""
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
    def ready_streams(self, decoding: list[str]) -> list[ResponseState]:
        """The live responses whose stream has the codes (look-ahead included) of its next chunk and is not in the
        worker; their players note that the chunk could be made now."""
        ready = [
            r
            for r in self._rows(decoding)
            if self.live(r) and r.audio.stream is not None and not self.runner.in_worker(r) and r.audio.stream.ready()
        ]
        now = self.clock()
        for r in ready:
            r.audio.playout.chunk_ready(now)
            if r.audio.first_made_at is None:
                r.mark("talker_first_chunk_ms")  # its codes are in; its job may still wait for the worker
        if self._out is not None:
            self._out.ready = [r.id for r in ready]
        return ready

    def synthesize(self, plan: StepPlan, ready: list[ResponseState]) -> None:
        """One token2wav job, picked by the plan's rule among the ready streams (in start order) at the clock's time:
        handed to the worker if it is idle, or made here without one. None when no stream is due: they wait for a
        later step."""
        if not ready or not self.runner.worker_idle():
            return
        picked = plan.audio.pick(chunk_candidates(ready, self.clock()))
        job = AudioJob([ready[cast(int, i)] for i in picked.keys], picked.urgent) if picked else None
        if job is None:
            return
        if self._out is not None:
            self._out.audio_job = tuple(r.id for r in job.rows)
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
        self.scheduler.record_job(urgent, (time.perf_counter() - started) * 1000)  # the runner's clock
        self.observer.job(started, streams=streams, first=urgent)


def _perf_counter() -> float:
    return time.perf_counter()  # looked up at each call: a test that moves time.perf_counter moves this clock too


def chunk_candidates(ready: list[ResponseState], now: float) -> list[ChunkCandidate]:
    """The token2wav job's candidates among the responses whose next chunk is ready, given in the order they started
    (keys and ``arrival``: their index in ``ready``): each with the time from ``now`` (engine clock seconds) to its
    playout deadline (:meth:`pipeline.output.playout.Playout.deadline`): the audio its real-time player has ahead, or,
    before its audio started (a first chunk, or a first audio the start buffer holds), the time until its first
    audio is wanted."""
    return [
        ChunkCandidate(
            i,
            first=r.audio.first_made_at is None,
            audio_ahead_ms=(r.audio.playout.deadline(now) - now) * 1000.0,
            arrival=i,
        )
        for i, r in enumerate(ready)
    ]
