"""What the engine reports about itself: :class:`~pipeline.response_events.EngineStats`, one line per live response and
shared resource (what a stalled engine waits on), device memory and where the stages run.

Read-only views of the scheduler's registry, the runner's devices and worker and the observer's counters; nothing
here changes what the engine does. Engine thread only.
"""

from __future__ import annotations

import logging

import torch

from pipeline.kernels.devices import peer_access
from pipeline.models.family import StreamStatus
from pipeline.observe.observer import EngineObserver
from pipeline.response_events import EngineStats
from pipeline.runners.kv_sizing import KVPlan

__all__ = ["describe", "device_memory", "engine_stats", "log_kv_pools", "log_placement", "stage_devices"]

log = logging.getLogger("pipeline.core.engine_core")


def stage_devices(runner, t2w_device: torch.device | None) -> tuple[torch.device, ...]:
    """The devices the stages run on, each once: the thinker's first, then the talker's and token2wav's (an engine
    without a talker has neither)."""
    speech = (runner.talker.device, t2w_device) if runner.talker is not None else ()
    return tuple(dict.fromkeys((runner.thinker.device, *speech)))


def engine_stats(
    scheduler,
    *,
    frames_dropped: int,
    observer: EngineObserver,
    pending: int,
    devices: tuple[torch.device, ...],
    kv: KVPlan,
) -> EngineStats:
    """The engine's counts now: conversations, responses, cached positions, the KV pools' size (``kv``: the plan they
    were allocated by), the observer's counters and (on CUDA) device memory; ``pending``: requests waiting for the
    engine thread; ``frames_dropped``: video frames dropped."""
    convs = scheduler.conversations.values()
    thinker, talker = kv.pool("thinker"), kv.pool("talker")
    return EngineStats(
        conversations=len(convs),
        responses=len(scheduler.responses),
        open_audio_messages=sum(len(c.open_audio) for c in convs),
        cached_tokens=sum(len(c.cached_keys) for c in convs),
        talker_cached_tokens=sum(len(c.talker_keys) for c in convs if c.talker_slot is not None),
        pending_commands=pending,
        video_positions=sum(item.video.tokens for c in convs for item in c.items if item.video is not None),
        video_frames_dropped_total=frames_dropped,
        kv_slots=thinker.slots if thinker else 0,
        talker_kv_slots=talker.slots if talker else 0,
        kv_capacity_tokens=thinker.slots * thinker.positions if thinker else 0,
        talker_kv_capacity_tokens=talker.slots * talker.positions if talker else 0,
        **observer.counters,
        **device_memory(devices),
    )


def device_memory(devices: tuple[torch.device, ...]) -> dict[str, int]:
    """torch's allocated memory summed over the engine's CUDA devices (each device's peak: the sum of peaks)."""
    cuda = [d for d in devices if d.type == "cuda"]
    if not cuda:
        return {}
    return {
        "device_memory_bytes": sum(torch.cuda.memory_allocated(d) for d in cuda),
        "device_memory_peak_bytes": sum(torch.cuda.max_memory_allocated(d) for d in cuda),
    }


def log_kv_pools(plan: KVPlan) -> None:
    """One line at load: the KV pools' conversations, positions and memory, and what the devices have free after
    them (:meth:`KVPlan.summary <pipeline.runners.kv_sizing.KVPlan.summary>`)."""
    log.info("%s", plan.summary())


def log_placement(runner, t2w_device: torch.device | None) -> None:
    """One line when the stages are on several CUDA devices: where each runs, and whether the devices that pass
    tensors to each other (thinker -> talker, vectors every step) have peer access."""
    cuda = [d for d in stage_devices(runner, t2w_device) if d.type == "cuda"]
    if len(cuda) < 2:
        return
    peers = peer_access(cuda)
    log.info(
        "stages on several devices: thinker %s, talker %s, token2wav %s; peer access: %s",
        runner.thinker.device,
        runner.talker.device,
        t2w_device,
        ", ".join(f"cuda:{a}->cuda:{b} {'yes' if ok else 'no'}" for (a, b), ok in peers.items()),
    )


def describe(scheduler, runner) -> list[str]:
    """One line per live response (where it is in each stage) and per shared resource (KV slots, token2wav
    worker): what a stalled or slow engine waits on."""
    lines = [_describe_response(r, busy=runner.in_worker(r)) for r in scheduler.responses.values()]
    for name, slots in (("thinker", scheduler.thinker_slots), ("talker", scheduler.talker_slots)):
        if slots is not None:
            lines.append(f"  {name} KV slots: {slots.used} of {slots.capacity} used")
    if runner.worker is not None:
        lines.append(
            f"  token2wav worker: {len(runner.worker.in_flight)} streams in flight, {len(runner.jobs)} jobs known"
        )
    return lines


def _describe_response(r, *, busy: bool) -> str:
    stream = r.audio.stream
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
    return (
        f"  {r.id} conv={r.conv.id} status={r.status.name} accepts={r.spec.can_accept()} "
        f"text={len(r.item.reply_ids)} end={r.thinker.end} talker={r.talker.status.name} "
        f"queue={len(r.talker.queue)} codes={r.codec_tokens} thinker_slot={r.conv.slot} "
        f"talker_slot={r.conv.talker_slot} samples={r.audio.samples} t2w: {t2w}"
    )
