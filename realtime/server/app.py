"""The ASGI app: :func:`create_app` builds a Starlette app serving the OpenAI Realtime API.

Routes:

- ``WebSocket /v1/realtime``: one session per connection (``?model=`` is accepted and ignored:
  the server serves one model, and SDKs always send one). Order of admission: origin and API key
  (refused before the handshake with HTTP 403 / 401, see :mod:`realtime.server.auth`), then admission and placement
  (:mod:`realtime.engines.placement`: refused ones are accepted, get one ``error`` event ``session_limit_reached``,
  ``engine_capacity_reached`` or ``no_engine_available``, and are closed with 1013 "try again later"), then the
  session runs on its engine (:class:`realtime.runner.SessionRunner`) until the client leaves (1000), stops reading
  (1008), the session fails or its engine does (1011, after an ``engine_failed`` error event) or the server shuts
  down (1001; 1012 when uvicorn closes the connections first). The limits count WebSocket sessions and WebRTC
  calls together.
- ``/v1/realtime`` over plain HTTP: 426 Upgrade Required to a GET (405 to other methods), with a JSON
  error (``websocket_required``) that says how to connect.
- ``POST /v1/realtime/calls``: WebRTC; the SDP offer (``application/sdp``, or a multipart form
  with ``sdp`` and ``session`` fields) goes to ``app.state.webrtc``; 201 with the SDP answer.
  Without a WebRTC endpoint: 501 with a JSON error; refused for want of capacity: 503 with ``Retry-After``.
- ``GET /healthz`` (JSON: ``ok`` (false, with status 503, once no engine serves and answers: each is closed, its
  process died, or it answers no stats request within ``engine_probe_timeout_s``), ``engine_responsive`` (every
  serving engine answered), ``model``, ``random_weights``, ``sessions`` (WebSocket and WebRTC), ``max_sessions``,
  ``webrtc``, ``calls`` (live WebRTC calls), ``engines`` (each engine's index, device, ``state`` serving or failed,
  ``responsive``, ``sessions``, ``max_sessions``)) and ``GET /metrics``
  (Prometheus text; each scrape first samples the hygiene gauges, :meth:`RealtimeServer.hygiene`):
  both unauthenticated, and neither shows content of any session (:mod:`realtime.server.health`).
- ``/``: the static voice chat page (``web_demo/``) when its folder has an index.html.

Lifespan: startup loads the engines (:mod:`realtime.engines.loading`; unless they were injected: tests, or
:func:`run_server`, which loads them first to fail early), the WebRTC endpoint and the engines' watch
(:mod:`realtime.engines.pool`: a failed engine's sessions are ended); shutdown closes every live session (close code
1001), the WebRTC endpoint, and the engines if the app loaded them. :func:`run_server` stops on
SIGINT and SIGTERM alike, and keeps the API key out of every log line (:class:`SecretFilter`).
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import functools
import json
import logging
import signal
import threading
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Mount, Route, WebSocketRoute
from starlette.staticfiles import StaticFiles
from starlette.websockets import WebSocket

from pipeline.api import EngineHandle
from pipeline.errors import PipelineError
from realtime.config import ServerConfig
from realtime.engines.loading import ServerEngines, load_engines
from realtime.engines.placement import EngineSlot, EngineSlots, PlacementCode
from realtime.engines.pool import EnginePool, EngineProbe, end_on_engine_failure
from realtime.errors import LimitExceeded, RealtimeError, to_error_payload
from realtime.ids import RandomIds
from realtime.observe.loop_lag import LoopLagProbe
from realtime.observe.metrics import Hygiene, ServerMetrics
from realtime.protocol.names import Dialect
from realtime.protocol.server import ServerEvents
from realtime.protocol.turn_detection import ServerVadParams
from realtime.runner import SessionRunner, SpeechDetectorFactory, session_task_name
from realtime.server.auth import AccessPolicy, Refusal
from realtime.server.health import CallCounts, ServerHealth, health_routes
from realtime.server.limits import LimitCode, MessageGate
from realtime.server.turn_model import TurnModelLoader, TurnModelService, bundled_turn_model
from realtime.session import SessionSettings
from realtime.transports.websocket import BETA_HEADER, CloseCode, WebSocketTransport, beta_requested, negotiate
from realtime.turns.detection import SpeechDetector
from realtime.turns.server_vad import TurnDetector
from realtime.turns.vad import SpeechProbability

logger = logging.getLogger(__name__)

REALTIME_PATH = "/v1/realtime"
CALLS_PATH = "/v1/realtime/calls"
SDP_MEDIA_TYPE = "application/sdp"


class ServerCode(enum.StrEnum):
    """Wire error codes of the HTTP endpoints."""

    WEBRTC_UNAVAILABLE = "webrtc_unavailable"
    UNSUPPORTED_MEDIA_TYPE = "unsupported_media_type"
    WEBSOCKET_REQUIRED = "websocket_required"


class WebRTCEndpoint(CallCounts, Protocol):
    """What ``POST /v1/realtime/calls`` delegates to (``realtime.transports.webrtc`` provides it); its call counts
    are read by ``/healthz`` and ``/metrics``."""

    async def start(self) -> None:
        """Get ready to take calls (start the media workers); called once, at server startup."""
        ...

    async def create_call(self, offer_sdp: str, *, dialect: Dialect, session_overrides: dict | None) -> str:
        """Start a call for the SDP offer; returns the SDP answer."""
        ...

    async def close(self) -> None:
        """Hang up every call and free its resources."""
        ...


VadFactory = Callable[[], SpeechProbability]


@dataclass(frozen=True)
class ServerContext:
    """What transports need from the server to run sessions (the WebRTC factory gets it)."""

    config: ServerConfig
    engine: EngineHandle
    metrics: ServerMetrics
    vad_factory: VadFactory
    slots: EngineSlots
    """Live sessions of every transport, under ``config.max_sessions``, each placed on one engine (its slot's
    ``engine``; ``engine`` above is the first, whose facts every engine shares)."""
    turn_model: TurnModelService
    """``semantic_vad``'s turn model, shared by every session."""

    def message_gate(self) -> MessageGate:
        """A fresh gate for one session's client messages (size, kind, event rate)."""
        return MessageGate(max_message_bytes=self.config.max_message_bytes, rate=self.config.rate_limit)

    def session_settings(self, dialect: Dialect, **overrides: object) -> SessionSettings:
        return SessionSettings.for_engine(
            self.engine,
            dialect=dialect,
            limits=self.config.session_limits,
            image_limits=self.config.image_limits,
            preemptive_replies=self.config.preemptive_response_ms is not None,
            voice_aliases=self.config.voice_aliases,
            **overrides,
        )

    async def turn_detector_factory(self) -> SpeechDetectorFactory:
        """Turn detectors over one fresh VAD (a session's own: it carries stream state), loaded
        off the event loop: ``server_vad``'s silence-based one, or ``semantic_vad``'s over the turn model."""
        vad = await asyncio.to_thread(self.vad_factory)
        pause_ms = self.config.preemptive_response_ms
        turn_model = self.turn_model

        def make(params: ServerVadParams) -> SpeechDetector:
            if params.eagerness is not None:
                return turn_model.detector(params, vad)
            return TurnDetector(params, vad, pause_ms=pause_ms)

        return make


WebRTCFactory = Callable[[ServerContext], "WebRTCEndpoint | None"]


# --- VAD ----------------------------------------------------------------------------------------


def batched_silero_vad_factory(torch_threads: int) -> VadFactory:
    """A factory of sessions' streams on one shared :class:`realtime.turns.vad_batch.VadBatcher`, which scores every
    session's frames together: the model is loaded by the first call. Loading silero sets torch's default thread
    count to 1; the factory restores ``torch_threads`` so threads started later (an engine's) get the configured
    count."""
    lock = threading.Lock()
    batcher: list = []  # the one VadBatcher, once made

    def make() -> SpeechProbability:
        import torch

        from realtime.turns.vad_batch import SileroBatchModel, VadBatcher

        with lock:
            if not batcher:
                batcher.append(VadBatcher(SileroBatchModel()))
                torch.set_num_threads(torch_threads)
        return batcher[0].stream()

    return make


def _default_webrtc(context: ServerContext) -> WebRTCEndpoint | None:
    """The aiortc transport, when it and aiortc are installed; its calls' media runs in
    ``config.media_worker_count`` worker processes (:mod:`realtime.transports.webrtc.worker_media`), or in this process
    when that is 0."""
    try:
        from realtime.transports.webrtc import WebRTCCalls
    except ImportError as exc:
        logger.warning("WebRTC disabled (POST %s answers 501; the webrtc extra installs it): %s", CALLS_PATH, exc)
        return None
    calls = WebRTCCalls(
        context.engine,
        turn_detector_factory=context.turn_detector_factory,
        settings_factory=context.session_settings,
        ice_host_addresses=context.config.ice_host_addresses,
        slots=context.slots,
        message_gate=context.message_gate,
        session_observer=lambda: context.metrics.session("webrtc"),
        on_first_audio=context.metrics.first_audio_path,
        on_input_delay=lambda seconds: context.metrics.webrtc_input_delay.observe(max(seconds, 0.0)),
        camera=context.config.camera,
        on_camera_frame=context.metrics.camera_frame,
        on_camera_refused=context.metrics.camera_track_refused,
    )
    workers = context.config.media_worker_count
    if workers == 0:
        return calls
    from realtime.transports.webrtc.worker_media import WorkerCalls

    return WorkerCalls(calls, workers)


# --- the server ---------------------------------------------------------------------------------


class RealtimeServer:
    """The app's state (``app.state.realtime``): engines, limits, metrics and live sessions.

    ``engines``: serve these (the caller keeps ownership) instead of loading ``config.data_parallel_size`` engines
    at startup."""

    def __init__(
        self,
        config: ServerConfig,
        *,
        engines: Sequence[EngineHandle] | None,
        vad_factory: VadFactory,
        webrtc_factory: WebRTCFactory | None,
        restart_engines: bool | None = None,
        turn_model: TurnModelLoader | None = bundled_turn_model,
    ) -> None:
        self.config = config
        self.metrics = ServerMetrics()
        self.turn_model = TurnModelService(turn_model, self.metrics, config.semantic_vad, config.turn_model)
        """``semantic_vad``'s turn model (loaded when the first semantic session needs it)."""
        self.access = AccessPolicy(config.api_key, config.allowed_origins)
        self.webrtc: WebRTCEndpoint | None = None
        self._engines = ServerEngines(config, engines, self.metrics, restart=restart_engines)
        self._vad_factory = vad_factory
        self._webrtc_factory = webrtc_factory
        self._context: ServerContext | None = None
        self._health: ServerHealth | None = None
        self._sessions: dict[asyncio.Task, SessionRunner] = {}  # WebSocket sessions
        self.loop_lag = LoopLagProbe(on_lag=self.metrics.loop_lag.observe)
        """The event loop's lag while the server runs (``/metrics``: ``event_loop_lag_seconds``)."""

    @property
    def context(self) -> ServerContext:
        if self._context is None:
            raise RuntimeError("the server has not started (its lifespan loads the engine)")
        return self._context

    @property
    def engine(self) -> EngineHandle:
        """The first engine (every engine serves the same model)."""
        return self.context.engine

    @property
    def pool(self) -> EnginePool:
        return self._engines.pool

    @property
    def slots(self) -> EngineSlots:
        return self.pool.slots

    @property
    def reports(self) -> ServerHealth:
        """What ``/healthz`` and ``/metrics`` report (:mod:`realtime.server.health`)."""
        if self._health is None:
            raise RuntimeError("the server has not started (its lifespan loads the engines)")
        return self._health

    async def start(self) -> None:
        pool = await self._engines.start()
        self._context = ServerContext(
            self.config, pool.engines[0], self.metrics, self._vad_factory, pool.slots, self.turn_model
        )
        if self.config.webrtc and self._webrtc_factory is not None:
            try:
                self.webrtc = self._webrtc_factory(self._context)
                if self.webrtc is not None:
                    await self.webrtc.start()
            except BaseException:
                await self._engines.close()
                raise
        self._health = ServerHealth(pool, self.metrics, self.webrtc, self._websocket_outbound)
        self._engines.watch()
        self.loop_lag.start()

    async def stop(self) -> None:
        await self._engines.stop_watch()
        await self._close_sessions()
        if self.webrtc is not None:
            await self.webrtc.close()
        await self._engines.close()
        await self.turn_model.close()
        await self.loop_lag.stop()

    async def _close_sessions(self) -> None:
        if not self._sessions:
            return
        for task in self._sessions:
            task.cancel()  # the session ends as CANCELLED: its transport closes with 1001
        _, pending = await asyncio.wait(set(self._sessions), timeout=self.config.shutdown_timeout_s)
        if pending:
            logger.warning("%d sessions did not close within %.1f s", len(pending), self.config.shutdown_timeout_s)

    def _websocket_outbound(self) -> int:
        return sum(len(runner.outbound) for runner in self._sessions.values())

    async def hygiene(self, probes: list[EngineProbe] | None = None) -> Hygiene:
        """:meth:`realtime.server.health.ServerHealth.hygiene`: what the server holds now (tests check it after
        faults)."""
        return await self.reports.hygiene(probes)

    async def probe_health(self) -> dict:
        """:meth:`realtime.server.health.ServerHealth.probe`: the ``/healthz`` answer."""
        return await self.reports.probe()

    def health(self) -> dict:
        """:meth:`realtime.server.health.ServerHealth.report`: :meth:`probe_health` without asking the engines."""
        return self.reports.report()

    # --- WebSocket sessions ---

    async def serve_websocket(self, websocket: WebSocket) -> None:
        """Admit (or refuse) one WebSocket client and run its session until it leaves."""
        subprotocols = list(websocket.scope.get("subprotocols", ()))
        refusal = self.access.check(websocket.headers, subprotocols)
        if refusal is not None:
            await self._deny(websocket, refusal)
            return
        handshake = negotiate(websocket.headers, subprotocols)
        self.pool.check()  # an engine that died since the last watch tick takes no new session
        slot = self.slots.admit()
        await websocket.accept(subprotocol=handshake.subprotocol)
        if not isinstance(slot, EngineSlot):
            await self._refuse_busy(websocket, handshake.dialect, slot)
            return
        with slot:
            await self._run_session(websocket, handshake.dialect, slot)

    async def _deny(self, websocket: WebSocket, refusal: Refusal) -> None:
        reason = str(refusal.error.code)
        self.metrics.refused(reason)
        logger.warning("refused a session from %s: %s", _client(websocket), reason)
        if "websocket.http.response" in websocket.scope.get("extensions", {}):
            await websocket.send_denial_response(error_response(refusal.status, refusal.error))
        else:
            await websocket.close(CloseCode.POLICY_VIOLATION, refusal.error.message[:120])

    async def _refuse_busy(self, websocket: WebSocket, dialect: Dialect, error: RealtimeError) -> None:
        self.metrics.refused(str(error.code))
        logger.warning(
            "refused a session from %s: %s (%d sessions live)", _client(websocket), error.code, self.slots.active
        )
        event = ServerEvents(dialect, RandomIds()).error(to_error_payload(error))
        await websocket.send_text(json.dumps(event))
        await websocket.close(CloseCode.TRY_AGAIN_LATER, "try again later")

    async def _run_session(self, websocket: WebSocket, dialect: Dialect, slot: EngineSlot) -> None:
        context = self.context
        observer = self.metrics.session("websocket")
        transport = WebSocketTransport(
            websocket,
            gate=context.message_gate(),
            dialect=dialect,
            on_send=observer,
            send_timeout_s=self.config.send_timeout_s,
        )
        try:
            runner = SessionRunner(
                transport,
                slot.engine,
                turn_detector_factory=await context.turn_detector_factory(),
                settings=context.session_settings(dialect),
                on_end=transport.session_ended,
                on_first_audio=self.metrics.first_audio_path,
            )
            transport.session_id = runner.session.session_id
            slot.on_engine_failure(functools.partial(end_on_engine_failure, runner, slot.index))
            await self._supervise(runner, _client(websocket))
        finally:
            observer.close()

    async def _supervise(self, runner: SessionRunner, peer: str) -> None:
        """Run the session as a task the shutdown can cancel; a failure ends this session only."""
        session_id, started = runner.session.session_id, time.monotonic()
        logger.info("session %s started (%s, %s)", session_id, peer, runner.session.dialect.value)
        task = asyncio.create_task(runner.run(), name=session_task_name(session_id, "websocket"))
        self._sessions[task] = runner
        try:
            await asyncio.wait({task})
        except asyncio.CancelledError:  # the ASGI server cancelled this handler: stop the session too
            task.cancel()
            await asyncio.wait({task})
            raise
        finally:
            del self._sessions[task]
        if not task.cancelled() and task.exception() is not None:
            logger.error("session %s failed", session_id, exc_info=task.exception())
        end = runner.end.value if runner.end is not None else "unknown"
        logger.info("session %s ended (%s) after %.1f s", session_id, end, time.monotonic() - started)

    # --- WebRTC calls ---

    async def create_call(self, request: Request) -> Response:
        refusal = self.access.check(request.headers)
        if refusal is not None:
            self.metrics.refused(str(refusal.error.code))
            return error_response(refusal.status, refusal.error)
        if self.webrtc is None:
            error = RealtimeError(
                "WebRTC is not available on this server (install aiortc, or it was disabled); use the WebSocket "
                f"endpoint {REALTIME_PATH}",
                code=ServerCode.WEBRTC_UNAVAILABLE,
            )
            return error_response(501, error)
        dialect = Dialect.BETA if beta_requested(request.headers.get(BETA_HEADER)) else Dialect.GA
        self.pool.check()  # an engine that died since the last watch tick takes no new call
        try:
            offer, overrides = await _read_offer(request)
            answer = await self.webrtc.create_call(offer, dialect=dialect, session_overrides=overrides)
        except (RealtimeError, PipelineError) as exc:
            status = _status_for(exc)
            logger.info(
                "refused a WebRTC call from %s: HTTP %d, %s: %s", _client(request), status, exc.code, exc.message
            )
            if str(exc.code) in BUSY_CODES:
                self.metrics.refused(str(exc.code))
                return error_response(status, exc, headers={"Retry-After": str(BUSY_RETRY_AFTER_S)})
            return error_response(status, exc)
        except Exception as exc:  # a bug in the call setup: logged, answered without internals
            logger.exception("WebRTC call setup failed")
            return error_response(500, exc)
        return Response(answer, status_code=201, media_type=SDP_MEDIA_TYPE)


BUSY_CODES = frozenset(
    {
        str(LimitCode.SESSION_LIMIT_REACHED),
        str(PlacementCode.ENGINE_CAPACITY_REACHED),
        str(PlacementCode.NO_ENGINE_AVAILABLE),
    }
)
"""Refusals for want of capacity: HTTP 503 with ``Retry-After`` on the calls endpoint, close code 1013 on WebSocket."""
BUSY_RETRY_AFTER_S = 5
"""The ``Retry-After`` (seconds) of a call refused for want of capacity."""


def _status_for(exc: Exception) -> int:
    if str(getattr(exc, "code", "")) in BUSY_CODES:
        return 503
    if isinstance(exc, LimitExceeded):
        return 429
    if isinstance(exc, PipelineError) and exc.code.startswith("engine"):
        return 503
    return 415 if getattr(exc, "code", None) == ServerCode.UNSUPPORTED_MEDIA_TYPE else 400


async def _read_offer(request: Request) -> tuple[str, dict | None]:
    """The SDP offer and the optional session overrides of a calls request."""
    media_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if media_type == SDP_MEDIA_TYPE:
        return _text((await request.body()), "body"), None
    if media_type == "multipart/form-data" and _multipart_parser_installed():
        form = await request.form()
        sdp, session = form.get("sdp"), form.get("session")
        if not isinstance(sdp, str) or not sdp:
            raise RealtimeError("the form needs an 'sdp' field with the SDP offer", param="sdp")
        return sdp, _session_overrides(session)
    multipart = "multipart/form-data with 'sdp' and 'session'"
    if not _multipart_parser_installed():
        multipart += " once python-multipart is installed on the server"
    raise RealtimeError(
        f"send the SDP offer as {SDP_MEDIA_TYPE} (or {multipart})",
        code=ServerCode.UNSUPPORTED_MEDIA_TYPE,
        param="content-type",
    )


def _multipart_parser_installed() -> bool:
    """Starlette parses forms with python-multipart, an optional dependency."""
    import importlib.util

    return importlib.util.find_spec("python_multipart") is not None


def _text(body: bytes, param: str) -> str:
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError:
        raise RealtimeError("the SDP offer is not UTF-8 text", param=param) from None
    if not text.strip():
        raise RealtimeError("the SDP offer is empty", param=param)
    return text


def _session_overrides(session: object) -> dict | None:
    if session is None:
        return None
    try:
        value = json.loads(session) if isinstance(session, str) else None
    except json.JSONDecodeError:
        value = None
    if not isinstance(value, dict):
        raise RealtimeError("the 'session' field must be a JSON object", param="session")
    return value


def websocket_required(request: Request) -> JSONResponse:
    """Plain HTTP on the WebSocket endpoint: 426 Upgrade Required (``Upgrade: websocket``) to a GET or HEAD,
    405 (``Allow: GET``) to other methods; the JSON error says where to connect instead."""
    scheme = "wss" if request.url.scheme == "https" else "ws"
    url = f"{scheme}://{request.headers.get('host', 'HOST')}{REALTIME_PATH}"
    error = RealtimeError(
        f"{REALTIME_PATH} speaks the Realtime API over WebSocket: connect with {url} (the openai SDK: "
        f"client.realtime.connect() with base_url {url.replace(scheme, 'http', 1).removesuffix('/realtime')}); "
        f"WebRTC clients POST their SDP offer to {CALLS_PATH}",
        code=ServerCode.WEBSOCKET_REQUIRED,
    )
    if request.method in ("GET", "HEAD"):
        return error_response(426, error, headers={"Upgrade": "websocket", "Connection": "Upgrade"})
    return error_response(405, error, headers={"Allow": "GET"})


def error_response(status: int, error: Exception, headers: dict[str, str] | None = None) -> JSONResponse:
    """An HTTP error with the same ``{"error": {...}}`` body as the protocol's error events."""
    if status == 401:
        headers = {"WWW-Authenticate": "Bearer"} | (headers or {})
    return JSONResponse({"error": to_error_payload(error)}, status_code=status, headers=headers)


def _client(connection: WebSocket | Request) -> str:
    client = connection.client
    return f"{client.host}:{client.port}" if client else "unknown peer"


# --- the app ------------------------------------------------------------------------------------


def create_app(
    config: ServerConfig,
    *,
    engine: EngineHandle | None = None,
    engines: Sequence[EngineHandle] | None = None,
    vad_factory: VadFactory | None = None,
    webrtc_factory: WebRTCFactory | None = _default_webrtc,
    restart_engines: bool | None = None,
    turn_model: TurnModelLoader | None = bundled_turn_model,
) -> Starlette:
    """The ASGI app for ``config``. ``engine``: serve this engine, or ``engines``: these, one session on one engine
    (the caller keeps ownership), instead of loading ``config.data_parallel_size`` engines of ``config.model`` at
    startup. ``restart_engines``: load a new engine from ``config`` in place of one that fails (default: when the
    engines are loaded at startup; pass True with ``engines`` loaded from ``config``). ``vad_factory``: one VAD per
    session (default silero). ``webrtc_factory``: builds ``app.state.webrtc`` at startup (``None``, or
    ``config.webrtc`` false: no WebRTC, the calls endpoint answers 501). ``turn_model``: loads ``semantic_vad``'s
    turn model (default: Smart Turn v3.2 from the ``pipecat-ai`` wheel; ``None``, or ``config.turn_model.enabled``
    false: none, semantic_vad ends turns on silence; :mod:`realtime.server.turn_model`)."""
    if engine is not None and engines is not None:
        raise ValueError("pass engine or engines, not both")
    server = RealtimeServer(
        config,
        engines=(engine,) if engine is not None else engines,
        vad_factory=vad_factory or batched_silero_vad_factory(config.torch_threads),
        webrtc_factory=webrtc_factory,
        restart_engines=restart_engines,
        turn_model=turn_model,
    )

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        await server.start()
        app.state.webrtc = server.webrtc
        try:
            yield
        finally:
            await server.stop()

    async def realtime_ws(websocket: WebSocket) -> None:
        await server.serve_websocket(websocket)

    async def calls(request: Request) -> Response:
        return await server.create_call(request)

    routes: list[BaseRoute] = [
        WebSocketRoute(REALTIME_PATH, realtime_ws),
        Route(REALTIME_PATH, websocket_required, methods=["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"]),
        Route(CALLS_PATH, calls, methods=["POST"]),
        *health_routes(lambda: server.reports),
    ]
    demo = _web_demo_dir(config)
    if demo is not None:
        routes.append(Mount("/", app=StaticFiles(directory=demo, html=True), name="web_demo"))
    app = Starlette(routes=routes, lifespan=lifespan)
    app.state.realtime = server
    app.state.webrtc = None
    return app


def _web_demo_dir(config: ServerConfig) -> Path | None:
    if config.web_demo_dir is not None:
        folder = config.web_demo_dir
    else:
        import web_demo

        folder = Path(web_demo.__file__).parent
    return folder if (folder / "index.html").is_file() else None


# --- running it ---------------------------------------------------------------------------------


def _uvicorn_config(app: Starlette, config: ServerConfig, **overrides: object):
    import uvicorn

    from realtime.transports.ws_protocol import ws_protocol

    options: dict = (
        {
            "host": config.host,
            "port": config.port,
            "ws": ws_protocol(config.ws_implementation),
            "ws_max_size": config.ws_max_frame_bytes,
            "lifespan": "on",
            "log_level": config.log_level,
        }
        | _uvicorn_tls(config)
        | overrides
    )
    return uvicorn.Config(app, **options)


def _uvicorn_tls(config: ServerConfig) -> dict:
    """uvicorn's TLS options for ``config`` (none without a certificate); with CA certificates every client must
    present a certificate they signed."""
    import ssl

    if not config.tls:
        return {}
    return {
        "ssl_certfile": config.ssl_certfile,
        "ssl_keyfile": config.ssl_keyfile,
        "ssl_keyfile_password": config.ssl_keyfile_password,
        "ssl_ca_certs": config.ssl_ca_certs,
        "ssl_cert_reqs": ssl.CERT_REQUIRED if config.ssl_ca_certs is not None else ssl.CERT_NONE,
    }


REDACTED = "[REDACTED]"


class SecretFilter(logging.Filter):
    """Replaces ``secret`` with :data:`REDACTED` in a record's message (its arguments merged in)
    and exception text. Installed on handlers, it sees the records of every logger, among them the
    request headers (``Authorization``, the browser's key subprotocol) that the ``websockets``
    library logs at debug level."""

    def __init__(self, secret: str) -> None:
        super().__init__()
        self._secret = secret

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if self._secret in message:
            record.msg, record.args = message.replace(self._secret, REDACTED), None
        if record.exc_info and not record.exc_text:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        if record.exc_text and self._secret in record.exc_text:
            record.exc_text = record.exc_text.replace(self._secret, REDACTED)
        return True


@contextlib.contextmanager
def _redacting(secret: str | None):
    """Keep ``secret`` out of every handler's output while the block runs (handlers configured
    before it: call it after uvicorn has set up its logging)."""
    if secret is None:
        yield
        return
    secret_filter = SecretFilter(secret)
    named = (x for x in logging.Logger.manager.loggerDict.values() if isinstance(x, logging.Logger))
    handlers = {handler for logger_ in (logging.getLogger(), *named) for handler in logger_.handlers}
    for handler in handlers:
        handler.addFilter(secret_filter)
    try:
        yield
    finally:
        for handler in handlers:
            handler.removeFilter(secret_filter)


@contextlib.contextmanager
def _sigterm_interrupts():
    """SIGTERM stops the server as Ctrl-C does: uvicorn shuts down gracefully on either, then
    re-raises the signal with the previous handler restored; this one turns it into
    ``KeyboardInterrupt``, which the CLI treats as a normal exit (status 0)."""
    import threading

    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def run_server(config: ServerConfig) -> None:
    """Serve until interrupted (the CLI's ``serve``): SIGINT or SIGTERM shut down gracefully and
    raise ``KeyboardInterrupt``. The engines are loaded (in parallel) before the socket is bound, so a bad
    checkpoint fails here with its own error."""
    import uvicorn

    with _sigterm_interrupts():
        engines = load_engines(config)
        try:
            app = create_app(config, engines=engines, restart_engines=True)
            server = uvicorn.Server(_uvicorn_config(app, config))
            with _redacting(config.api_key):
                server.run()
        finally:
            for engine in engines:
                engine.close()


@contextlib.asynccontextmanager
async def serve_in_background(app: Starlette, config: ServerConfig) -> AsyncIterator[str]:
    """Run ``app`` on uvicorn in this event loop (tests, benchmarks); yields its base URL
    (``http://host:port``, ``https://`` with TLS; ``config.port`` 0 picks a free port). Leaving the block shuts the
    server down, lifespan included. The API key is kept out of the logs meanwhile."""
    import uvicorn

    server = uvicorn.Server(_uvicorn_config(app, config, log_level="warning"))
    with _redacting(config.api_key):
        task = asyncio.create_task(server.serve())
        while not server.started:
            if task.done():
                raise RuntimeError("the server did not start (see its log)") from task.exception()
            await asyncio.sleep(0.01)
        host, port = server.servers[0].sockets[0].getsockname()[:2]
        try:
            yield f"{config.http_scheme}://{host}:{port}"
        finally:
            server.should_exit = True
            await task
