"""Per-stage throughput and device memory of a sweep level: pure arithmetic on counter snapshots.

The engine keeps cumulative counters (:class:`pipeline.response_events.EngineStats`: thinker tokens,
talker codec tokens, 24 kHz audio samples, decode steps, and the accelerator memory torch has
allocated now and at its peak since start). The sweep snapshots them just before a level's users
start and just after the last of them finished (:class:`EngineCounters`), and
:func:`level_throughput` divides the differences by the wall time between the two snapshots:

- **thinker tokens/s**, **talker (codec) tokens/s**: tokens produced per wall second of the level;
- **audio s/s**: seconds of reply audio token2wav produced per wall second (1.0 = one real-time
  stream's worth);
- **decode steps/s** and **tokens per step** (thinker + talker tokens over steps that decoded any):
  how many responses an engine step advanced on average.

These are *delivered* rates over the whole level, users' speaking time and the VAD's silence window
included: the load the users asked for, not the engine's capacity (an idle engine between turns
lowers them). So each rate is also given per **replying second**: the time during which at least
one reply of the level was being generated, as the clients saw it (the union of every response's
``response.created`` → ``response.done`` arrivals, :func:`replying_seconds`); that one compares with
the reference's per-busy-second rates below. Device memory is read at the end of the level:
``allocated`` then, and the peak since the server started (so a level's peak also covers the
levels before it).

The counters come from the engine object when the bench serves the model in process
(:func:`engine_counters`), or from a ``--url`` server's ``/metrics`` (:func:`scrape_counters`, the
``omni_realtime_engine_*`` families of :mod:`realtime.observe.metrics`); a server that does not export them
gives ``None`` (shown as "–").

The reference (transformers' ``generate``, one request at a time) counts its own tokens per
request; :func:`reference_throughput` divides them by the time its one worker was busy (the sum of
the requests' run times), so the reference's rates are its speed while working, not a delivered rate.
"""

from __future__ import annotations

import asyncio
import time
import urllib.parse
import urllib.request
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass

from pipeline.response_events import OUTPUT_SAMPLE_RATE
from realtime.bench.metrics import TurnLog

METRIC_NAMES = {
    "thinker_tokens": "omni_realtime_engine_thinker_tokens_total",
    "talker_tokens": "omni_realtime_engine_talker_tokens_total",
    "audio_samples": "omni_realtime_engine_audio_samples_total",
    "decode_steps": "omni_realtime_engine_decode_steps_total",
    "device_memory_bytes": "omni_realtime_engine_device_memory_bytes",
    "device_memory_peak_bytes": "omni_realtime_engine_device_memory_peak_bytes",
}
""":class:`EngineCounters` field → the sample name in ``/metrics`` (:mod:`realtime.observe.metrics`)."""

GIB = float(1 << 30)


@dataclass(frozen=True)
class EngineCounters:
    """One snapshot of the engine's cumulative counters, taken at ``at`` (``time.perf_counter``)."""

    at: float
    thinker_tokens: int
    talker_tokens: int
    audio_samples: int
    decode_steps: int
    device_memory_bytes: int
    device_memory_peak_bytes: int

    @classmethod
    def from_stats(cls, stats, at: float | None = None) -> EngineCounters:
        """From a :class:`pipeline.response_events.EngineStats`."""
        return cls(
            time.perf_counter() if at is None else at,
            stats.thinker_tokens_total,
            stats.talker_tokens_total,
            stats.audio_samples_total,
            stats.decode_steps_total,
            stats.device_memory_bytes,
            stats.device_memory_peak_bytes,
        )


async def engine_counters(engine) -> EngineCounters:
    """Snapshot of an in-process engine (``OmniEngine.stats()`` runs on the engine thread)."""
    stats = await engine.stats()
    return EngineCounters.from_stats(stats)


async def engines_counters(engines) -> EngineCounters:
    """Snapshot of the bench's own engines (one, or one per GPU with ``--data-parallel-size``): their sum."""
    from realtime.engines.pool import total_stats

    stats = await asyncio.gather(*(engine.stats() for engine in engines))
    return EngineCounters.from_stats(total_stats(stats))


def counters_from_metrics(text: str, at: float | None = None) -> EngineCounters | None:
    """The counters in a Prometheus text exposition; ``None`` when any of them is missing (a server
    from before they were exported)."""
    from prometheus_client.parser import text_string_to_metric_families

    wanted = {name: field for field, name in METRIC_NAMES.items()}
    found: dict[str, int] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name in wanted and not sample.labels:
                found[wanted[sample.name]] = round(sample.value)
    if len(found) != len(wanted):
        return None
    return EngineCounters(time.perf_counter() if at is None else at, **found)


def metrics_url(url: str) -> str:
    """``/metrics`` of a server given as ``http(s)://`` or ``ws(s)://`` base URL."""
    return server_url(url, "/metrics")


def server_url(url: str, path: str) -> str:
    """The HTTP(S) URL of ``path`` on a server given as ``http(s)://`` or ``ws(s)://`` base URL."""
    parts = urllib.parse.urlsplit(url)
    scheme = {"ws": "http", "wss": "https"}.get(parts.scheme, parts.scheme)
    return f"{scheme}://{parts.netloc}{path}"


async def scrape_counters(url: str, *, timeout_s: float = 10.0) -> EngineCounters | None:
    """Snapshot of a remote server's counters from its ``/metrics`` (unauthenticated); ``None`` when
    it does not export them or the scrape fails (the bench reports "–", it does not stop)."""

    def get() -> str:
        target = metrics_url(url)
        with urllib.request.urlopen(target, timeout=timeout_s) as response:  # noqa: S310 - the bench's own server
            return response.read().decode("utf-8")

    try:
        text = await asyncio.to_thread(get)
    except (OSError, ValueError):
        return None
    return counters_from_metrics(text)


def replying_seconds(logs: Sequence[TurnLog]) -> float:
    """Seconds (client clock) during which at least one response of ``logs`` was in flight: the
    union of [``response.created`` arrival, ``response.done`` arrival] over every response (one
    without a ``done`` ends at its last audio, or is left out without audio)."""
    spans = []
    for log in logs:
        for r in log.responses:
            end = r.done_at if r.done_at is not None else (r.audio[-1].at if r.audio else None)
            if end is not None and end > r.created_at:
                spans.append((r.created_at, end))
    total, reach = 0.0, float("-inf")
    for start, end in sorted(spans):
        if end > reach:
            total += end - max(start, reach)
            reach = end
    return total


@dataclass(frozen=True)
class LevelThroughput:
    """Rates of one level (module docstring); memory in bytes, 0 where none is reported (CPU)."""

    source: str
    """``engine`` (in process) or ``metrics`` (a ``--url`` server's ``/metrics``)."""
    window_s: float
    thinker_tokens: int
    talker_tokens: int
    audio_s: float
    decode_steps: int
    thinker_tokens_per_s: float
    talker_tokens_per_s: float
    audio_s_per_s: float
    decode_steps_per_s: float
    tokens_per_step: float | None
    """(thinker + talker tokens) / decode steps; ``None`` without steps."""
    replying_s: float | None
    """Seconds of the window with a reply in flight (:func:`replying_seconds`); ``None``: not known."""
    thinker_tokens_per_replying_s: float | None
    talker_tokens_per_replying_s: float | None
    audio_s_per_replying_s: float | None
    device_memory_bytes: int
    """Allocated at the end of the level."""
    device_memory_peak_bytes: int
    """Peak since the server started, read at the end of the level."""

    def to_dict(self) -> dict:
        return asdict(self)


def level_throughput(
    before: EngineCounters, after: EngineCounters, source: str, *, replying_s: float | None = None
) -> LevelThroughput:
    """Rates between two snapshots of the same engine (``after`` taken later); per replying
    second too when ``replying_s`` (> 0) is given."""
    window = after.at - before.at
    if window <= 0:
        raise ValueError(f"snapshots must be in time order, got a window of {window} s")
    thinker = after.thinker_tokens - before.thinker_tokens
    talker = after.talker_tokens - before.talker_tokens
    audio_s = (after.audio_samples - before.audio_samples) / OUTPUT_SAMPLE_RATE
    steps = after.decode_steps - before.decode_steps
    replying = replying_s if replying_s is not None and replying_s > 0 else None
    return LevelThroughput(
        source=source,
        window_s=window,
        thinker_tokens=thinker,
        talker_tokens=talker,
        audio_s=audio_s,
        decode_steps=steps,
        thinker_tokens_per_s=thinker / window,
        talker_tokens_per_s=talker / window,
        audio_s_per_s=audio_s / window,
        decode_steps_per_s=steps / window,
        tokens_per_step=(thinker + talker) / steps if steps > 0 else None,
        replying_s=replying_s,
        thinker_tokens_per_replying_s=thinker / replying if replying else None,
        talker_tokens_per_replying_s=talker / replying if replying else None,
        audio_s_per_replying_s=audio_s / replying if replying else None,
        device_memory_bytes=after.device_memory_bytes,
        device_memory_peak_bytes=after.device_memory_peak_bytes,
    )


@dataclass(frozen=True)
class ReferenceThroughput:
    """The reference's rates over one level: tokens it generated / seconds its worker was busy."""

    busy_s: float
    thinker_tokens: int
    talker_tokens: int
    audio_s: float
    thinker_tokens_per_s: float
    talker_tokens_per_s: float
    audio_s_per_s: float

    def to_dict(self) -> dict:
        return asdict(self)


def reference_throughput(turns: Iterable) -> ReferenceThroughput | None:
    """Over the :class:`realtime.bench.reference.QueuedTurn` of a level; ``None`` when it served
    nothing (or took no time)."""
    turns = list(turns)
    busy = sum(t.service_s for t in turns)
    if not turns or busy <= 0:
        return None
    thinker = sum(t.thinker_tokens for t in turns)
    talker = sum(t.talker_tokens for t in turns)
    audio_s = sum(t.audio_s for t in turns)
    return ReferenceThroughput(busy, thinker, talker, audio_s, thinker / busy, talker / busy, audio_s / busy)
