"""Prometheus metrics of one server (one :class:`ServerMetrics` per app, its own registry: no
module globals, so several apps in one process — tests — never share counts).

Sessions feed them through a :class:`SessionObserver`, which watches the server events a
transport sends: ``error`` (counted by code), ``response.created`` → first audio delta (the
time-to-first-audio histogram, seconds, measured when the events are handed to the transport;
on WebRTC the first audio is ``output_audio_buffer.started``) and ``response.done`` (counted by
status). A preemptive reply's events reach the observer only once shown, so its time to first audio counts from
there; a withdrawn one's never do (it is counted in ``omni_realtime_preemptive_replies_total``, from its trace).

Every family shows from the first scrape: series whose label values are known up front (transports,
refusal reasons, response statuses, first-audio segments, the protocol's error codes…) start at zero.

Resource hygiene gauges are set from a :class:`Hygiene` snapshot the server takes when ``/metrics``
is scraped (:meth:`ServerMetrics.observe_hygiene`): live sessions' asyncio tasks, all tasks of the
event loop, open WebRTC peer connections, what the engine holds (conversations, responses, open
audio messages, KV positions, queued commands; and the size of the KV pools, constant from load) and the process's
resident memory and open file descriptors. Once every session has ended each returns to its idle value; a count that
keeps growing is a leak.

The same snapshot carries the engine's cumulative work counters (thinker tokens, talker codec
tokens, 24 kHz audio samples, decode steps, the underruns a real-time player of each reply would
have had: ``omni_realtime_engine_*_total`` counters) and the accelerator memory torch holds
(``omni_realtime_engine_device_memory_bytes`` and ``..._peak_bytes``, 0 on the CPU); ``omni-realtime bench
--url`` reads them to report per-stage throughput. They are exported once the engine has reported (an engine
without ``stats()`` exports none).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from pipeline.response_events import EngineStats
from realtime.engines.placement import EngineLoad, EngineState, PlacementCode
from realtime.media.video_settings import CAMERA_OUTCOMES
from realtime.observe.first_audio import USUAL_SEGMENTS, FirstAudioTrace
from realtime.protocol.codes import ErrorCode
from realtime.protocol.model import ResponseWireStatus
from realtime.protocol.names import Dialect, ServerEvent, server_event_name
from realtime.server.auth import AccessCode
from realtime.server.limits import LimitCode

PREFIX = "omni_realtime"

TTFA_BUCKETS = (0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0, 10.0)
"""Seconds: fine around the 0.2–1 s that matters for voice, coarse beyond."""

HOP_BUCKETS = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0)
"""Seconds: one hop of the first audio's path is milliseconds when all is well, seconds under overload."""

TRANSPORTS = ("websocket", "webrtc")
"""The ``transport`` label values of the session metrics."""

CONTENT_TYPE = CONTENT_TYPE_LATEST
"""Content type of :meth:`ServerMetrics.render`'s output."""

_ERROR = server_event_name(ServerEvent.ERROR, Dialect.GA)
_RESPONSE_CREATED = server_event_name(ServerEvent.RESPONSE_CREATED, Dialect.GA)
_RESPONSE_DONE = server_event_name(ServerEvent.RESPONSE_DONE, Dialect.GA)
_FIRST_AUDIO = frozenset(
    [server_event_name(ServerEvent.AUDIO_DELTA, d) for d in Dialect]
    + [server_event_name(ServerEvent.OUTPUT_AUDIO_BUFFER_STARTED, Dialect.GA)]
)
"""Events that mean "audio of this response left the server": a WebSocket audio delta, or the
start of playback on a WebRTC media track."""


@runtime_checkable
class EngineStatsSource(Protocol):
    """An engine that reports what it holds (``pipeline.engine.OmniEngine`` does)."""

    async def stats(self) -> EngineStats: ...


@dataclass(frozen=True)
class ProcessMemory:
    """The process's resident memory (bytes) and open file descriptors (sockets included)."""

    rss_bytes: int
    open_fds: int


def process_memory() -> ProcessMemory | None:
    """Read from ``/proc/self`` (Linux); ``None`` where there is no procfs."""
    try:
        with open("/proc/self/statm", encoding="ascii") as statm:
            resident_pages = int(statm.read().split()[1])
        open_fds = len(os.listdir("/proc/self/fd"))
    except OSError:
        return None
    return ProcessMemory(resident_pages * os.sysconf("SC_PAGE_SIZE"), open_fds)


@dataclass(frozen=True)
class Hygiene:
    """What a server holds at one moment. With no session live: ``sessions``, ``session_tasks``,
    ``webrtc_peers`` and the engine's conversations, responses, open audio messages and KV
    positions are all zero; ``loop_tasks`` is back to the server's own few."""

    sessions: int
    """Live sessions (WebSocket and WebRTC)."""
    session_tasks: int
    """asyncio tasks named as a session's (``realtime.runner.live_session_tasks``)."""
    loop_tasks: int
    """Every unfinished task of the event loop (the ASGI server's included)."""
    webrtc_peers: int
    """RTCPeerConnections created for calls and not closed."""
    outbound_events: int
    """Server events queued for clients and not sent yet (each session's queue is bounded by its
    hard limit: a client that stops reading is disconnected)."""
    engine: EngineStats | None
    """``None`` when the engine does not report (:class:`EngineStatsSource`)."""
    memory: ProcessMemory | None

    def leaks(self) -> dict[str, int]:
        """The per-session resources still held (all zero when no session is live)."""
        held = {
            "session_tasks": self.session_tasks,
            "webrtc_peers": self.webrtc_peers,
            "outbound_events": self.outbound_events,
        }
        if self.engine is not None:
            e = self.engine
            held |= {
                "engine_conversations": e.conversations,
                "engine_responses": e.responses,
                "engine_open_audio_messages": e.open_audio_messages,
                "engine_kv_positions": e.cached_tokens + e.talker_cached_tokens,
            }
        return {name: count for name, count in held.items() if count}


class ServerMetrics:
    """The server's metrics, registered in ``registry`` (a fresh one by default)."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        r = self.registry
        self.sessions_active = Gauge(f"{PREFIX}_sessions_active", "Live sessions", ["transport"], registry=r)
        self.sessions_total = Counter(f"{PREFIX}_sessions", "Sessions started", ["transport"], registry=r)
        self.sessions_refused = Counter(
            f"{PREFIX}_sessions_refused", "Connections refused before a session started", ["reason"], registry=r
        )
        self.responses = Counter(f"{PREFIX}_responses", "Responses ended, by final status", ["status"], registry=r)
        self.ttfa = Histogram(
            f"{PREFIX}_time_to_first_audio_seconds",
            "From response.created to the response's first audio leaving the server",
            buckets=TTFA_BUCKETS,
            registry=r,
        )
        self.first_audio_hops = Histogram(
            f"{PREFIX}_first_audio_path_seconds",
            "Time between consecutive hops of a response's first audio through the server "
            "(realtime/observe/first_audio.py: turn end, commit, request, engine start, engine first audio, received, "
            "sent)",
            ["segment"],
            buckets=HOP_BUCKETS,
            registry=r,
        )
        self.preemptive_replies = Counter(
            f"{PREFIX}_preemptive_replies",
            "Replies started on a pause in the user's speech (preemptive_response_ms), by outcome: shown when speech "
            "stopped, or withdrawn unseen because the user spoke on",
            ["outcome"],
            registry=r,
        )
        self.errors = Counter(f"{PREFIX}_errors", "error events sent to clients, by code", ["code"], registry=r)
        self.loop_lag = Histogram(
            f"{PREFIX}_event_loop_lag_seconds",
            "How late the server's event loop woke a sleeping task (realtime/observe/loop_lag.py): near zero "
            "when idle, "
            "growing when one loop has more work than time",
            buckets=HOP_BUCKETS,
            registry=r,
        )
        self.webrtc_input_delay = Histogram(
            f"{PREFIX}_webrtc_input_delay_seconds",
            "How much later than its first frame a WebRTC call's microphone frame reached the session, beyond its "
            "place in the stream (RTP time): a growing value is a backlog between the peer and the turn detector",
            buckets=HOP_BUCKETS,
            registry=r,
        )
        self.camera_frames = Counter(
            f"{PREFIX}_camera_frames",
            "WebRTC camera frames received, by outcome: delivered to a spoken message, skipped by the sampling rate, "
            "idle (dropped while no message was open), invalid (unconvertible or refused), no_vision, overflow "
            "(dropped waiting to cross from a media worker)",
            ["outcome"],
            registry=r,
        )
        self.camera_tracks_refused = Counter(
            f"{PREFIX}_camera_tracks_refused",
            "WebRTC video tracks refused in the SDP answer, by reason: unsupported_codec (the offer lists no codec "
            "the server decodes); the call goes on without video",
            ["reason"],
            registry=r,
        )
        self._turn_model_metrics(r)
        self._hygiene_gauges(r)
        self._known_series()

    def _turn_model_metrics(self, r: CollectorRegistry) -> None:
        """``semantic_vad``'s turn model (``realtime/server/turn_model.py``)."""
        self.turn_model_latency = Histogram(
            f"{PREFIX}_turn_model_latency_seconds",
            "From a session asking the turn model whether the user's turn is complete to its answer (queueing and "
            "the batch); the count is the answered requests",
            buckets=HOP_BUCKETS,
            registry=r,
        )
        self.turn_model_shed = Counter(
            f"{PREFIX}_turn_model_shed",
            "Turn-model requests answered 'unknown' at once because the scorer's queue was full (the turn then ends "
            "on silence alone)",
            registry=r,
        )
        self.turn_model_failures = Counter(
            f"{PREFIX}_turn_model_failures",
            "The turn model failed to load or raised: semantic_vad falls back to silence-based detection for good",
            registry=r,
        )
        self.turn_model_fallbacks = Counter(
            f"{PREFIX}_turn_model_fallback_turns",
            "semantic_vad turns ended on silence alone because the turn model is unavailable",
            registry=r,
        )

    def _known_series(self) -> None:
        """Create every series whose label values are known up front, at zero: a fresh server's ``/metrics``
        shows each family (zero sessions is a sample, not a missing series). Labels seen later (an engine's
        own error code) add their series when first used."""
        for transport in TRANSPORTS:
            self.sessions_active.labels(transport)
            self.sessions_total.labels(transport)
        busy = (
            LimitCode.SESSION_LIMIT_REACHED,
            PlacementCode.ENGINE_CAPACITY_REACHED,
            PlacementCode.NO_ENGINE_AVAILABLE,
        )
        for reason in (ErrorCode.INVALID_API_KEY, *AccessCode, *busy):
            self.sessions_refused.labels(str(reason))
        for status in ResponseWireStatus:
            if status is not ResponseWireStatus.IN_PROGRESS:
                self.responses.labels(status.value)
        for segment in USUAL_SEGMENTS:
            self.first_audio_hops.labels(segment)
        for outcome in ("shown", "withdrawn"):
            self.preemptive_replies.labels(outcome)
        for code in (
            *ErrorCode,
            LimitCode.RATE_LIMIT_EXCEEDED,
            LimitCode.MESSAGE_TOO_LARGE,
            PlacementCode.ENGINE_FAILED,
        ):
            self.errors.labels(str(code))
        for stage in ("thinker", "talker"):
            self.engine_kv_positions.labels(stage)
            self.engine_kv_slots.labels(stage)
            self.engine_kv_capacity.labels(stage)
        for outcome in CAMERA_OUTCOMES:
            self.camera_frames.labels(outcome)
        self.camera_tracks_refused.labels("unsupported_codec")

    def _hygiene_gauges(self, r: CollectorRegistry) -> None:
        self.session_tasks = Gauge(f"{PREFIX}_session_tasks", "asyncio tasks of live sessions", registry=r)
        self.loop_tasks = Gauge(f"{PREFIX}_event_loop_tasks", "Unfinished asyncio tasks of the server", registry=r)
        self.webrtc_peers = Gauge(f"{PREFIX}_webrtc_peers", "Open WebRTC peer connections", registry=r)
        self.outbound_events = Gauge(f"{PREFIX}_outbound_events", "Server events queued for clients", registry=r)
        self.engine_conversations = Gauge(f"{PREFIX}_engine_conversations", "Conversations in the engine", registry=r)
        self.engine_responses = Gauge(f"{PREFIX}_engine_responses", "Responses being generated", registry=r)
        self.engine_open_audio = Gauge(
            f"{PREFIX}_engine_open_audio_messages", "User audio messages being recorded", registry=r
        )
        self.engine_kv_positions = Gauge(
            f"{PREFIX}_engine_kv_positions", "KV cache positions held, by stage", ["stage"], registry=r
        )
        self.engine_pending = Gauge(f"{PREFIX}_engine_pending_commands", "Commands queued for the engine", registry=r)
        self.engine_kv_slots = Gauge(
            f"{PREFIX}_engine_kv_slots",
            "Conversations whose KV cache the engines keep on their devices at once, by stage (resolved at load)",
            ["stage"],
            registry=r,
        )
        self.engine_kv_capacity = Gauge(
            f"{PREFIX}_engine_kv_capacity_positions",
            "KV cache positions the engines' pools hold, by stage (engine_kv_positions of them are used)",
            ["stage"],
            registry=r,
        )
        self.rss = Gauge(f"{PREFIX}_process_resident_memory_bytes", "Resident memory of the process", registry=r)
        self.open_fds = Gauge(f"{PREFIX}_process_open_fds", "Open file descriptors of the process", registry=r)
        self.engine_work = EngineWorkCollector()
        r.register(self.engine_work)
        self._engine_gauges(r)

    def _engine_gauges(self, r: CollectorRegistry) -> None:
        """Per-engine series (label ``engine``: its index; ``device`` on ``engine_up``), set at each scrape."""
        self.engine_up = Gauge(
            f"{PREFIX}_engine_up",
            "1 while the engine serves, 0 while it is failed or restarting",
            ["engine", "device"],
            registry=r,
        )
        self.engine_sessions = Gauge(
            f"{PREFIX}_engine_sessions", "Live sessions placed on the engine", ["engine"], registry=r
        )
        self.engine_capacity = Gauge(
            f"{PREFIX}_engine_session_capacity", "Sessions the engine takes at most", ["engine"], registry=r
        )
        self.engine_live_responses = Gauge(
            f"{PREFIX}_engine_live_responses",
            "Responses the engine is generating (at its last report)",
            ["engine"],
            registry=r,
        )
        self.engine_failures = Counter(
            f"{PREFIX}_engine_failures",
            "Engines marked failed (their process died) since start",
            ["engine"],
            registry=r,
        )
        self.engine_restarts = Counter(
            f"{PREFIX}_engine_restarts",
            "Failed engines replaced by a newly loaded one since start",
            ["engine"],
            registry=r,
        )

    def observe_hygiene(self, hygiene: Hygiene) -> None:
        """Set the hygiene gauges from a snapshot (engine and process gauges keep their last
        value when the snapshot lacks them)."""
        self.session_tasks.set(hygiene.session_tasks)
        self.loop_tasks.set(hygiene.loop_tasks)
        self.webrtc_peers.set(hygiene.webrtc_peers)
        self.outbound_events.set(hygiene.outbound_events)
        engine = hygiene.engine
        if engine is not None:
            self.engine_conversations.set(engine.conversations)
            self.engine_responses.set(engine.responses)
            self.engine_open_audio.set(engine.open_audio_messages)
            self.engine_kv_positions.labels("thinker").set(engine.cached_tokens)
            self.engine_kv_positions.labels("talker").set(engine.talker_cached_tokens)
            self.engine_kv_slots.labels("thinker").set(engine.kv_slots)
            self.engine_kv_slots.labels("talker").set(engine.talker_kv_slots)
            self.engine_kv_capacity.labels("thinker").set(engine.kv_capacity_tokens)
            self.engine_kv_capacity.labels("talker").set(engine.talker_kv_capacity_tokens)
            self.engine_pending.set(engine.pending_commands)
            self.engine_work.stats = engine
        if hygiene.memory is not None:
            self.rss.set(hygiene.memory.rss_bytes)
            self.open_fds.set(hygiene.memory.open_fds)

    def observe_engines(
        self, loads: list[EngineLoad], devices: tuple[str | None, ...], stats: list[EngineStats | None] | None = None
    ) -> None:
        """Set the per-engine gauges from the placement's view (``stats``: each engine's latest, ``None`` where it
        gave none: its live responses keep their last value)."""
        for load in loads:
            engine = str(load.index)
            self.engine_up.labels(engine, str(devices[load.index])).set(int(load.state is EngineState.SERVING))
            self.engine_sessions.labels(engine).set(load.sessions)
            self.engine_capacity.labels(engine).set(load.capacity)
            self.engine_failures.labels(engine)
            self.engine_restarts.labels(engine)
            report = stats[load.index] if stats is not None else None
            if report is not None:
                self.engine_live_responses.labels(engine).set(report.responses)
            else:
                self.engine_live_responses.labels(engine)

    def engine_failed(self, engine: str) -> None:
        self.engine_failures.labels(engine).inc()

    def engine_restarted(self, engine: str) -> None:
        self.engine_restarts.labels(engine).inc()

    def render(self) -> bytes:
        """The Prometheus text exposition (:data:`CONTENT_TYPE`)."""
        return generate_latest(self.registry)

    def session(self, transport: str, *, clock: Callable[[], float] = time.monotonic) -> SessionObserver:
        """Count a session as started and live until its observer is closed."""
        self.sessions_total.labels(transport).inc()
        self.sessions_active.labels(transport).inc()
        return SessionObserver(self, transport, clock=clock)

    def first_audio_path(self, trace: FirstAudioTrace) -> None:
        """Observe one response's first-audio hops (the runner's ``on_first_audio``) and count a preemptive reply's
        outcome; a withdrawn reply's hops are not observed (the client never waited for it)."""
        if trace.preemptive:
            self.preemptive_replies.labels("withdrawn" if trace.withdrawn else "shown").inc()
            if trace.withdrawn:
                return
        for segment, ms in trace.segments().items():
            self.first_audio_hops.labels(segment).observe(max(ms, 0.0) / 1000.0)

    def camera_frame(self, outcome: str) -> None:
        """Count one received camera frame (:data:`realtime.media.video_settings.CAMERA_OUTCOMES`)."""
        self.camera_frames.labels(outcome).inc()

    def camera_track_refused(self, reason: str) -> None:
        """Count one WebRTC video track refused in the answer (``unsupported_codec``)."""
        self.camera_tracks_refused.labels(reason).inc()

    def refused(self, reason: str) -> None:
        self.sessions_refused.labels(reason).inc()


class EngineWorkCollector:
    """Exports the engine's cumulative counters and device memory from the last
    :class:`EngineStats` it was given (``stats``); nothing before the first. Counters are copied
    from the engine's own totals, hence a collector rather than incremented ``Counter`` objects."""

    def __init__(self) -> None:
        self.stats: EngineStats | None = None

    def describe(self) -> Iterator[Metric]:
        return self._families(EngineStats(0, 0, 0, 0, 0, 0))

    def collect(self) -> Iterator[Metric]:
        return self._families(self.stats) if self.stats is not None else iter(())

    @staticmethod
    def _families(s: EngineStats) -> Iterator[Metric]:
        engine = f"{PREFIX}_engine"
        yield CounterMetricFamily(
            f"{engine}_thinker_tokens", "Thinker tokens decoded since the engine started", value=s.thinker_tokens_total
        )
        yield CounterMetricFamily(
            f"{engine}_talker_tokens",
            "Talker codec tokens sampled since the engine started",
            value=s.talker_tokens_total,
        )
        yield CounterMetricFamily(
            f"{engine}_audio_samples",
            "24 kHz audio samples emitted since the engine started",
            value=s.audio_samples_total,
        )
        yield CounterMetricFamily(
            f"{engine}_decode_steps", "Engine steps that decoded at least one token", value=s.decode_steps_total
        )
        yield CounterMetricFamily(
            f"{engine}_talker_chains",
            "Talker batches run as a chain of steps (talker.chain_steps)",
            value=s.talker_chains_total,
        )
        yield CounterMetricFamily(
            f"{engine}_audio_underruns",
            "Audio chunks emitted after a real-time player of their reply, started on its first "
            "chunk, would have run dry (the engine's lateness, before the network)",
            value=s.audio_underruns_total,
        )
        yield CounterMetricFamily(
            f"{engine}_audio_starved_seconds",
            "How long those players waited for the late chunks, in all",
            value=s.audio_starved_ms_total / 1000.0,
        )
        yield CounterMetricFamily(
            f"{engine}_audio_start_holds",
            "Replies whose first audio was held until their player had the start buffer in hand "
            "(token2wav.start_buffer_ms, under load)",
            value=s.audio_start_holds_total,
        )
        yield CounterMetricFamily(
            f"{engine}_audio_start_held_seconds",
            "How long those replies' first audio was held, in all",
            value=s.audio_start_held_ms_total / 1000.0,
        )
        yield GaugeMetricFamily(
            f"{engine}_video_positions",
            "Thinker positions of camera video the engine's conversations hold now (kept within the video budget)",
            value=s.video_positions,
        )
        yield CounterMetricFamily(
            f"{engine}_video_frames_dropped",
            "Camera frames the engine dropped since it started (a second frame in one slot, another picture size, "
            "late or after the message's audio)",
            value=s.video_frames_dropped_total,
        )
        yield GaugeMetricFamily(
            f"{engine}_device_memory_bytes",
            "Accelerator memory allocated by torch (0 on the CPU)",
            value=s.device_memory_bytes,
        )
        yield GaugeMetricFamily(
            f"{engine}_device_memory_peak_bytes",
            "Highest accelerator memory allocated by torch since start (0 on the CPU)",
            value=s.device_memory_peak_bytes,
        )


class SessionObserver:
    """Watches one session's outgoing events (call it with each event dict, in send order)."""

    def __init__(self, metrics: ServerMetrics, transport: str, *, clock: Callable[[], float]) -> None:
        self._metrics = metrics
        self._transport = transport
        self._clock = clock
        self._started: dict[str, float] = {}  # response id -> response.created time, until first audio
        self._closed = False

    def __call__(self, event: dict) -> None:
        kind = event.get("type")
        if kind == _ERROR:
            self._metrics.errors.labels(str(event["error"].get("code"))).inc()
        elif kind == _RESPONSE_CREATED:
            self._started[event["response"]["id"]] = self._clock()
        elif kind in _FIRST_AUDIO:
            self.audio_started(event["response_id"])
        elif kind == _RESPONSE_DONE:
            response = event["response"]
            self._started.pop(response["id"], None)
            self._metrics.responses.labels(response["status"]).inc()

    def audio_started(self, response_id: str) -> None:
        """The first audio of ``response_id`` left the server (later calls are ignored)."""
        started = self._started.pop(response_id, None)
        if started is not None:
            self._metrics.ttfa.observe(self._clock() - started)

    def close(self) -> None:
        """The session ended (idempotent)."""
        if not self._closed:
            self._closed = True
            self._metrics.sessions_active.labels(self._transport).dec()
