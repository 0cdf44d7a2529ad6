"""The engine core: synchronous, single-threaded, owns every model tensor.

Built like vLLM v1's engine core: :meth:`EngineCore.step` only delegates — schedule, execute, update. The scheduler
(:class:`~pipeline.scheduler.scheduler.Scheduler`) decides the step as plain data
(:class:`~pipeline.scheduler.plan.StepPlan`), the step's phases (:class:`~pipeline.step.phases.StepPhases`) execute it
on the runners (:class:`~pipeline.runners.model_runner.ModelRunner`) and accept the sampled tokens into each
response's state, the output side (:class:`~pipeline.output.processor.OutputProcessor`) turns them into events, and
the update (:meth:`~pipeline.core.lifecycle.ResponseLifecycle.update_from_output`) applies the step's
:class:`~pipeline.scheduler.plan.StepOutput`: the responses that end, end there; observation (counters,
timeline, stall watch) is :class:`~pipeline.observe.observer.EngineObserver`. The parts are built by
:func:`~pipeline.core.build.build_core`. Requests (:mod:`pipeline.core.commands`) run between two steps through
:meth:`EngineCore.handle`, so a cancel stops every stage of a response within one step.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch

from pipeline.config import StageGraphConfig
from pipeline.core.build import CoreHooks, build_core
from pipeline.core.commands import (
    AddAudioCommand,
    AddContentCommand,
    AddFunctionCallCommand,
    AddFunctionOutputCommand,
    AddTextCommand,
    AddVideoFrameCommand,
    AppendAudioCommand,
    CancelResponseCommand,
    CloseConversationCommand,
    CommitAudioCommand,
    CoreCommand,
    DeleteItemCommand,
    DiscardAudioCommand,
    GetStatsCommand,
    HasWorkCommand,
    OpenConversationCommand,
    SetContextPolicyCommand,
    SetInstructionsCommand,
    SetToolsCommand,
    StartResponseCommand,
    TruncateItemCommand,
)
from pipeline.core.lifecycle import ResponseLifecycle
from pipeline.core.response_state import ResponseSpec, ResponseState
from pipeline.core.seeds import Seeds
from pipeline.models.family import Checkpoint
from pipeline.observe import report
from pipeline.observe.observer import EngineObserver
from pipeline.response_events import EngineStats
from pipeline.scheduler.scheduler import StepContext
from pipeline.step.phases import StepPhases


class EngineCore:
    def __init__(self, ckpt: Checkpoint, cfg: StageGraphConfig, *, seed: int | None = None) -> None:
        """``ckpt``: a checkpoint of the family ``cfg.model_family`` names (:mod:`pipeline.models.family`), which is
        asked for everything model-specific."""
        self.ckpt = ckpt
        self.cfg = cfg
        self.seeds = Seeds(seed)
        """The engine seed (None: drawn from the OS) and the counter of its draws."""
        slow_step_ms = cfg.engine.slow_step_ms
        assert not isinstance(slow_step_ms, str), "a StageGraphConfig holds slow_step_ms as a number (auto resolved)"
        self.observer = EngineObserver(cfg.engine.timeline_path, slow_step_ms=slow_step_ms)
        hooks = CoreHooks(
            fail=lambda r, exc: self.phases.fail(r, exc),
            end_response=lambda rid: self.lifecycle.end_cancelled(rid),
        )
        parts = build_core(ckpt, cfg, self.observer, self.seeds, hooks)
        self.family, self.special, self.renderer = parts.family, parts.special, parts.renderer
        self.max_context, self.max_codes = parts.limits.max_context, parts.limits.max_codes
        self.codec_stop = parts.limits.codec_stop
        self.runner, self.token2wav, self.t2w_device = parts.runner, parts.runner.token2wav, parts.t2w_device
        self.kv_plan = parts.kv_plan
        """How the KV pools were sized at load (``kv_slots: auto`` resolved): reported in :meth:`stats`."""
        self.image_encodes = parts.image_encodes
        """Pictures and camera frame pairs queued by requests, preprocessed and encoded off the engine thread's
        critical path (None: the checkpoint takes no pictures)."""
        self.scheduler, self.output, self.conversations = parts.scheduler, parts.output, parts.conversations
        self.talker_stage = parts.talker_stage
        self.lifecycle = ResponseLifecycle(
            scheduler=self.scheduler,
            conversations=self.conversations,
            runner=self.runner,
            output=self.output,
            observer=self.observer,
            renderer=self.renderer,
            seeds=self.seeds,
            speaks=self.talker_stage is not None,
        )
        self.phases = StepPhases(
            scheduler=self.scheduler,
            runner=self.runner,
            image_encodes=self.image_encodes,
            output=self.output,
            talker_stage=self.talker_stage,
            observer=self.observer,
            fail_now=self.lifecycle.fail,
        )
        self.commands_waiting: Callable[[], bool] = lambda: False
        """Set by whoever runs the core's requests and steps: whether requests wait for the engine thread (then no
        chain of talker steps is started)."""

    # -- requests -----------------------------------------------------------------------------------
    def handle(self, request: CoreCommand):
        """Run one request between two steps; returns its result (``GetStatsCommand``, ``HasWorkCommand``) or raises a
        :class:`~pipeline.errors.PipelineError` that the caller gets."""
        c = self.conversations
        match request:
            case OpenConversationCommand(conv_id, instructions):
                return c.open(conv_id, instructions)
            case CloseConversationCommand(conv_id):
                return c.close(conv_id)
            case SetInstructionsCommand(conv_id, instructions):
                return c.set_instructions(conv_id, instructions)
            case SetToolsCommand(conv_id, tools):
                return c.set_tools(conv_id, tools)
            case AddFunctionCallCommand(conv_id, item_id, name, arguments):
                return c.add_function_call(conv_id, item_id, name, arguments)
            case AddFunctionOutputCommand(conv_id, item_id, output):
                return c.add_function_output(conv_id, item_id, output)
            case SetContextPolicyCommand(conv_id, policy):
                return c.set_context_policy(conv_id, policy)
            case AddContentCommand(conv_id, item_id, parts, previous_item_id):
                return c.add_content(conv_id, item_id, parts, previous_item_id)
            case AddTextCommand(conv_id, item_id, role, text, previous_item_id):
                return c.add_text(conv_id, item_id, role, text, previous_item_id)
            case AddAudioCommand(conv_id, item_id, pcm, previous_item_id):
                return c.add_audio(conv_id, item_id, pcm, previous_item_id)
            case AppendAudioCommand(conv_id, item_id, pcm):
                return c.append_audio(conv_id, item_id, pcm)
            case AddVideoFrameCommand(conv_id, item_id, frame, t):
                return c.add_video_frame(conv_id, item_id, frame, t)
            case CommitAudioCommand(conv_id, item_id):
                return c.commit_audio(conv_id, item_id)
            case DiscardAudioCommand(conv_id, item_id):
                return c.discard_audio(conv_id, item_id)
            case DeleteItemCommand(conv_id, item_id):
                return c.delete_item(conv_id, item_id)
            case TruncateItemCommand(conv_id, item_id, audio_end_ms):
                return c.truncate_item(conv_id, item_id, audio_end_ms)
            case StartResponseCommand(spec):
                return self.start_response(spec)
            case CancelResponseCommand(response_id, reason):
                return self.cancel_response(response_id, reason)
            case GetStatsCommand(pending):
                return self.stats(pending)
            case HasWorkCommand():
                return self.has_work()
        raise TypeError(f"not an engine request: {type(request).__name__}")

    def start_response(self, spec: ResponseSpec) -> None:
        """Open the reply item at the end of the conversation and queue the response's prefill
        (:meth:`ResponseLifecycle.start <pipeline.core.lifecycle.ResponseLifecycle.start>`)."""
        self.lifecycle.start(spec)

    def cancel_response(self, response_id: str, reason: str) -> None:
        self.lifecycle.cancel(response_id, reason)

    @property
    def device(self) -> torch.device:
        """Where the decode steps run (the thinker's device)."""
        return self.runner.thinker.device

    def wake_on_results(self, callback: Callable[[], None]) -> None:
        """``callback()`` (from a background thread) whenever the token2wav worker finishes a job, a picture's
        preprocessing finishes or the vision worker finishes an encode, so the loop collects the result at once
        instead of at its next poll."""
        if self.runner.worker is not None:
            self.runner.worker.on_done = callback
        if self.image_encodes is not None:
            if self.image_encodes.prep is not None:
                self.image_encodes.prep.on_done = callback
            if self.image_encodes.worker is not None:
                self.image_encodes.worker.on_done = callback

    def response(self, response_id: str) -> ResponseState | None:
        """The engine's state of a live response (None once it ended): where each stage is. Engine thread only;
        for tools and tests that watch a response step by step."""
        return self.scheduler.responses.get(response_id)

    # -- one step -----------------------------------------------------------------------------------
    def step(self) -> bool:
        """Advance every live response by one unit of each stage: the scheduler decides the step
        (:class:`~pipeline.scheduler.plan.StepPlan`: prefill chunks, one batched thinker token, the talker's starts
        and one batched talker token or a chain, the rule of the token2wav job), the phases execute it into a
        :class:`~pipeline.scheduler.plan.StepOutput`, and the update applies that output (responses cancelled, failed,
        or with every stage done end there). Returns False when nothing could progress (every response paused by
        backpressure, waiting for a KV slot or only for the token2wav worker), so the caller can wait instead of
        spin."""
        started = time.perf_counter()
        tokens_before, chains_before = self.observer.tokens(), self.observer.counters["talker_chains_total"]
        progressed = self.encode_audio() > 0  # before anything renders a conversation
        progressed |= self.phases.collect_audio()
        plan = self.scheduler.schedule(self._context())
        output = self.phases.execute(plan)
        progressed |= self.lifecycle.update_from_output(plan, output)
        progressed |= plan.progressed or tokens_before != self.observer.tokens()
        progressed |= bool(output.audio_job)  # a stream only waiting for the worker is not progress
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
            ready=len(output.ready),
            background=plan.background,
        )
        return progressed

    def _context(self) -> StepContext:
        """What the scheduler takes from outside itself to plan a step."""
        talker = self.runner.talker
        return StepContext(
            in_worker=self.phases.in_worker(),
            job_in_worker=bool(self.runner.jobs),
            commands_waiting=self.commands_waiting(),
            can_chain=talker is not None and talker.can_chain,
        )

    def encode_audio(self) -> int:
        """Run the audio encodes the requests queued, every conversation's in one call, and move the pictures along
        (those whose preprocessing finished go to the vision tower together; those whose encode is done turn ready)
        (:meth:`step` starts with it; the engine loop also calls it before running the requests that arrived
        meanwhile). Returns how many audio blocks were encoded and pictures turned ready."""
        return self.phases.encode()

    def fail_all(self) -> None:
        """End every live response ``failed`` (the engine loop's answer to a step that raised)."""
        self.lifecycle.fail_all()

    # -- state --------------------------------------------------------------------------------------
    def has_work(self) -> bool:
        """Whether a step can do something now: a response running, an audio encode queued, a picture not ready yet,
        a background prefill that can get a thinker slot, or a token2wav job in flight (so ``OmniEngine.wait_idle``
        returns instead of waiting for a slot that only a request can free)."""
        return (
            bool(self.scheduler.responses)
            or self.runner.audio_encodes.pending > 0
            or (self.image_encodes is not None and self.image_encodes.pending > 0)
            or self.scheduler.has_background_work()
            or not self.runner.worker_idle()
        )

    def stats(self, pending_requests: int = 0) -> EngineStats:
        return report.engine_stats(
            self.scheduler,
            frames_dropped=self.conversations.frames_dropped,
            observer=self.observer,
            pending=pending_requests,
            devices=self.devices,
            kv=self.kv_plan,
        )

    @property
    def speaks(self) -> bool:
        """Whether the engine makes audio (its checkpoint has a talker and token2wav); if not, it answers in text only
        and refuses a spoken response."""
        return self.talker_stage is not None

    @property
    def decode_devices(self) -> tuple[torch.device, ...]:
        """The devices of the decode steps, each once: the thinker's, then the talker's (if any)."""
        talker = self.runner.talker
        return tuple(dict.fromkeys((self.runner.thinker.device, *([talker.device] if talker else []))))

    @property
    def devices(self) -> tuple[torch.device, ...]:
        """The devices the stages run on, each once: the thinker's first, then the talker's and token2wav's (if
        any)."""
        return report.stage_devices(self.runner, self.t2w_device)

    def describe(self) -> list[str]:
        """One line per live response (where it is in each stage) and per shared resource (KV slots, token2wav
        worker): what a stalled or slow engine waits on."""
        return report.describe(self.scheduler, self.runner)

    def close(self) -> None:
        """End every conversation (a live response ends ``cancelled``), stop the token2wav worker after its running
        job, the picture preprocessing and the vision worker after theirs, and write the timeline, if one is kept."""
        for conv_id in list(self.scheduler.conversations):
            self.conversations.close(conv_id)
        self.phases.close_audio()
        if self.image_encodes is not None:
            self.image_encodes.close()
        self.observer.close()
