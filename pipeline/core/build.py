"""Building the parts of an :class:`~pipeline.core.engine_core.EngineCore` from a checkpoint and its stage config.

:func:`build_core` asks the model family for everything model-specific (special ids, the prompt renderer, context
and codec limits, connectors), builds the runners (:mod:`pipeline.runners.build`), then the scheduler, the output
processor, the conversation requests and the talker stage over them, and returns them as :class:`CoreParts`. A
checkpoint that does not speak gets no talker stage (``talker_stage`` None) and no token2wav. How a response ends is
the core's: the parts call back through :class:`CoreHooks`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from pipeline.config import StageGraphConfig
from pipeline.core.conversations import Conversations
from pipeline.core.response_state import ResponseState
from pipeline.core.seeds import Seeds
from pipeline.models import family_of
from pipeline.models.family import Checkpoint, ModelFamily
from pipeline.models.positions import PositionScheme
from pipeline.models.rendering import PromptRenderer, SpecialIds
from pipeline.observe.observer import EngineObserver
from pipeline.observe.report import log_kv_pools, log_placement
from pipeline.output.processor import OutputProcessor
from pipeline.runners.build import RunnerLimits, build_model_runner
from pipeline.runners.frame_talker import FrameTalkerRunner
from pipeline.runners.image_encodes import ImageEncodes
from pipeline.runners.kv_sizing import KVPlan
from pipeline.runners.model_runner import ModelRunner
from pipeline.runners.picture_prep import PicturePrep
from pipeline.scheduler.scheduler import Scheduler, SchedulerConfig
from pipeline.step.frame_talker_stage import FrameTalkerStage
from pipeline.step.talker_stage import TalkerStage
from pipeline.video.budget import VideoBudget

__all__ = ["CoreHooks", "CoreParts", "build_core"]


@dataclass(frozen=True)
class CoreHooks:
    """What the parts call back into the core for."""

    fail: Callable[[ResponseState, Exception], None]
    """End a response ``failed`` (one response's error never ends another)."""
    end_response: Callable[[str], None]
    """End a response ``cancelled`` because its conversation closed."""


@dataclass(frozen=True)
class CoreParts:
    family: ModelFamily
    special: SpecialIds
    """The checkpoint's special token ids (the family's)."""
    renderer: PromptRenderer
    """Renders conversations to prompt token ids and decodes reply ids (the family's)."""
    limits: RunnerLimits
    runner: ModelRunner
    kv_plan: KVPlan
    """How the thinker's and talker's KV pools were sized (``kv_slots: auto`` resolved)."""
    t2w_device: torch.device | None
    """token2wav's device; None when the checkpoint does not speak."""
    image_encodes: ImageEncodes | None
    """Pictures and camera frame pairs queued by requests: preprocessed on a pool, encoded together off the engine
    thread's critical path (None: the checkpoint takes no pictures)."""
    scheduler: Scheduler
    output: OutputProcessor
    conversations: Conversations
    talker_stage: TalkerStage | FrameTalkerStage | None
    """Drives the family's talker; None when the checkpoint does not speak (text replies only)."""


def build_core(
    ckpt: Checkpoint, cfg: StageGraphConfig, observer: EngineObserver, seeds: Seeds, hooks: CoreHooks
) -> CoreParts:
    """Every part of an engine core, built in dependency order (graphs are captured before the scheduler is made:
    its prefill row budget is the largest captured prefill graph)."""
    family = family_of(cfg.model_family)
    special = family.special(ckpt)
    renderer = family.renderer(ckpt)
    speaks = family.speaks(ckpt)
    limits = RunnerLimits(
        max_context=cfg.thinker.max_context_tokens or family.max_context(ckpt),
        max_codes=cfg.talker.max_tokens or 4096,
        text_stop=tuple(sorted({special.im_end, special.endoftext})),
        codec_stop=tuple(family.codec_stop_ids(ckpt)) if speaks else (),
    )
    runner, t2w_device, kv_plan = build_model_runner(family, ckpt, cfg, limits, fail=hooks.fail)
    log_kv_pools(kv_plan)
    log_placement(runner, t2w_device)
    positions = family.positions(ckpt)
    image_encodes = _image_encodes(family, ckpt, cfg, runner, positions)
    scheduler = _scheduler(cfg, runner, limits, positions)
    output = OutputProcessor(
        observer,
        text_stop={special.im_end, special.endoftext},
        start_buffer_ms=cfg.token2wav.start_buffer_ms,
        holds_start=lambda r: scheduler.holds_start(r.conv),
    )
    conversations = _conversations(ckpt, cfg, family, renderer, limits, runner, image_encodes, scheduler, hooks)
    talker_stage = (  # the runner speaks exactly when it has a token2wav device
        _talker_stage(cfg, family, ckpt, special, limits, runner, t2w_device, observer, seeds, hooks, positions)
        if t2w_device is not None
        else None
    )
    return CoreParts(
        family=family,
        special=special,
        renderer=renderer,
        limits=limits,
        runner=runner,
        kv_plan=kv_plan,
        t2w_device=t2w_device,
        image_encodes=image_encodes,
        scheduler=scheduler,
        output=output,
        conversations=conversations,
        talker_stage=talker_stage,
    )


def _talker_stage(
    cfg: StageGraphConfig,
    family: ModelFamily,
    ckpt: Checkpoint,
    special,
    limits: RunnerLimits,
    runner: ModelRunner,
    t2w_device: torch.device,
    observer: EngineObserver,
    seeds: Seeds,
    hooks: CoreHooks,
    positions: PositionScheme,
) -> TalkerStage | FrameTalkerStage:
    """The stage that drives the family's talker: one code per step, or frames of several codebooks."""
    common = dict(
        observer=observer,
        family=family,
        ckpt=ckpt,
        synthesizer=runner.token2wav,
        codec_stop=limits.codec_stop,
        max_codes=limits.max_codes,
        generator=lambda: seeds.generator(t2w_device),
        fail=hooks.fail,
        min_codes=cfg.talker.min_tokens or 0,
    )
    if isinstance(runner.talker, FrameTalkerRunner):
        end_ids = list(runner.talker.parts.text_end_ids)
        return FrameTalkerStage(
            talker=runner.talker,
            text_end_vectors=tuple(runner.thinker.embed(end_ids)),
            positions=positions,
            **common,
        )
    return TalkerStage(
        runner=runner,
        special=special,
        text_end_vectors=tuple(runner.thinker.embed([special.tts_text_end, special.tts_text_pad])),
        to_token2wav=family.connectors[cfg.token2wav.connector].fn,
        **common,
    )


def _image_encodes(
    family: ModelFamily, ckpt: Checkpoint, cfg: StageGraphConfig, runner: ModelRunner, positions: PositionScheme
) -> ImageEncodes | None:
    """The picture pipeline of a checkpoint with a vision tower and its preprocessing (None without either)."""
    thinker = runner.thinker
    preprocess, info = family.vision_preprocessor(ckpt), family.vision_info(ckpt)
    if thinker.vision is None or preprocess is None or info is None:
        return None
    return ImageEncodes(
        thinker,
        positions=positions,
        merge=thinker.vision.merge_size,
        width=thinker.text_model.config.hidden_size,
        dtype=thinker.dtype,
        device=thinker.device,
        prep=PicturePrep(preprocess, info),
        worker=bool(cfg.thinker.vision_worker),
    )


def _scheduler(
    cfg: StageGraphConfig, runner: ModelRunner, limits: RunnerLimits, positions: PositionScheme
) -> Scheduler:
    th, ta, tw = cfg.thinker, cfg.talker, cfg.token2wav
    synthesizer = runner.token2wav
    quick_frames = synthesizer.cfg.quick_first_chunk_frames if synthesizer else None
    return Scheduler(
        SchedulerConfig(
            prefills_per_step=th.max_prefills_per_step,
            prefill_rows=runner.thinker.prefill_rows,
            prefill_chunk_tokens=th.prefill_chunk_tokens,
            drop_oldest=th.context_policy == "drop_oldest",
            context_retention_ratio=th.context_retention_ratio,
            talker_prefills_per_step=ta.max_prefills_per_step,
            chain_steps=ta.chain_steps,
            min_text_tokens=th.min_tokens or 0,
            min_codes=ta.min_tokens or 0,
            max_codes=limits.max_codes,
            t2w_max_batch=synthesizer.max_batch if synthesizer else tw.max_batch,
            starving_margin_ms=tw.starving_margin_ms,
            starving_margin_from_jobs=tw.starving_margin_from_jobs,
            start_buffer_ms=tw.start_buffer_ms,
            start_buffer_busy=tw.start_buffer_busy or tw.max_batch,
            quick_first_chunk=quick_frames is not None,
            quick_first_chunk_max_open=synthesizer.cfg.quick_first_chunk_max_open if synthesizer else 0,
            deadline_lead_s=tw.deadline_lead_s,
            first_audio_target_ms=tw.first_audio_target_ms,
            video_budget=VideoBudget(th.video_history_seconds, th.video_retention_ratio),
        ),
        thinker_slots=runner.thinker.pool.slots,
        talker_slots=runner.talker.pool.slots if runner.talker else None,
        positions=positions,
        talker_reads=_talker_reads(runner),
    )


def _talker_reads(runner: ModelRunner) -> Callable[[list], list] | None:
    """The keys a frame talker reads of a conversation's positions (its prompt is a subsequence of them); None for a
    talker that reads every position."""
    if not isinstance(runner.talker, FrameTalkerRunner):
        return None
    parts = runner.talker.parts
    return lambda keys: [keys[i] for i in parts.prompt_positions(keys)]


def _conversations(
    ckpt: Checkpoint,
    cfg: StageGraphConfig,
    family: ModelFamily,
    renderer: PromptRenderer,
    limits: RunnerLimits,
    runner: ModelRunner,
    image_encodes: ImageEncodes | None,
    scheduler: Scheduler,
    hooks: CoreHooks,
) -> Conversations:
    th = cfg.thinker
    return Conversations(
        scheduler,
        renderer=renderer,
        max_context=limits.max_context,
        features=lambda: family.audio_features(ckpt),
        audio_encodes=runner.audio_encodes,
        image_encodes=image_encodes,
        vision_info=family.vision_info(ckpt),
        av_timing=family.av_timing(ckpt),
        video_grace_s=th.video_frame_grace_seconds,
        exact_floor=th.audio_floor == "exact",
        end_response=hooks.end_response,
    )
