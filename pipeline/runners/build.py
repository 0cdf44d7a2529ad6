"""Building an engine's runners: the thinker and talker runners, the streaming token2wav and its worker, and the
:class:`~pipeline.runners.model_runner.ModelRunner` over them.

Each stage is built with its own device current (stages may be on different GPUs). First the KV pools are sized
(``kv_slots: auto``: :mod:`pipeline.runners.kv_sizing`, from the loaded modules' shapes and each GPU's free memory once
the weights are on it), then the runners allocate them. The decode and prefill graphs are captured and token2wav is
compiled and warmed up here (seconds on a 7B model), not during the first replies. A
checkpoint that does not speak (:meth:`ModelFamily.speaks <pipeline.models.family.ModelFamily.speaks>`) gets a thinker
only: no talker, no token2wav, no worker, and its stage config's talker and token2wav sections are not read.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from pipeline.config import StageGraphConfig
from pipeline.core.response_state import ResponseState
from pipeline.kernels.devices import concrete, device_scope, free_memory
from pipeline.models.common.settings import AUTO
from pipeline.models.family import Checkpoint, ModelFamily, ThinkerParts
from pipeline.models.frame_talker import FrameTalkerParts
from pipeline.runners.audio_encodes import AudioEncodes
from pipeline.runners.decoder import kv_geometry
from pipeline.runners.frame_talker import FrameTalkerRunner
from pipeline.runners.kv_sizing import GIB, KVPlan, PoolRequest, SlotShape, plan_kv_pools, talker_slot_positions
from pipeline.runners.model_runner import ModelRunner
from pipeline.runners.sampling import SamplerSpec
from pipeline.runners.talker import TalkerRunner
from pipeline.runners.thinker import ThinkerRunner
from pipeline.runners.token2wav_worker import Token2WavWorker

__all__ = ["RunnerLimits", "build_model_runner"]


@dataclass(frozen=True)
class RunnerLimits:
    """What bounds the runners' caches and sampling: the thinker's context (tokens), a reply's codec tokens, the
    thinker's text stop ids and the talker's codec stop ids."""

    max_context: int
    max_codes: int
    text_stop: tuple[int, ...]
    codec_stop: tuple[int, ...]


def build_model_runner(
    family: ModelFamily,
    ckpt: Checkpoint,
    cfg: StageGraphConfig,
    limits: RunnerLimits,
    *,
    fail: Callable[[ResponseState, Exception], None],
) -> tuple[ModelRunner, torch.device | None, KVPlan]:
    """The engine's :class:`ModelRunner` (graphs captured, token2wav warmed up), the token2wav stage's device (None
    when the checkpoint does not speak: the runner then has no talker, token2wav, worker or connector) and the plan its
    KV pools were sized by (``kv_slots: auto`` resolved here, once, after the weights are on their devices and before
    any pool, graph or token2wav buffer is allocated). ``fail(response, error)``: how the runner ends a response whose
    rows failed."""
    th_device = concrete(cfg.thinker.device)
    with device_scope(th_device):
        th_parts = family.thinker_parts(ckpt, device=th_device, cuda_graphs=cfg.thinker.cuda_graphs)
    talker = _talker_parts(family, ckpt, cfg) if family.speaks(ckpt) else None
    plan = _kv_plan(cfg, limits, th_device, th_parts, talker)
    with device_scope(th_device):
        thinker = _build_thinker(th_parts, cfg.thinker, th_device, limits, plan.slots("thinker"))
    speech = _build_speech(family, ckpt, cfg, limits, talker, plan.slots("talker")) if talker is not None else None
    # capture the decode and prefill graphs now (seconds on a 7B model), not during the first replies; before the
    # scheduler is made: its prefill row budget is the largest captured prefill graph
    with device_scope(thinker.device):
        thinker.capture()
    if speech is not None:
        speech.talker.capture()
    runner = ModelRunner(
        thinker=thinker,
        talker=speech.talker if speech else None,
        token2wav=speech.token2wav if speech else None,
        worker=speech.worker if speech else None,
        to_talker=family.connectors[cfg.talker.connector].fn if speech else None,
        audio_encodes=AudioEncodes(
            thinker, width=thinker.text_model.config.hidden_size, dtype=thinker.dtype, device=thinker.device
        ),
        overlap=speech is not None and cfg.talker.overlap,
        fail=fail,
    )
    return runner, speech.device if speech else None, plan


@dataclass(frozen=True)
class _TalkerParts:
    """A speaking checkpoint's talker before its runner (and KV pool) is built."""

    device: torch.device
    frames: FrameTalkerParts | None
    """The family's frame talker; None: the one-code-per-step talker over ``ckpt.talker``."""
    body: Any
    """The decoder the talker's pool serves."""
    vocab: int
    """Ids of every sampler table row the talker keeps per slot (codebook 0's, and a frame talker's residual ones)."""


def _talker_parts(family: ModelFamily, ckpt: Checkpoint, cfg: StageGraphConfig) -> _TalkerParts:
    ta = cfg.talker
    device = concrete(ta.device)
    with device_scope(device):
        frames = family.frame_talker_parts(ckpt, device=device, dtype=ta.torch_dtype)
    if frames is not None:
        return _TalkerParts(device, frames, frames.body, frames.head.out_features + frames.residual.vocab)
    return _TalkerParts(device, None, ckpt.talker.model, ckpt.talker.codec_head.out_features)


def _kv_plan(
    cfg: StageGraphConfig,
    limits: RunnerLimits,
    th_device: torch.device,
    th_parts: ThinkerParts,
    talker: _TalkerParts | None,
) -> KVPlan:
    """Both stages' pools sized by :func:`~pipeline.runners.kv_sizing.plan_kv_pools` from the loaded modules' shapes
    and each CUDA device's free memory now."""
    th, ta, engine = cfg.thinker, cfg.talker, cfg.engine
    requests = [
        _request("thinker", th, th_device, th_parts.text_model, limits.max_context, th_parts.lm_head.out_features)
    ]
    if talker is not None:
        positions = talker_slot_positions(limits.max_context, limits.max_codes, frames=talker.frames is not None)
        requests.append(
            _request("talker", ta, talker.device, talker.body, positions, talker.vocab, limit=cfg.token2wav.max_batch)
        )
    cuda = dict.fromkeys(torch.device(r.device) for r in requests if r.on_cuda)
    return plan_kv_pools(
        requests,
        free={str(d): free_memory(d) for d in cuda},
        reserve=round(engine.kv_reserve_gib * GIB),
        max_slots=engine.kv_auto_max_slots,
    )


def _request(
    stage: str, settings, device: torch.device, body, positions: int, vocab: int, *, limit: int | None = None
) -> PoolRequest:
    layers, kv_heads, head_dim = kv_geometry(body)
    shape = SlotShape(layers, kv_heads, head_dim, settings.torch_dtype.itemsize, positions, table_bytes=vocab)
    slots = None if settings.kv_slots == AUTO else settings.kv_slots
    return PoolRequest(stage, str(device), shape, slots, limit=limit)


@dataclass(frozen=True)
class _Speech:
    """The stages after the thinker of a checkpoint that speaks."""

    talker: TalkerRunner | FrameTalkerRunner
    token2wav: object
    """The family's streaming synthesizer (:class:`pipeline.models.synthesis.StreamingSynthesizer`)."""
    worker: Token2WavWorker | None
    device: torch.device
    """token2wav's device."""


def _build_speech(
    family: ModelFamily,
    ckpt: Checkpoint,
    cfg: StageGraphConfig,
    limits: RunnerLimits,
    parts: _TalkerParts,
    kv_slots: int,
) -> _Speech:
    """The talker runner (KV pool, graphs, in-graph sampling: its salts keep its noise apart from the thinker's), the
    streaming token2wav (compiled and graph-captured now, not during the first replies) and its worker thread, each
    built with its own stage's device current (stages may be on different GPUs)."""
    tw = cfg.token2wav
    t2w_device = concrete(tw.device)
    with device_scope(parts.device):
        talker = _build_talker(family, ckpt, cfg.talker, parts, limits, kv_slots)
    with device_scope(t2w_device):
        token2wav = family.token2wav(ckpt, tw)
        token2wav.warm_up(max_batch=tw.max_batch)
    worker = Token2WavWorker(token2wav, t2w_device) if tw.worker_thread else None
    return _Speech(talker, token2wav, worker, t2w_device)


def _build_talker(
    family: ModelFamily, ckpt: Checkpoint, ta, parts: _TalkerParts, limits: RunnerLimits, kv_slots: int
) -> TalkerRunner | FrameTalkerRunner:
    """The family's talker: a frame talker when the family's talker makes frames of several codebooks, else the
    one-code-per-step talker over ``ckpt.talker``."""
    sampler = SamplerSpec(
        ta.sampling, suppress=tuple(_codec_suppress_ids(family, ckpt)), stop=limits.codec_stop, salt=1
    )
    max_len = talker_slot_positions(limits.max_context, limits.max_codes, frames=parts.frames is not None)
    if parts.frames is not None:
        return FrameTalkerRunner(
            parts.frames,
            device=parts.device,
            dtype=ta.torch_dtype,
            kv_slots=kv_slots,
            max_len=max_len,
            sampler=sampler,
            residual_sampler=SamplerSpec(ta.residual_sampling, salt=2),
            cuda_graphs=ta.cuda_graphs,
        )
    return TalkerRunner(
        ckpt.talker,
        device=parts.device,
        dtype=ta.torch_dtype,
        kv_slots=kv_slots,
        max_len=max_len,
        cuda_graphs=ta.cuda_graphs,
        fused_decode=ta.fused_decode,
        sampler=sampler,
    )


def _build_thinker(parts: ThinkerParts, th, device: torch.device, limits: RunnerLimits, kv_slots: int) -> ThinkerRunner:
    return ThinkerRunner(
        parts,
        device=device,
        dtype=th.torch_dtype,
        kv_slots=kv_slots,
        max_len=limits.max_context,
        cuda_graphs=th.cuda_graphs,
        fused_decode=th.fused_decode,
        sampler=SamplerSpec(th.sampling, stop=limits.text_stop, salt=0),
    )


def _codec_suppress_ids(family: ModelFamily, ckpt: Checkpoint) -> list[int]:
    """Ids the talker must never emit: ids token2wav cannot make audio of (the family's list)."""
    return family.codec_suppress_ids(ckpt)
