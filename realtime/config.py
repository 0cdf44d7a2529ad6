"""The server's configuration: one frozen, self-validating dataclass.

``omni-realtime serve`` builds it from its flags; :func:`realtime.server.app.create_app` takes it.
Nothing here reads environment variables: a deployment passes everything explicitly.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from realtime.media.images import ImageLimits
from realtime.media.video_settings import CameraSettings
from realtime.server.limits import RateLimit
from realtime.session import SessionLimits
from realtime.turns.model_settings import TurnModelSettings
from realtime.turns.semantic import SemanticVadConfig
from realtime.voices import DEFAULT_VOICE_ALIASES, check_voice_aliases

LOG_LEVELS = ("critical", "error", "warning", "info", "debug", "trace")
WS_IMPLEMENTATIONS = ("websockets-sansio", "websockets")
MAX_AUTO_MEDIA_WORKERS = 8
"""The most WebRTC media workers ``media_workers=None`` picks."""
MIN_CORES_FOR_MEDIA_WORKERS = 4
"""Below this many cores ``media_workers=None`` keeps the media in the server's process: there is no spare core to
spread it over (the engine and the server's loop already share them), so a worker would only add a process hop."""
"""uvicorn's WebSocket implementations on the ``websockets`` library: ``websockets-sansio`` (the default, the one
uvicorn recommends; refusals log no error, see ``realtime/transports/ws_protocol.py``) and ``websockets`` (uvicorn's
legacy one, deprecated: uvicorn warns when it starts)."""

_KEY_CHARS = re.compile(r"^[!#$%&'*+\-.^_`|~0-9A-Za-z]+$")
"""RFC 7230 token characters: a key must fit both a header and a WebSocket subprotocol name."""


DEFAULT_PREEMPTIVE_RESPONSE_MS = 200
"""ms of silence after which a reply starts, unseen until the 500 ms silence window ends the turn."""


@dataclass(frozen=True)
class ServerConfig:
    """Everything ``create_app`` and ``omni-realtime serve`` need. Invalid values raise
    ``ValueError`` naming the field. Sizes are bytes, durations seconds unless named ``_ms``."""

    host: str = "127.0.0.1"
    port: int = 8000
    api_key: str | None = field(default=None, repr=False)
    """``None``: no authentication. Never logged (hidden from ``repr``)."""
    max_sessions: int = 16
    """Concurrent sessions in all (WebSocket sessions and WebRTC calls, over every engine); one more is refused
    (WebSocket: an ``error`` event, then close code 1013; WebRTC: HTTP 503)."""
    max_sessions_per_engine: int | None = None
    """Concurrent sessions one engine serves at its latency goal (measure it: docs/server.md, "Admission"); a
    session that finds every serving engine at this count is refused as over :attr:`max_sessions`, with the code
    ``engine_capacity_reached``. ``None``: engines are bounded by :attr:`max_sessions` alone (with several
    engines, a survivor of a failure may then take them all)."""
    data_parallel_size: int = 1
    """Engines, one per GPU (``cuda:0`` .. ``cuda:N-1``; on the CPU, N engines on the CPU), each with its engine
    core in a child process of its own (``engine.process`` is forced on when N > 1). A session is placed on the
    engine with the most headroom and stays there (``realtime/engines/placement.py``)."""
    max_message_bytes: int = 8 * 1024 * 1024
    """Largest client message (UTF-8 bytes) handed to the session; larger ones get a
    ``message_too_large`` error and the connection stays open, up to :attr:`ws_max_frame_bytes`."""
    allowed_origins: tuple[str, ...] | None = None
    """Browser origins allowed to open sessions (``https://host:port``); ``None`` allows any.
    Requests without an ``Origin`` header (non-browser clients) are always allowed."""
    model: str | None = None
    """Checkpoint folder or cached hub id; ``None`` (or ``embedded:tiny``): the embedded tiny
    random-weight model, built on first run into :attr:`cache_dir`."""
    stage_config: Path | None = None
    cache_dir: Path | None = None
    seed: int | None = None
    torch_threads: int = 1
    """torch CPU threads of the engine, set before it loads (in its child process too, when the stage
    config's ``engine.process`` runs it in one). One by default: the VAD models are tiny and a GPU engine
    needs no CPU threads; raise it for a real model on CPU."""
    preemptive_response_ms: int | None = DEFAULT_PREEMPTIVE_RESPONSE_MS
    """With ``server_vad``: after this much silence (below the session's ``silence_duration_ms``) the turn is
    committed and the reply started at once, unseen by the client until speech stops; speech resuming withdraws it
    (``realtime/session/preemptive.py``). The reply then has the rest of the silence window to make its first audio; a
    withdrawn one costs the GPU work it did. ``None``: replies start when speech stops (the OpenAI API's timing).
    On by default: on the H100 it cut the time to first audio at every load measured, even when every turn had a
    mid-sentence pause that withdrew one reply."""
    semantic_vad: SemanticVadConfig = SemanticVadConfig()
    """``semantic_vad``'s timing: the silence after which the turn model is asked (``score_after_ms``) and each
    eagerness's limits (``realtime/turns/semantic.py`` gives each value's reason)."""
    turn_model: TurnModelSettings = TurnModelSettings()
    """``semantic_vad``'s turn model: on or off, its CPU threads, the scorer's batch and queue limits
    (``realtime/turns/model_settings.py``)."""
    voice_aliases: tuple[tuple[str, str], ...] = DEFAULT_VOICE_ALIASES
    """``(name, speaker)`` pairs: a client asking for voice ``name`` (case-insensitive) gets the checkpoint's
    ``speaker``, and sees ``name`` in the session (``realtime/voices.py``). The default maps OpenAI's built-in
    voices onto Chelsie and Ethan. A checkpoint speaker's own name always wins over an alias; an alias whose
    speaker the checkpoint lacks is left out (logged at startup)."""
    ice_host_addresses: tuple[str, ...] = ()
    """WebRTC: ICE host candidates, each ``ADDRESS`` or ``ANNOUNCED@BIND`` (behind a 1:1 NAT: the
    public address announced, the local one bound; tests use 127.0.0.1). Empty: the machine's own
    non-loopback interface addresses. No STUN server is ever used."""
    webrtc: bool = True
    media_workers: int | None = None
    """WebRTC: worker processes that carry the calls' media (ICE, DTLS/SRTP, RTP, Opus, resampling, the paced reply
    track), so that it spreads over cores; sessions, turn detection and the engine stay in the server's process.
    ``None`` (the default): :attr:`media_worker_count` picks for this machine. ``0``: media in the server's process.
    With workers, every call's media run on one, its camera track (sampled there) included."""
    """Serve ``POST /v1/realtime/calls`` when aiortc and the WebRTC transport are installed."""
    session_limits: SessionLimits = SessionLimits()
    image_limits: ImageLimits = ImageLimits()
    """``input_image`` pictures: the largest accepted (bytes, pixels) and the pixel budget of each ``detail``."""
    camera: CameraSettings = CameraSettings()
    """WebRTC camera tracks: frames kept a second (default: the model's rate) and each frame's pixel budget."""
    rate_limit: RateLimit = RateLimit()
    web_demo_dir: Path | None = None
    """Static files served at ``/`` when the folder has an index.html; ``None``: the packaged
    ``web_demo``."""
    log_level: str = "info"
    ws_implementation: str = WS_IMPLEMENTATIONS[0]
    """uvicorn's WebSocket implementation, one of :data:`WS_IMPLEMENTATIONS`."""
    shutdown_timeout_s: float = 5.0
    """How long a shutdown waits for live sessions to close before giving up on them."""
    send_timeout_s: float = 30.0
    """A WebSocket client whose socket takes none of one event for this long has stopped reading:
    its session ends, closed with 1008 (RELIABILITY.md). Its queued events are bounded meanwhile."""
    ssl_certfile: Path | None = None
    """TLS: the server's certificate (PEM; its chain after it). Set, the server speaks only ``https://`` and
    ``wss://`` on :attr:`port` (the calls endpoint and the web demo too); ``None``: plain ``http://`` and ``ws://``."""
    ssl_keyfile: Path | None = None
    """TLS: the certificate's private key (PEM); ``None``: the key is in :attr:`ssl_certfile`."""
    ssl_keyfile_password: str | None = field(default=None, repr=False)
    """TLS: the password of an encrypted private key; ``None``: the key is not encrypted. Never logged."""
    ssl_ca_certs: Path | None = None
    """TLS: CA certificates (PEM). Set, every client must present a certificate signed by one of them (mutual
    TLS); ``None``: clients present none."""
    engine_probe_timeout_s: float = 5.0
    """How long ``/healthz`` and ``/metrics`` wait for the engine's stats. The engine answers commands between
    steps (a step is well under a second under load), so no answer in this time means it is stuck inside a step:
    ``/healthz`` then answers 503 with ``engine_responsive: false`` and ``/metrics`` leaves the engine's stats out."""

    def __post_init__(self) -> None:
        if not 0 <= self.port <= 65535:
            raise ValueError(f"port must be in 0..65535, got {self.port}")
        if self.api_key is not None and not _KEY_CHARS.match(self.api_key):
            raise ValueError("api_key must be a non-empty token (letters, digits, -._~ and similar; no spaces)")
        if self.engine_probe_timeout_s <= 0:
            raise ValueError(f"engine_probe_timeout_s must be > 0, got {self.engine_probe_timeout_s}")
        if self.media_workers is not None and (type(self.media_workers) is not int or self.media_workers < 0):
            raise ValueError(f"media_workers must be None (auto) or an integer >= 0, got {self.media_workers!r}")
        for name in ("max_sessions", "torch_threads", "data_parallel_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        per_engine = self.max_sessions_per_engine
        if per_engine is not None and (type(per_engine) is not int or per_engine < 1):
            raise ValueError(f"max_sessions_per_engine must be None or an integer >= 1, got {per_engine!r}")
        pause = self.preemptive_response_ms
        if pause is not None and (isinstance(pause, bool) or not isinstance(pause, int) or pause < 0):
            raise ValueError(f"preemptive_response_ms must be None or an integer >= 0, got {pause!r}")
        if self.max_message_bytes < 1024:
            raise ValueError(f"max_message_bytes must be >= 1024, got {self.max_message_bytes}")
        if self.log_level not in LOG_LEVELS:
            raise ValueError(f"log_level must be one of {', '.join(LOG_LEVELS)}, got {self.log_level!r}")
        if self.ws_implementation not in WS_IMPLEMENTATIONS:
            raise ValueError(f"ws_implementation must be one of {', '.join(WS_IMPLEMENTATIONS)}")
        for name in ("shutdown_timeout_s", "send_timeout_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        if not isinstance(self.semantic_vad, SemanticVadConfig):
            raise ValueError(f"semantic_vad must be a SemanticVadConfig, got {self.semantic_vad!r}")
        if not isinstance(self.turn_model, TurnModelSettings):
            raise ValueError(f"turn_model must be a TurnModelSettings, got {self.turn_model!r}")
        check_voice_aliases(self.voice_aliases)
        if isinstance(self.allowed_origins, (str, list)):
            raise ValueError("allowed_origins must be a tuple of origins or None")
        if self.ssl_certfile is None:
            for name in ("ssl_keyfile", "ssl_keyfile_password", "ssl_ca_certs"):
                if getattr(self, name) is not None:
                    raise ValueError(f"{name} needs ssl_certfile (the server's certificate)")

    @property
    def media_worker_count(self) -> int:
        """:attr:`media_workers`, with ``None`` resolved for this machine: half the CPU cores this process may run on,
        at most :data:`MAX_AUTO_MEDIA_WORKERS`; none below :data:`MIN_CORES_FOR_MEDIA_WORKERS` cores."""
        if self.media_workers is not None:
            return self.media_workers
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
        if cores < MIN_CORES_FOR_MEDIA_WORKERS:
            return 0
        return min(cores // 2, MAX_AUTO_MEDIA_WORKERS)

    @property
    def sessions_per_engine(self) -> int:
        """Each engine's session capacity: :attr:`max_sessions_per_engine`, else :attr:`max_sessions`."""
        return self.max_sessions_per_engine if self.max_sessions_per_engine is not None else self.max_sessions

    @property
    def tls(self) -> bool:
        """Whether the server terminates TLS itself (:attr:`ssl_certfile` set)."""
        return self.ssl_certfile is not None

    @property
    def http_scheme(self) -> str:
        """``https`` with TLS, else ``http`` (WebSocket URLs: ``wss`` and ``ws``)."""
        return "https" if self.tls else "http"

    @property
    def ws_max_frame_bytes(self) -> int:
        """The transport's hard cap (uvicorn's ``ws_max_size``): a bigger message closes the
        connection with 1009. Twice :attr:`max_message_bytes`, so oversized messages up to that
        size are answered with an error event instead."""
        return 2 * self.max_message_bytes
