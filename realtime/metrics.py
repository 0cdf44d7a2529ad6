"""Prometheus metrics of one server (one :class:`ServerMetrics` per app, its own registry: no
module globals, so several apps in one process — tests — never share counts).

Sessions feed them through a :class:`SessionObserver`, which watches the server events a
transport sends: ``error`` (counted by code), ``response.created`` → first audio delta (the
time-to-first-audio histogram, seconds, measured when the events are handed to the transport;
on WebRTC the first audio is ``output_audio_buffer.started``) and ``response.done`` (counted by
status).
"""

from __future__ import annotations

import time
from collections.abc import Callable

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from realtime.protocol.names import Dialect, ServerEvent, server_event_name

PREFIX = "omni_realtime"

TTFA_BUCKETS = (0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0, 10.0)
"""Seconds: fine around the 0.2–1 s that matters for voice, coarse beyond."""

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
        self.errors = Counter(f"{PREFIX}_errors", "error events sent to clients, by code", ["code"], registry=r)

    def render(self) -> bytes:
        """The Prometheus text exposition (:data:`CONTENT_TYPE`)."""
        return generate_latest(self.registry)

    def session(self, transport: str, *, clock: Callable[[], float] = time.monotonic) -> SessionObserver:
        """Count a session as started and live until its observer is closed."""
        self.sessions_total.labels(transport).inc()
        self.sessions_active.labels(transport).inc()
        return SessionObserver(self, transport, clock=clock)

    def refused(self, reason: str) -> None:
        self.sessions_refused.labels(reason).inc()


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
