"""Building an engine's runners: the thinker and talker runners, the streaming token2wav and its worker, and the
:class:`~pipeline.runners.model_runner.ModelRunner` over them.

Each stage is built with its own device current (stages may be on different GPUs). The decode and prefill graphs are
captured and token2wav is compiled and warmed up here (seconds on a 7B model), not during the first replies. A
checkpoint that does not speak (:meth:`ModelFamily.speaks <pipeline.models.family.ModelFamily.speaks>`) gets a thinker
only: no talker, no token2wav, no worker, and its stage config's talker and token2wav sections are not read.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from pipeline.config import StageGraphConfig
from pipeline.core.response_state import ResponseState
from pipeline.kernels.devices import concrete, device_scope
from pipeline.models.family import Checkpoint, ModelFamily
from pipeline.runners.audio_encodes import AudioEncodes
from pipeline.runners.frame_talker import FrameTalkerRunner
from pipeline.runners.model_runner import ModelRunner
from pipeline.runners.sampling import SamplerSpec
from pipeline.runners.talker import TalkerRunner
from pipeline.runners.thinker import ThinkerRunner
from pipeline.runners.token2wav_worker import Token2WavWorker

__all__ = ["RunnerLimits", "build_model_runner"]

FRAME_TALKER_OPENING_ROOM = 16
"""Talker positions a frame talker's reply opening may take beyond its prompt and frames."""


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
) -> tuple[ModelRunner, torch.device | None]:
    """The engine's :class:`ModelRunner` (graphs captured, token2wav warmed up) and the token2wav stage's device (None
    when the checkpoint does not speak: the runner then has no talker, token2wav, worker or connector).
    ``fail(response, error)``: how the runner ends a response whose rows failed."""
    th_device = concrete(cfg.thinker.device)
    with device_scope(th_device):
        thinker = _build_thinker(family, ckpt, cfg.thinker, th_device, limits)
    speech = _build_speech(family, ckpt, cfg, limits) if family.speaks(ckpt) else None
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
    return runner, speech.device if speech else None


@dataclass(frozen=True)
class _Speech:
    """The stages after the thinker of a checkpoint that speaks."""

    talker: TalkerRunner | FrameTalkerRunner
    token2wav: object
    """The family's streaming synthesizer (:class:`pipeline.models.synthesis.StreamingSynthesizer`)."""
    worker: Token2WavWorker | None
    device: torch.device
    """token2wav's device."""


def _build_speech(family: ModelFamily, ckpt: Checkpoint, cfg: StageGraphConfig, limits: RunnerLimits) -> _Speech:
    """The talker runner (KV pool, graphs, in-graph sampling: its salts keep its noise apart from the thinker's), the
    streaming token2wav (compiled and graph-captured now, not during the first replies) and its worker thread, each
    built with its own stage's device current (stages may be on different GPUs)."""
    ta, tw = cfg.talker, cfg.token2wav
    ta_device, t2w_device = concrete(ta.device), concrete(tw.device)
    with device_scope(ta_device):
        talker = _build_talker(family, ckpt, ta, ta_device, limits)
    with device_scope(t2w_device):
        token2wav = family.token2wav(ckpt, tw)
        token2wav.warm_up(max_batch=tw.max_batch)
    worker = Token2WavWorker(token2wav, t2w_device) if tw.worker_thread else None
    return _Speech(talker, token2wav, worker, t2w_device)


def _build_talker(
    family: ModelFamily, ckpt: Checkpoint, ta, device: torch.device, limits: RunnerLimits
) -> TalkerRunner | FrameTalkerRunner:
    """The family's talker: a frame talker when the family's talker makes frames of several codebooks, else the
    one-code-per-step talker over ``ckpt.talker``."""
    sampler = SamplerSpec(
        ta.sampling, suppress=tuple(_codec_suppress_ids(family, ckpt)), stop=limits.codec_stop, salt=1
    )
    parts = family.frame_talker_parts(ckpt, device=device, dtype=ta.torch_dtype)
    if parts is not None:
        # talker positions: the prompt positions it reads, the reply's opening, then one per frame
        return FrameTalkerRunner(
            parts,
            device=device,
            dtype=ta.torch_dtype,
            kv_slots=ta.kv_slots,
            max_len=limits.max_context + limits.max_codes + FRAME_TALKER_OPENING_ROOM,
            sampler=sampler,
            residual_sampler=SamplerSpec(ta.residual_sampling, salt=2),
            cuda_graphs=ta.cuda_graphs,
        )
    # talker positions: the thinker prompt, speaker bos, then one per codec token
    return TalkerRunner(
        ckpt.talker,
        device=device,
        dtype=ta.torch_dtype,
        kv_slots=ta.kv_slots,
        max_len=limits.max_context + limits.max_codes + 2,
        cuda_graphs=ta.cuda_graphs,
        fused_decode=ta.fused_decode,
        sampler=sampler,
    )


def _build_thinker(
    family: ModelFamily, ckpt: Checkpoint, th, device: torch.device, limits: RunnerLimits
) -> ThinkerRunner:
    return ThinkerRunner.of(
        family,
        ckpt,
        device=device,
        dtype=th.torch_dtype,
        kv_slots=th.kv_slots,
        max_len=limits.max_context,
        cuda_graphs=th.cuda_graphs,
        fused_decode=th.fused_decode,
        sampler=SamplerSpec(th.sampling, stop=limits.text_stop, salt=0),
    )


def _codec_suppress_ids(family: ModelFamily, ckpt: Checkpoint) -> list[int]:
    """Ids the talker must never emit: ids token2wav cannot make audio of (the family's list)."""
    return family.codec_suppress_ids(ckpt)
