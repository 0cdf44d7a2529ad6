"""The engine core: synchronous, single-threaded, owns every model tensor.

Built like vLLM v1's engine core: :meth:`EngineCore.step` only delegates — the scheduler
(:class:`~pipeline.scheduler.scheduler.Scheduler`) decides the step as plain data
(:class:`~pipeline.scheduler.plan.StepPlan`), the runners (:class:`~pipeline.runners.model_runner.ModelRunner`) execute
it, the sampled tokens are accepted into each response's state, and the output side
(:class:`~pipeline.output.processor.OutputProcessor`) turns them into events; observation (counters, timeline, stall
watch) is :class:`~pipeline.observe.observer.EngineObserver`. Requests (:mod:`pipeline.requests`) run between two
steps through :meth:`EngineCore.handle`, so a cancel stops every stage of a response within one step.
"""

from __future__ import annotations

import logging
import secrets
import time
from collections.abc import Callable

import torch

from pipeline.config import StageGraphConfig
from pipeline.conversation_state import ConvItem, ItemKind
from pipeline.conversations import Conversations
from pipeline.errors import EngineFailure, FunctionCallError, PipelineError, ResponseActiveError
from pipeline.kernels.devices import concrete, device_scope, peer_access
from pipeline.models import family_of
from pipeline.models.family import Checkpoint, StreamStatus
from pipeline.observe.observer import EngineObserver
from pipeline.output.detokenizer import IncrementalDetokenizer
from pipeline.output.function_calls import function_calls
from pipeline.output.processor import OutputProcessor
from pipeline.outputs import EngineStats, ResponseStatus
from pipeline.request import ResponseSpec, ResponseState, TextEnd
from pipeline.requests import (
    AddAudio,
    AddContent,
    AddFunctionCall,
    AddFunctionOutput,
    AddText,
    AddVideoFrame,
    AppendAudio,
    CancelResponse,
    CloseConversation,
    CommitAudio,
    DeleteItem,
    DiscardAudio,
    EngineRequest,
    GetStats,
    HasWork,
    OpenConversation,
    SetContextPolicy,
    SetInstructions,
    SetTools,
    StartResponse,
    TruncateItem,
)
from pipeline.runners.audio_encodes import AudioEncodes
from pipeline.runners.image_encodes import ImageEncodes
from pipeline.runners.model_runner import ModelRunner, Sampled
from pipeline.runners.sampling import SamplerSpec
from pipeline.runners.talker import TalkerRunner
from pipeline.runners.thinker import ThinkerRunner
from pipeline.runners.token2wav_worker import Token2WavWorker
from pipeline.scheduler.plan import StepPlan
from pipeline.scheduler.prefill_batch import PrefillJob
from pipeline.scheduler.scheduler import Scheduler, SchedulerConfig
from pipeline.talker_stage import TalkerStage
from pipeline.tools import ToolMode
from pipeline.video_budget import VideoBudget

log = logging.getLogger(__name__)


class EngineCore:
    def __init__(self, ckpt: Checkpoint, cfg: StageGraphConfig, *, seed: int | None = None) -> None:
        """``ckpt``: a checkpoint of the family ``cfg.model_family`` names (:mod:`pipeline.models.family`), which is
        asked for everything model-specific."""
        self.ckpt = ckpt
        self.cfg = cfg
        self.family = family_of(cfg.model_family)
        self.special = self.family.special(ckpt)
        self.renderer = self.family.renderer(ckpt)
        th, ta, tw = cfg.thinker, cfg.talker, cfg.token2wav
        self.max_context = th.max_context_tokens or self.family.max_context(ckpt)
        self.max_codes = ta.max_tokens or 4096
        self.codec_stop = tuple(self.family.codec_stop_ids(ckpt))
        self.seed = seed
        self._seed_counter = 0
        self.observer = EngineObserver(cfg.engine.timeline_path, slow_step_ms=cfg.engine.slow_step_ms)
        thinker, talker, token2wav, worker = self._build_runners(ckpt, cfg)
        # capture the decode and prefill graphs now (seconds on a 7B model), not during the first replies; before the
        # scheduler is made: its prefill row budget is the largest captured prefill graph
        with device_scope(thinker.device):
            thinker.capture()
        talker.capture()
        self.token2wav = token2wav
        self.runner = ModelRunner(
            thinker=thinker,
            talker=talker,
            token2wav=token2wav,
            worker=worker,
            to_talker=self.family.connectors[ta.connector].fn,
            audio_encodes=AudioEncodes(
                thinker, width=thinker.text_model.config.hidden_size, dtype=thinker.dtype, device=thinker.device
            ),
            overlap=ta.overlap,
            fail=self._fail,
        )
        self._log_placement()
        self.image_encodes = (
            None
            if thinker.vision is None
            else ImageEncodes(
                thinker,
                merge=thinker.vision.merge_size,
                width=thinker.text_model.config.hidden_size,
                dtype=thinker.dtype,
                device=thinker.device,
            )
        )
        """Pictures queued by requests, encoded together at the start of each step (None: no vision tower)."""
        chunking = token2wav.cfg
        self.scheduler = Scheduler(
            SchedulerConfig(
                prefills_per_step=th.max_prefills_per_step,
                prefill_rows=thinker.prefill_rows,
                prefill_chunk_tokens=th.prefill_chunk_tokens,
                drop_oldest=th.context_policy == "drop_oldest",
                context_retention_ratio=th.context_retention_ratio,
                talker_prefills_per_step=ta.max_prefills_per_step,
                chain_steps=ta.chain_steps,
                min_text_tokens=th.min_tokens or 0,
                min_codes=ta.min_tokens or 0,
                max_codes=self.max_codes,
                t2w_max_batch=token2wav.max_batch,
                starving_margin_ms=tw.starving_margin_ms,
                starving_margin_from_jobs=tw.starving_margin_from_jobs,
                start_buffer_ms=tw.start_buffer_ms,
                start_buffer_busy=tw.start_buffer_busy or tw.max_batch,
                quick_first_chunk=chunking.quick_first_chunk_frames is not None,
                quick_first_chunk_max_open=chunking.quick_first_chunk_max_open,
                video_budget=VideoBudget(th.video_history_seconds, th.video_retention_ratio),
            ),
            thinker_slots=thinker.pool.slots,
            talker_slots=talker.pool.slots,
        )
        self.output = OutputProcessor(
            self.observer,
            text_stop={self.special.im_end, self.special.endoftext},
            start_buffer_ms=tw.start_buffer_ms,
            holds_start=lambda r: self.scheduler.holds_start(r.conv),
        )
        self.conversations = Conversations(
            self.scheduler,
            renderer=self.renderer,
            max_context=self.max_context,
            features=lambda: self.family.audio_features(ckpt),
            audio_encodes=self.runner.audio_encodes,
            image_encodes=self.image_encodes,
            preprocess=self.family.vision_preprocessor(ckpt),
            vision_info=self.family.vision_info(ckpt),
            av_timing=self.family.av_timing(ckpt),
            video_grace_s=th.video_frame_grace_seconds,
            exact_floor=th.audio_floor == "exact",
            end_response=lambda rid: self._end_cancelled(rid),
        )
        self.talker_stage = TalkerStage(
            scheduler=self.scheduler,
            runner=self.runner,
            observer=self.observer,
            family=self.family,
            ckpt=ckpt,
            synthesizer=token2wav,
            special=self.special,
            text_end_vectors=tuple(thinker.embed([self.special.tts_text_end, self.special.tts_text_pad])),
            to_token2wav=self.family.connectors[tw.connector].fn,
            codec_stop=self.codec_stop,
            max_codes=self.max_codes,
            generator=lambda: self._generator(self.t2w_device),
            fail=self._fail,
            commands_waiting=lambda: self.commands_waiting(),
        )
        self.commands_waiting: Callable[[], bool] = lambda: False
        """Set by whoever runs the core's requests and steps: whether requests wait for the engine thread (then no
        chain of talker steps is started)."""

    def _build_runners(self, ckpt: Checkpoint, cfg: StageGraphConfig):
        """The thinker and talker runners (KV pools, graphs, in-graph sampling: the salts keep the two stages' noise
        apart), the streaming token2wav (compiled and graph-captured now, not during the first replies) and its
        worker thread, each built with its own stage's device current (stages may be on different GPUs)."""
        th, ta, tw = cfg.thinker, cfg.talker, cfg.token2wav
        text_stop = tuple(sorted({self.special.im_end, self.special.endoftext}))
        th_device, ta_device, self.t2w_device = (concrete(stage.device) for stage in (th, ta, tw))
        with device_scope(th_device):
            thinker = self._build_thinker(ckpt, th, th_device, text_stop)
        # talker positions: the thinker prompt, speaker bos, then one per codec token
        with device_scope(ta_device):
            talker = TalkerRunner(
                ckpt.talker,
                device=ta_device,
                dtype=ta.torch_dtype,
                kv_slots=ta.kv_slots,
                max_len=self.max_context + self.max_codes + 2,
                cuda_graphs=ta.cuda_graphs,
                fused_decode=ta.fused_decode,
                sampler=SamplerSpec(
                    ta.sampling, suppress=tuple(self._codec_suppress_ids()), stop=self.codec_stop, salt=1
                ),
            )
        with device_scope(self.t2w_device):
            token2wav = self.family.token2wav(ckpt, tw)
            token2wav.warm_up(max_batch=tw.max_batch)
        worker = Token2WavWorker(token2wav, self.t2w_device) if tw.worker_thread else None
        return thinker, talker, token2wav, worker

    def _build_thinker(self, ckpt: Checkpoint, th, device: torch.device, text_stop: tuple[int, ...]) -> ThinkerRunner:
        return ThinkerRunner.of(
            self.family,
            ckpt,
            device=device,
            dtype=th.torch_dtype,
            kv_slots=th.kv_slots,
            max_len=self.max_context,
            cuda_graphs=th.cuda_graphs,
            fused_decode=th.fused_decode,
            sampler=SamplerSpec(th.sampling, stop=text_stop, salt=0),
        )

    def _codec_suppress_ids(self) -> list[int]:
        """Ids the talker must never emit: ids token2wav cannot make audio of (the family's list)."""
        return self.family.codec_suppress_ids(self.ckpt)

    # -- requests -----------------------------------------------------------------------------------
    def handle(self, request: EngineRequest):
        """Run one request between two steps; returns its result (``GetStats``, ``HasWork``) or raises a
        :class:`~pipeline.errors.PipelineError` that the caller gets."""
        c = self.conversations
        match request:
            case OpenConversation(conv_id, instructions):
                return c.open(conv_id, instructions)
            case CloseConversation(conv_id):
                return c.close(conv_id)
            case SetInstructions(conv_id, instructions):
                return c.set_instructions(conv_id, instructions)
            case SetTools(conv_id, tools):
                return c.set_tools(conv_id, tools)
            case AddFunctionCall(conv_id, item_id, name, arguments):
                return c.add_function_call(conv_id, item_id, name, arguments)
            case AddFunctionOutput(conv_id, item_id, output):
                return c.add_function_output(conv_id, item_id, output)
            case SetContextPolicy(conv_id, policy):
                return c.set_context_policy(conv_id, policy)
            case AddContent(conv_id, item_id, parts, previous_item_id):
                return c.add_content(conv_id, item_id, parts, previous_item_id)
            case AddText(conv_id, item_id, role, text, previous_item_id):
                return c.add_text(conv_id, item_id, role, text, previous_item_id)
            case AddAudio(conv_id, item_id, pcm, previous_item_id):
                return c.add_audio(conv_id, item_id, pcm, previous_item_id)
            case AppendAudio(conv_id, item_id, pcm):
                return c.append_audio(conv_id, item_id, pcm)
            case AddVideoFrame(conv_id, item_id, frame, t):
                return c.add_video_frame(conv_id, item_id, frame, t)
            case CommitAudio(conv_id, item_id):
                return c.commit_audio(conv_id, item_id)
            case DiscardAudio(conv_id, item_id):
                return c.discard_audio(conv_id, item_id)
            case DeleteItem(conv_id, item_id):
                return c.delete_item(conv_id, item_id)
            case TruncateItem(conv_id, item_id, audio_end_ms):
                return c.truncate_item(conv_id, item_id, audio_end_ms)
            case StartResponse(spec):
                return self.start_response(spec)
            case CancelResponse(response_id, reason):
                return self.cancel_response(response_id, reason)
            case GetStats(pending):
                return self.stats(pending)
            case HasWork():
                return self.has_work()
        raise TypeError(f"not an engine request: {type(request).__name__}")

    def start_response(self, spec: ResponseSpec) -> None:
        """Open the reply item at the end of the conversation and queue the response's prefill. Any conversation is
        answered: with no items (or no user item) the prompt is the instructions and the reply's header, so the reply
        answers the instructions (a greeting)."""
        conv = self.conversations.get(spec.conv_id)
        if conv.active_response is not None:
            raise ResponseActiveError("a response is already in progress for this conversation", param="response")
        calls = function_calls(self.renderer, conv.tools, spec)
        item = ConvItem(id=spec.item_id, role="assistant", kind=ItemKind.REPLY, open=True)
        conv.add(item)
        conv.active_response = spec.id
        r = ResponseState(
            spec=spec,
            conv=conv,
            item=item,
            detok=IncrementalDetokenizer(self.renderer.decode),
            calls=calls,
            seed=self._response_seed(),
            started_at=time.perf_counter(),
            started_at_s=time.monotonic(),
        )
        if spec.tool_choice.mode is ToolMode.REQUIRED:  # the reply opens the call; the model completes it
            item.reply_ids = self.renderer.tools.forced(spec.tool_choice.name)
            r.thinker.silent = True
            calls.prime(item.reply_ids)
        self.scheduler.responses[spec.id] = r
        self.observer.milestone(spec.id, "started", r.started_at)

    def cancel_response(self, response_id: str, reason: str) -> None:
        r = self.scheduler.responses.get(response_id)
        if r is not None and r.cancel_reason is None:
            r.cancel_reason = reason

    @property
    def device(self) -> torch.device:
        """Where the decode steps run (the thinker's device)."""
        return self.runner.thinker.device

    def wake_on_audio(self, callback: Callable[[], None]) -> None:
        """``callback()`` (from the token2wav worker's thread) whenever a job finishes, so the loop collects its audio
        at once; nothing without a worker."""
        if self.runner.worker is not None:
            self.runner.worker.on_done = callback

    def response(self, response_id: str) -> ResponseState | None:
        """The engine's state of a live response (None once it ended): where each stage is. Engine thread only;
        for tools and tests that watch a response step by step."""
        return self.scheduler.responses.get(response_id)

    # -- one step -----------------------------------------------------------------------------------
    def step(self) -> bool:
        """Advance every live response by one unit of each stage: the scheduler's plan (prefill chunks, one batched
        thinker token, one batched talker token or a chain), then one token2wav job of the streams whose next chunk is
        ready, then the responses whose every stage is done finish. Returns False when nothing could progress (every
        response paused by backpressure, waiting for a KV slot or only for the token2wav worker), so the caller can
        wait instead of spin."""
        started = time.perf_counter()
        tokens_before, chains_before = self.observer.tokens(), self.observer.counters["talker_chains_total"]
        progressed = self.encode_audio() > 0  # before anything renders a conversation
        progressed |= self._collect_audio()
        plan = self.scheduler.schedule(in_worker=self._in_worker(), end=self._end_planned)
        progressed |= plan.progressed
        self._prefill(plan)
        self._decode(plan)
        ready = self._ready_streams(plan.decoding)
        progressed |= tokens_before != self.observer.tokens()
        progressed |= bool(ready) and self.runner.worker_idle()  # a stream only waiting for the worker is not progress
        self._synthesize(ready)
        progressed |= self._finish_done(plan.decoding)
        self.observer.step_done(
            started,
            progressed=progressed,
            live=len(self.scheduler.responses),
            describe=self.describe,
            decoding=len(plan.decoding),
            prefills=len(plan.prefills),
            thinker_rows=len(plan.thinker_rows),
            talker_rows=len(plan.talker_rows),
            codes_before=tokens_before[1],
            chains_before=chains_before,
            ready=len(ready),
            background=plan.background,
        )
        return progressed

    def encode_audio(self) -> int:
        """Run the audio and picture encodes the requests queued, every conversation's in one call each (:meth:`step`
        starts with it; the engine loop also calls it before running the requests that arrived meanwhile). Returns
        how many blocks and pictures were encoded."""
        encoded = self.runner.audio_encodes.flush()
        return encoded + (self.image_encodes.flush() if self.image_encodes is not None else 0)

    def _in_worker(self) -> set[str]:
        return {r.id for r in self.runner.jobs.values()}

    def _live(self, r: ResponseState) -> bool:
        return r.id in self.scheduler.responses

    # -- prefill ------------------------------------------------------------------------------------
    def _prefill(self, plan: StepPlan) -> None:
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
            elif job.last and self._live(job.owner):
                job.owner.advance(ResponseStatus.DECODING)
                job.owner.mark("prefill_done_ms")
                started.append((job.owner, out.last_logits))
        if started:
            rows = [r for r, _ in started]
            tokens = self.runner.sample_first(
                rows, [logits for _, logits in started], force=[self._force_text(r) for r in rows]
            )
            self._accept_each(rows, tokens, self.output.accept_text_token)
        for conv in listening:
            self.talker_stage.listen(conv)

    def _prefill_failed(self, job: PrefillJob, exc: Exception) -> None:
        if job.owner is None:
            log.error("background prefill of %s failed; its cache is dropped", job.conv.id, exc_info=exc)
            job.conv.free()
            job.conv.dirty = False
        elif self._live(job.owner):
            self._fail(job.owner, exc)

    # -- decode -------------------------------------------------------------------------------------
    def _decode(self, plan: StepPlan) -> None:
        """One batched thinker decode and the talker's step; both stages are queued before either's ids are read (the
        talker needs the thinker's vectors, device tensors, not its new tokens). With overlap the talker decodes
        beside the thinker on the vectors of earlier steps (one thinker step behind the text); its prefills follow
        the thinker on the engine's stream."""
        if plan.decoding:
            self.observer.count("decode_steps_total")
        talker = self.talker_stage
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
            talker.inputs([r for r in plan.talker_rows if not r.talker.started and self._live(r)])
            join()
        else:
            tokens = self.runner.thinker_decode(plan.thinker_rows, force=self._force_text)
            talker_rows = talker.inputs([r for r in plan.talker_rows if self._live(r)])
            codes = talker.decode(talker_rows, plan, alone=alone)
        self._accept_sampled(tokens, self.output.accept_text_token)
        self._accept_sampled(codes, talker.accept_code)
        for r in plan.decoding:
            if r.status is ResponseStatus.DECODING and r.spec.audio and r.tokens_done() and self._live(r):
                r.advance(ResponseStatus.SYNTHESIZING)

    def _force_text(self, r: ResponseState) -> bool:
        return len(r.item.reply_ids) < self.scheduler.cfg.min_text_tokens

    def _accept_sampled(self, sampled: list[Sampled], accept: Callable[[ResponseState, int], None]) -> None:
        """Read each batch's sampled ids (one host transfer per batch) and ``accept(row, id)`` them, in row order; a
        chain's (steps, rows) ids step by step."""
        for batch, tokens in sampled:
            values = tokens.tolist()
            for step in values if tokens.dim() == 2 else [values]:
                self._accept_each(batch, step, accept)

    def _accept_each(
        self, rows: list[ResponseState], tokens: list[int], accept: Callable[[ResponseState, int], None]
    ) -> None:
        for r, token in zip(rows, tokens):
            if not self._live(r):
                continue
            try:
                accept(r, token)
            except Exception as exc:  # noqa: BLE001 - isolate one response's failure from the others
                self._fail(r, exc)

    # -- token2wav ----------------------------------------------------------------------------------
    def _ready_streams(self, decoding: list[ResponseState]) -> list[ResponseState]:
        """The live responses whose stream has the codes (look-ahead included) of its next chunk and is not in the
        worker; their players note that the chunk could be made now."""
        ready = [
            r
            for r in decoding
            if self._live(r) and r.audio.stream is not None and not self.runner.in_worker(r) and r.audio.stream.ready()
        ]
        now = time.perf_counter()
        for r in ready:
            r.audio.playout.chunk_ready(now)
            if r.audio.first_made_at is None:
                r.mark("talker_first_chunk_ms")  # its codes are in; its job may still wait for the worker
        return ready

    def _synthesize(self, ready: list[ResponseState]) -> None:
        """One token2wav job of the scheduler's choosing: handed to the worker if it is idle, or made here without
        one."""
        if not ready or not self.runner.worker_idle():
            return
        job = self.scheduler.audio_job(ready, time.perf_counter())
        if self.runner.worker is None:
            self.runner.synthesize(job, self.output.emit_audio, self._record_job)
        else:
            self.runner.submit_audio(job)

    def _collect_audio(self) -> bool:
        return self.runner.collect_audio(self.output.emit_audio, self._record_job, self._live)

    def _record_job(self, started: float, urgent: bool, streams: int) -> None:
        self.scheduler.recent_jobs.record(urgent, (time.perf_counter() - started) * 1000)
        self.observer.job(started, streams=streams, first=urgent)

    # -- endings ------------------------------------------------------------------------------------
    def _finish_done(self, decoding: list[ResponseState]) -> bool:
        done = self.scheduler.finished(decoding, busy=self.runner.in_worker)
        for r in done:
            incomplete = r.thinker.end is TextEnd.MAX_TOKENS
            self._finish(
                r,
                ResponseStatus.INCOMPLETE if incomplete else ResponseStatus.COMPLETED,
                "max_output_tokens" if incomplete else None,
            )
        return bool(done)

    def _end_planned(self, r: ResponseState, error: Exception | None) -> None:
        """The scheduler's ``end``: a cancelled response (error None) or one whose planning failed."""
        if error is None:
            self._finish(r, ResponseStatus.CANCELLED, r.cancel_reason)
        else:
            self._fail(r, error)

    def _end_cancelled(self, response_id: str) -> None:
        self._finish(self.scheduler.responses[response_id], ResponseStatus.CANCELLED, "conversation_closed")

    def _finish(self, r: ResponseState, status: ResponseStatus, reason: str | None, error: Exception | None = None):
        """End ``r`` with a final ``status``: its engine resources go back, then its last events."""
        self.scheduler.responses.pop(r.id, None)
        self.observer.milestone(r.id, status.value)
        self.observer.finished += 1
        r.advance(status)
        r.item.open = False
        if r.conv.active_response == r.id:
            r.conv.active_response = None
            r.conv.dirty = True  # the reply's footer and anything said meanwhile get prefilled
        r.talker.length = 0
        if r.audio.stream is not None:
            if not self.runner.in_worker(r):  # else closed when the worker hands it back
                r.audio.stream.close()
            r.audio.stream = None
        self.output.finish(r, status, reason, error)

    def _fail(self, r: ResponseState, exc: Exception) -> None:
        if not isinstance(exc, PipelineError):
            log.error("response %s failed inside the engine", r.id, exc_info=exc)
            # the traceback is in the server log; clients get no internals
            exc = EngineFailure("the engine failed while generating this response")
        if r.status is ResponseStatus.PREFILLING and not isinstance(exc, EngineFailure):
            r.conv.items.remove(r.item)  # refused before anything was generated: leave no trace
        elif not isinstance(exc, FunctionCallError):  # a malformed call is the model's output: the caches are sound
            self.scheduler.release_slots(
                r.conv
            )  # a stage may have died mid-update: never keep a possibly corrupt cache
        self._finish(r, ResponseStatus.FAILED, "error", exc)

    def fail_all(self) -> None:
        """End every live response ``failed`` (the engine loop's answer to a step that raised)."""
        for r in list(self.scheduler.responses.values()):
            self._fail(r, EngineFailure("the engine failed while generating this response"))

    # -- state --------------------------------------------------------------------------------------
    def has_work(self) -> bool:
        """Whether a step can do something now: a response running, an audio encode queued, a background prefill that
        can get a thinker slot, or a token2wav job in flight (so ``OmniEngine.wait_idle`` returns instead of waiting
        for a slot that only a request can free)."""
        return (
            bool(self.scheduler.responses)
            or self.runner.audio_encodes.pending > 0
            or (self.image_encodes is not None and self.image_encodes.pending > 0)
            or self.scheduler.has_background_work()
            or not self.runner.worker_idle()
        )

    def stats(self, pending_requests: int = 0) -> EngineStats:
        convs = self.scheduler.conversations.values()
        return EngineStats(
            conversations=len(convs),
            responses=len(self.scheduler.responses),
            open_audio_messages=sum(len(c.open_audio) for c in convs),
            cached_tokens=sum(len(c.cached_keys) for c in convs),
            talker_cached_tokens=sum(len(c.talker_keys) for c in convs if c.talker_slot is not None),
            pending_commands=pending_requests,
            video_positions=sum(item.video.tokens for c in convs for item in c.items if item.video is not None),
            video_frames_dropped_total=self.conversations.frames_dropped,
            **self.observer.counters,
            **self._device_memory(),
        )

    @property
    def decode_devices(self) -> tuple[torch.device, ...]:
        """The devices of the decode steps, each once: the thinker's, then the talker's."""
        return tuple(dict.fromkeys((self.runner.thinker.device, self.runner.talker.device)))

    @property
    def devices(self) -> tuple[torch.device, ...]:
        """The devices the stages run on, each once: the thinker's first, then the talker's and token2wav's."""
        stages = (self.runner.thinker.device, self.runner.talker.device, self.t2w_device)
        return tuple(dict.fromkeys(stages))

    def _device_memory(self) -> dict[str, int]:
        """torch's allocated memory summed over the engine's CUDA devices (each device's peak: the sum of peaks)."""
        cuda = [d for d in self.devices if d.type == "cuda"]
        if not cuda:
            return {}
        return {
            "device_memory_bytes": sum(torch.cuda.memory_allocated(d) for d in cuda),
            "device_memory_peak_bytes": sum(torch.cuda.max_memory_allocated(d) for d in cuda),
        }

    def _log_placement(self) -> None:
        """One line when the stages are on several CUDA devices: where each runs, and whether the devices that pass
        tensors to each other (thinker -> talker, vectors every step) have peer access."""
        cuda = [d for d in self.devices if d.type == "cuda"]
        if len(cuda) < 2:
            return
        peers = peer_access(cuda)
        log.info(
            "stages on several devices: thinker %s, talker %s, token2wav %s; peer access: %s",
            self.runner.thinker.device,
            self.runner.talker.device,
            self.t2w_device,
            ", ".join(f"cuda:{a}->cuda:{b} {'yes' if ok else 'no'}" for (a, b), ok in peers.items()),
        )

    def describe(self) -> list[str]:
        """One line per live response (where it is in each stage) and per shared resource (KV slots, token2wav
        worker): what a stalled or slow engine waits on."""
        lines = []
        for r in self.scheduler.responses.values():
            stream, busy = r.audio.stream, self.runner.in_worker(r)
            # a stream in the worker is being changed there: its readiness is not read from this thread
            steppable = stream is not None and stream.status in (StreamStatus.OPEN, StreamStatus.FINISHED)
            ready = steppable and not busy and stream.ready()
            t2w = (
                "none"
                if stream is None
                else (
                    f"{stream.status.value} codes={stream.codes_received} chunks={stream.chunks_emitted} ready={ready} "
                    f"busy={busy}"
                )
            )
            lines.append(
                f"  {r.id} conv={r.conv.id} status={r.status.name} accepts={r.spec.can_accept()} "
                f"text={len(r.item.reply_ids)} end={r.thinker.end} talker={r.talker.status.name} "
                f"queue={len(r.talker.queue)} codes={r.codec_tokens} thinker_slot={r.conv.slot} "
                f"talker_slot={r.conv.talker_slot} samples={r.audio.samples} t2w: {t2w}"
            )
        for name, slots in (("thinker", self.scheduler.thinker_slots), ("talker", self.scheduler.talker_slots)):
            lines.append(f"  {name} KV slots: {slots.used} of {slots.capacity} used")
        if self.runner.worker is not None:
            lines.append(
                f"  token2wav worker: {len(self.runner.worker.in_flight)} streams in flight, "
                f"{len(self.runner.jobs)} jobs known"
            )
        return lines

    def close(self) -> None:
        """End every conversation (a live response ends ``cancelled``), stop the token2wav worker after its running
        job, and write the timeline, if one is kept."""
        for conv_id in list(self.scheduler.conversations):
            self.conversations.close(conv_id)
        self.runner.close(self.output.emit_audio, self._record_job, self._live)
        self.observer.close()

    # -- seeds --------------------------------------------------------------------------------------
    def _response_seed(self) -> int:
        """The noise seed of a new response's sampling: drawn from the OS, or with an engine seed, the seed and the
        response's number (so a seeded engine repeats its replies)."""
        if self.seed is None:
            return secrets.randbits(32)
        self._seed_counter += 1
        return (self.seed * 1_000_003 + self._seed_counter) & 0xFFFFFFFF

    def _generator(self, device: torch.device) -> torch.Generator | None:
        if self.seed is None:
            return None
        self._seed_counter += 1
        gen = torch.Generator(device=device)
        gen.manual_seed(self.seed + self._seed_counter)
        return gen
