"""The Ray Serve application on a local two-node Ray cluster (``ray.cluster_utils.Cluster``), CPU and tiny model.

Ray's own services listen on the host's non-loopback address, so the cluster tests run only inside a loopback-only
network namespace: :func:`test_in_a_loopback_only_network_namespace` runs this file again under ``unshare -n`` (as
``scripts/run_browser_tests.sh`` does for WebRTC), where only ``lo`` exists and the other tests run; outside one they
are skipped. One cluster serves the whole module (it takes ~20 s to start): two replicas, one on each node, each
with its own tiny engine, behind the head node's Serve proxy.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

pytest.importorskip("ray.serve", reason="ray[serve] is not installed (pip install -e '.[ray]')")

import websockets  # noqa: E402

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[3]
PORT = 8000
URL = f"ws://127.0.0.1:{PORT}/v1/realtime"
APP_NAME = "realtime"
GRACE_S = 3.0


def _loopback_only() -> bool:
    return [name for _, name in socket.if_nameindex()] == ["lo"]


inside = pytest.mark.skipif(not _loopback_only(), reason="runs inside a loopback-only network namespace (see below)")


@pytest.mark.slow
@pytest.mark.skipif(_loopback_only(), reason="already inside the namespace")
@pytest.mark.timeout(600)
def test_in_a_loopback_only_network_namespace():
    """Runs this file's cluster tests in a network namespace of their own, where only loopback exists."""
    unshare = ["unshare", "-n"] if os.geteuid() == 0 else ["unshare", "-rn"]
    script = 'ip link set lo up && exec "$0" -m pytest -q -p no:cacheprovider "$1"'
    done = subprocess.run(
        [*unshare, "sh", "-c", script, sys.executable, str(Path(__file__))],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=580,
    )
    output = done.stdout[-6000:] + done.stderr[-3000:]
    assert done.returncode == 0, output
    summary = done.stdout.strip().splitlines()[-1]
    assert re.match(r"\d+ passed, 1 skipped in ", summary), output  # only this test is skipped in there


# --- the cluster (inside the namespace) ---------------------------------------------------------------------------


def _serve_app(model_dir: Path, replicas: int):
    from realtime.deploy.ray_serve import app

    return app(
        {
            "server_flags": ["--model", str(model_dir), "--max-sessions", "4"],
            "num_gpus": 0,
            "min_replicas": replicas,
            "max_replicas": replicas,
            "max_replicas_per_node": 1,
            "drain_grace_s": GRACE_S,
        }
    )


@pytest.fixture(scope="module")
def cluster(tiny_model_dir):
    # before Ray starts: the proxy routes to replicas on every node, not its own first; Ray's files in a folder of ours
    os.environ["RAY_SERVE_PROXY_PREFER_LOCAL_NODE_ROUTING"] = "0"
    os.environ["RAY_TMPDIR"] = ray_dir = tempfile.mkdtemp(prefix="ray", dir="/tmp")
    import ray
    from ray import serve
    from ray.cluster_utils import Cluster

    nodes = Cluster(initialize_head=True, head_node_args={"num_cpus": 2, "include_dashboard": False})
    nodes.add_node(num_cpus=2)
    ray.init(address=nodes.address, runtime_env={"env_vars": {"OMP_NUM_THREADS": "1"}})
    try:
        serve.start(proxy_location="HeadOnly", http_options={"host": "127.0.0.1", "port": PORT})
        serve.run(_serve_app(tiny_model_dir, 2), name=APP_NAME, route_prefix="/")
        yield tiny_model_dir
    finally:
        serve.shutdown()
        ray.shutdown()
        nodes.shutdown()
        shutil.rmtree(ray_dir, ignore_errors=True)  # Ray's logs and sockets of this cluster, no longer used


def replica_actors() -> dict[str, object]:
    """Live replica actors of the app by replica id (the response header's value)."""
    import ray

    found = {}
    for entry in ray.util.list_named_actors(all_namespaces=True):
        name = entry["name"]
        if name.startswith(f"SERVE_REPLICA::{APP_NAME}#"):
            found[name.rsplit("#", 1)[1]] = ray.get_actor(name, namespace=entry["namespace"])
    return found


def wait_for_running_replicas(count: int, timeout_s: float = 90.0) -> None:
    from ray import serve

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        status = serve.status().applications[APP_NAME]
        deployment = status.deployments["RealtimeReplica"]
        if deployment.replica_states.get("RUNNING", 0) == count and sum(deployment.replica_states.values()) == count:
            return
        time.sleep(0.5)
    raise AssertionError(f"not {count} running replicas after {timeout_s} s: {serve.status()}")


class Session:
    """One WebSocket session through the Serve proxy; ``replica``: the replica that serves it."""

    def __init__(self, ws) -> None:
        self.ws = ws
        self.replica = ws.response.headers["x-omni-realtime-replica"]

    async def recv(self, timeout: float = 60.0) -> dict:
        return json.loads(await asyncio.wait_for(self.ws.recv(), timeout))

    async def until(self, kind: str, timeout: float = 60.0) -> dict:
        while True:
            event = await self.recv(timeout)
            assert event["type"] != "error", event
            if event["type"] == kind:
                return event

    async def turn(self, text: str) -> dict:
        """One text turn with a short reply; returns ``response.done``."""
        item = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}
        await self.ws.send(json.dumps({"type": "conversation.item.create", "item": item}))
        await self.until("conversation.item.done")
        await self.ws.send(json.dumps({"type": "response.create", "response": {"max_output_tokens": 4}}))
        done = await self.until("response.done")
        assert done["response"]["status"] in ("completed", "incomplete"), done
        return done


@contextlib.asynccontextmanager
async def session():
    async with websockets.connect(URL, open_timeout=60) as ws:
        client = Session(ws)
        await client.until("session.created")
        yield client


async def sessions_on_every_replica(stack: contextlib.AsyncExitStack, replicas: set[str], tries: int = 16) -> dict:
    """Open sessions until one runs on each of ``replicas``; returns one session per replica (others are closed)."""
    chosen: dict[str, Session] = {}
    for _ in range(tries):
        inner = contextlib.AsyncExitStack()
        client = await inner.enter_async_context(session())
        if client.replica in replicas and client.replica not in chosen:
            chosen[client.replica] = client
            stack.push_async_exit(inner)
        else:
            await inner.aclose()
        if len(chosen) == len(replicas):
            return chosen
    raise AssertionError(f"the proxy never placed a session on each of {replicas} in {tries} tries: {set(chosen)}")


# --- the tests ------------------------------------------------------------------------------------------------


@inside
@pytest.mark.timeout(180)
async def test_four_concurrent_sessions_over_two_replicas_on_two_nodes(cluster):
    async with contextlib.AsyncExitStack() as stack:
        clients = [await stack.enter_async_context(session()) for _ in range(4)]
        done = await asyncio.gather(*(c.turn(f"Hello number {i}.") for i, c in enumerate(clients)))
        assert len({d["response"]["id"] for d in done}) == 4
    replicas = replica_actors()
    assert len(replicas) == 2
    assert {c.replica for c in clients} <= set(replicas)


@inside
@pytest.mark.timeout(240)
async def test_a_removed_replica_leaves_the_other_serving_and_new_sessions_succeed(cluster):
    import ray

    wait_for_running_replicas(2)
    replicas = replica_actors()
    async with contextlib.AsyncExitStack() as stack:
        placed = await sessions_on_every_replica(stack, set(replicas))
        doomed, kept = sorted(placed)
        ray.kill(replicas[doomed], no_restart=True)
        with pytest.raises(websockets.ConnectionClosed):
            while True:  # the killed replica's session is cut
                await placed[doomed].recv(timeout=30)
        await placed[kept].turn("Are you still there?")
        for _ in range(3):  # new sessions: the survivor (or Serve's replacement) serves them
            async with session() as fresh:
                assert fresh.replica != doomed
                await fresh.turn("A new session.")


@inside
@pytest.mark.timeout(240)
async def test_a_stopped_replica_drains_then_closes_its_session_clearly(cluster):
    """A new deployment of the app with one replica: Serve stops the old replicas one after another, each
    gracefully (a rolling update: ``serve.run`` from code deploys a new version)."""
    from ray import serve

    wait_for_running_replicas(2)
    async with contextlib.AsyncExitStack() as stack:
        placed = await sessions_on_every_replica(stack, set(replica_actors()))
        started = time.monotonic()
        redeploy = asyncio.create_task(asyncio.to_thread(serve.run, _serve_app(cluster, 1), name=APP_NAME))
        # the first replica Serve stops takes no new sessions; its session runs on for the grace period, then is
        # closed by the drain with a clear code, before Serve's own shutdown timeout
        closed = await _first_closed(placed, timeout_s=GRACE_S + 30)
        elapsed = time.monotonic() - started
        ws = placed[closed].ws
        assert (ws.close_code, ws.close_reason) == (1001, "server shutting down")
        assert elapsed >= GRACE_S, elapsed
        await redeploy
        async with session() as fresh:
            assert fresh.replica not in placed
            await fresh.turn("A new session after the redeploy.")


async def _first_closed(placed: dict[str, Session], timeout_s: float) -> str:
    """The replica id of the first session whose connection closes (each session only reads)."""

    async def read_until_closed(replica: str) -> str:
        with contextlib.suppress(websockets.ConnectionClosed):
            while True:
                await placed[replica].ws.recv()
        return replica

    tasks = [asyncio.create_task(read_until_closed(r)) for r in placed]
    done, pending = await asyncio.wait(tasks, timeout=timeout_s, return_when=asyncio.FIRST_COMPLETED)
    for task in pending:
        task.cancel()
    await asyncio.gather(*pending, return_exceptions=True)
    assert done, f"no session closed within {timeout_s} s of the scale-down"
    return next(iter(done)).result()
