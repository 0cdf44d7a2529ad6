"""The Ray Serve application: ``serve run realtime.deploy.ray_serve:app`` (or a Serve config file naming it).

One deployment, :class:`RealtimeReplica`; each replica runs one engine and the server's own ASGI app
(:func:`realtime.server.app.create_app`, every route as ``omni-realtime serve`` has them) behind Serve's HTTP proxy.
:func:`app` builds the application from :class:`RayServeArgs` (``serve run ... key=value`` or the config's
``args:``), checked on the driver before any replica starts.

- Placement: ``num_gpus`` per replica (1: one replica per GPU; 0 on CPU-only clusters).
- Capacity: a replica serves at most ``--max-sessions`` sessions (its :class:`realtime.server.limits.SessionSlots`);
  Serve routes at most that many requests to it (``max_ongoing_requests``). A WebSocket session is one ongoing
  request for its whole life, so Serve's autoscaling on ongoing requests scales on sessions per replica
  (``target_sessions``). WebRTC calls hold a session slot but are not ongoing requests once answered: Serve neither
  counts them for autoscaling nor routes around them; a full replica refuses the call itself.
- WebRTC: a replica announces its own node's address (Ray's node IP) as its ICE host candidate unless
  ``--ice-host`` is given, so media flows straight to it; only the offer/answer goes through the proxy.
- Drain: when Serve stops a replica (scale-down, redeploy, ``serve shutdown``), it takes no new sessions
  (:mod:`realtime.deploy.drain`), running ones have ``drain_grace_s`` to finish, then remaining WebSockets close
  with 1001 "server shutting down" and calls are hung up, before Serve's own ``graceful_shutdown_timeout_s``
  (set longer) ends the process. Serve tells a replica it is stopping only through its internal state, which
  :func:`_serve_stopping_probe` reads; when it cannot be read (another Ray version) the replica logs a warning and
  drains only at its ASGI shutdown.
- Every response and WebSocket handshake carries :data:`REPLICA_HEADER`: the replica that answered.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

import pydantic
from ray import serve
from ray.serve.deployment import Application

from realtime.config import ServerConfig
from realtime.deploy.drain import Drain

logger = logging.getLogger(__name__)

REPLICA_HEADER = "x-omni-realtime-replica"
"""Response header naming the Serve replica that answered (its replica id)."""
DEPLOYMENT_NAME = "RealtimeReplica"
SHUTDOWN_MARGIN_S = 10.0
"""Serve's ``graceful_shutdown_timeout_s`` is the drain's grace plus this, for the closes and the engine's exit."""
STOPPING_POLL_S = 0.25
"""How often a replica looks whether Serve has begun stopping it."""
OWNED_BY_SERVE = ("--host", "--port", "--ssl-certfile", "--ssl-keyfile", "--ssl-keyfile-password", "--ssl-ca-certs")
"""``omni-realtime serve`` flags that have no meaning on a replica: Serve's proxy owns the address, port and TLS."""


class RayServeArgs(pydantic.BaseModel):
    """The application's arguments (Serve validates them; a wrong name or type fails ``serve run``)."""

    model_config = pydantic.ConfigDict(extra="forbid")

    server_flags: list[str] = []
    """``omni-realtime serve`` flags of every replica (``--model``, ``--stage-config``, ``--max-sessions``,
    ``--api-key-file``, ``--ice-host``...), except the address, port and TLS flags (:data:`OWNED_BY_SERVE`)."""
    num_gpus: float = 1.0
    """GPUs per replica: 1 puts one replica on each GPU; 0 runs replicas on CPUs."""
    min_replicas: int = 1
    max_replicas: int = 1
    """Equal to ``min_replicas``: that many replicas, always. Larger: Serve autoscales between the two."""
    target_sessions: float | None = None
    """Autoscaling: the sessions per replica Serve aims at; ``None``: three quarters of ``--max-sessions``."""
    max_replicas_per_node: int | None = None
    """At most this many replicas on one node (``None``: as many as its GPUs, or CPUs, hold)."""
    drain_grace_s: float = 30.0
    """How long a stopping replica's running sessions may go on before they are closed."""

    @pydantic.field_validator("num_gpus", "drain_grace_s")
    @classmethod
    def _non_negative(cls, value: float) -> float:
        if value < 0:
            raise ValueError("must be >= 0")
        return value

    @pydantic.model_validator(mode="after")
    def _replicas(self) -> RayServeArgs:
        if not 1 <= self.min_replicas <= self.max_replicas:
            raise ValueError(f"need 1 <= min_replicas <= max_replicas, got {self.min_replicas}, {self.max_replicas}")
        if self.target_sessions is not None and self.target_sessions <= 0:
            raise ValueError(f"target_sessions must be > 0, got {self.target_sessions}")
        return self


def server_config(flags: list[str]) -> ServerConfig:
    """The :class:`ServerConfig` of ``omni-realtime serve`` ``flags`` (``ValueError`` naming what is wrong)."""
    from realtime.cli.main import build_parser
    from realtime.cli.main import server_config as config_of

    owned = [flag for flag in flags if flag.split("=", 1)[0] in OWNED_BY_SERVE]
    if owned:
        raise ValueError(
            f"server_flags: {', '.join(owned)} belong to Serve's proxy (http_options in the Serve config), "
            "not to a replica"
        )
    try:
        args, rest = build_parser().parse_known_args(["serve", *flags])
    except SystemExit:  # argparse has printed what is wrong on stderr
        raise ValueError(f"server_flags: not valid `omni-realtime serve` flags (see above): {flags}") from None
    if rest:
        raise ValueError(f"server_flags: unrecognized {' '.join(rest)}")
    return config_of(args)


def deployment_options(args: RayServeArgs, config: ServerConfig) -> dict:
    """Serve's options of the deployment for ``args`` and the replicas' ``config``."""
    options: dict = {
        "ray_actor_options": {"num_gpus": args.num_gpus},
        "max_ongoing_requests": config.max_sessions,
        "graceful_shutdown_timeout_s": args.drain_grace_s + SHUTDOWN_MARGIN_S,
    }
    if args.max_replicas_per_node is not None:
        options["max_replicas_per_node"] = args.max_replicas_per_node
    if args.min_replicas == args.max_replicas:
        options["num_replicas"] = args.min_replicas
    else:
        target = args.target_sessions if args.target_sessions is not None else 0.75 * config.max_sessions
        options["autoscaling_config"] = {
            "min_replicas": args.min_replicas,
            "max_replicas": args.max_replicas,
            "target_ongoing_requests": target,
        }
    return options


@serve.deployment(name=DEPLOYMENT_NAME)
@serve.ingress()
class RealtimeReplica:
    """One engine and the realtime server's ASGI app, built when the replica starts."""

    def __init__(self, config: ServerConfig, drain_grace_s: float) -> None:
        self._config = config
        self._grace_s = drain_grace_s

    async def __serve_build_asgi_app__(self):
        import dataclasses

        import ray

        from realtime.server.app import create_app

        config = self._config
        if config.webrtc and not config.ice_host_addresses:
            config = dataclasses.replace(config, ice_host_addresses=(ray.util.get_node_ip_address(),))
        inner = create_app(config)
        server = inner.state.realtime
        drain = Drain(server, self._grace_s)
        replica_id = serve.get_replica_context().replica_tag
        return ReplicaApp(inner, drain, replica_id, _serve_stopping_probe())


class ReplicaApp:
    """The server's ASGI app on a replica: adds :data:`REPLICA_HEADER`; after startup, watches whether Serve is
    stopping the replica and then drains; at ASGI shutdown, drains (if not done yet) before the server stops."""

    def __init__(self, inner, drain: Drain, replica_id: str, stopping: Callable[[], bool] | None) -> None:
        self.inner = inner
        self.drain = drain
        self.replica_id = replica_id
        self._stopping = stopping
        self._watcher: asyncio.Task | None = None

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "lifespan":
            await self.inner(scope, self._lifespan_receive(receive), self._lifespan_send(send))
            return
        header = (REPLICA_HEADER.encode(), self.replica_id.encode())

        async def send_with_header(message) -> None:
            if message["type"] in ("http.response.start", "websocket.accept"):
                message = {**message, "headers": [*message.get("headers", []), header]}
            await send(message)

        await self.inner(scope, receive, send_with_header)

    def _lifespan_receive(self, receive):
        async def wrapped():
            message = await receive()
            if message["type"] == "lifespan.shutdown":
                if self._watcher is not None:
                    self._watcher.cancel()
                await self.drain.wait()
            return message

        return wrapped

    def _lifespan_send(self, send):
        async def wrapped(message) -> None:
            if message["type"] == "lifespan.startup.complete":
                if self._stopping is None:
                    logger.warning(
                        "cannot see when Serve begins stopping this replica (unknown Ray internals): sessions drain "
                        "only once Serve has no WebSocket left here"
                    )
                else:
                    self._watcher = asyncio.create_task(self._watch(self._stopping), name="serve-stopping-watch")
            await send(message)

        return wrapped

    async def _watch(self, stopping: Callable[[], bool]) -> None:
        while not stopping():
            await asyncio.sleep(STOPPING_POLL_S)
        logger.info("Serve is stopping this replica: draining")
        self.drain.start()


def _serve_stopping_probe() -> Callable[[], bool] | None:
    """A function telling whether Serve has begun this replica's graceful shutdown, or ``None`` where it cannot be
    read. Serve has no public hook for it: this reads the replica actor's ``_shutting_down`` flag (Ray 2.60), set
    when the controller asks the replica to shut down, before Serve waits for its ongoing requests."""
    from ray._private.worker import global_worker

    actor = getattr(global_worker, "actors", {}).get(global_worker.actor_id)
    impl = getattr(actor, "_replica_impl", None)
    if impl is None or not isinstance(getattr(impl, "_shutting_down", None), bool):
        return None
    return lambda: impl._shutting_down


def app(args: dict) -> Application:
    """The application builder of ``serve run realtime.deploy.ray_serve:app [key=value ...]``: ``args`` are
    :class:`RayServeArgs`. The server flags are checked here, on the driver, before any replica starts."""
    parsed = RayServeArgs.model_validate(args)
    config = server_config(parsed.server_flags)
    # mypy keeps a decorated class's own type (python/mypy#3135): serve.deployment made RealtimeReplica a Deployment
    replica = RealtimeReplica.options(**deployment_options(parsed, config))  # type: ignore[attr-defined]
    return replica.bind(config, parsed.drain_grace_s)
