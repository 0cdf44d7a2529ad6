"""Bounded loopback soak of ``omni-realtime serve``: many concurrent sessions for a few minutes with
random barge-ins, cancels, truncations, bad events and abrupt disconnects, while the server's
memory, tasks and engine state are sampled from ``/metrics``.

The server runs as a subprocess on 127.0.0.1 (default: the embedded tiny random-weight model, with
short replies so that a CPU keeps up); the clients run here. Each of ``--sessions`` workers opens a
session, plays one random scenario, leaves (politely or with a TCP reset) and starts over, until
``--duration`` seconds have passed. Everything is bounded: the run stops by itself (workers get a
grace period, then the server gets SIGTERM, then SIGKILL), and nothing leaves the loopback.

Memory and task counts are read before the load (``baseline``, idle), every ``--sample-s`` seconds
during it (the first ``--warmup-s`` seconds of load, 60 % of it by default, are the warm-up: the
allocator's pools and torch's caches grow to the working set of this load, which with 50 sessions on
the tiny model takes three to four minutes; ``warm`` is the last sample of it) and after it once
every session has ended
(``after``). Exit status 0 when the server holds nothing of any session at the end (session tasks,
engine conversations, responses, KV positions, queued events), its event-loop tasks and open files
are back to their idle counts, its resident memory grew less than ``--max-rss-growth-mb`` from
``warm`` to ``after``, no wait timed out and the server exited cleanly.

    python scripts/soak.py --sessions 50 --duration 300 --json soak.json
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import os
import random
import re
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
import wave
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import websockets
import yaml

REPO = Path(__file__).resolve().parent.parent
SPEECH = REPO / "tests" / "fixtures" / "speech"
FRAME_BYTES = 24_000 * 2 // 10  # 100 ms of pcm16 at 24 kHz

GAUGES = {
    "rss_mb": "omni_realtime_process_resident_memory_bytes",
    "open_fds": "omni_realtime_process_open_fds",
    "session_tasks": "omni_realtime_session_tasks",
    "loop_tasks": "omni_realtime_event_loop_tasks",
    "outbound_events": "omni_realtime_outbound_events",
    "sessions": 'omni_realtime_sessions_active{transport="websocket"}',
    "engine_conversations": "omni_realtime_engine_conversations",
    "engine_responses": "omni_realtime_engine_responses",
    "engine_open_audio": "omni_realtime_engine_open_audio_messages",
    "kv_thinker": 'omni_realtime_engine_kv_positions{stage="thinker"}',
    "kv_talker": 'omni_realtime_engine_kv_positions{stage="talker"}',
}
"""What is sampled from /metrics (name here: Prometheus sample)."""
HELD = (
    "session_tasks",
    "outbound_events",
    "sessions",
    "engine_conversations",
    "engine_responses",
    "engine_open_audio",
    "kv_thinker",
    "kv_talker",
)
"""Per-session resources: all zero once every session has ended."""


# --- the server ---------------------------------------------------------------------------------


def short_reply_stage_config(folder: Path, text_tokens: int, codec_tokens: int) -> Path:
    """The packaged stage graph with short replies (random weights rarely stop by themselves)."""
    import pipeline

    config = yaml.safe_load((Path(pipeline.__file__).parent / "stage_configs" / "qwen2_5_omni.yaml").read_text())
    config["stages"]["thinker"]["max_tokens"] = text_tokens
    config["stages"]["talker"]["max_tokens"] = codec_tokens
    path = folder / "soak_stages.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


class Server:
    """``omni-realtime serve`` on a free loopback port; its output collected by a thread."""

    def __init__(self, args: argparse.Namespace, folder: Path) -> None:
        stages = short_reply_stage_config(folder, args.max_text_tokens, args.max_codec_tokens)
        command = [
            sys.executable,
            "-m",
            "realtime.cli.main",
            "--log-level",
            "info",
            "serve",
            "--host",
            "127.0.0.1",
            "--port",
            "0",
            "--no-webrtc",
            "--stage-config",
            str(stages),
            "--cache-dir",
            str(folder),
            "--max-sessions",
            str(2 * args.sessions),
            "--seed",
            str(args.seed),
        ]
        # (twice the clients: a client that left may reconnect before the server has freed its slot)
        if args.model:
            command += ["--model", args.model]
        env = os.environ | {"OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
        self.process = subprocess.Popen(
            command, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        self.lines: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()
        self.url = self._wait_for_url(timeout=180)

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.append(line)

    def _wait_for_url(self, timeout: float) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and self.process.poll() is None:
            for line in list(self.lines):
                found = re.search(r"Uvicorn running on (http://\S+)", line)
                if found:
                    return found.group(1)
            time.sleep(0.1)
        self.process.kill()
        raise SystemExit("the server did not start:\n" + "".join(self.lines))

    def stop(self, timeout: float = 60) -> int:
        """SIGTERM, then SIGKILL if it does not exit in time; its exit status."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        try:
            return self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            return self.process.wait()


async def scrape(url: str) -> dict[str, float]:
    """The :data:`GAUGES` from one ``GET /metrics`` (plain HTTP/1.0 over a socket)."""
    host, port = url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(f"GET /metrics HTTP/1.0\r\nHost: {host}\r\n\r\n".encode())
    body = (await asyncio.wait_for(reader.read(), 30)).decode()
    writer.close()
    values = {}
    for name, sample in GAUGES.items():
        found = re.search(r"^" + re.escape(sample) + r" ([0-9.e+-]+)$", body, re.MULTILINE)
        values[name] = float(found.group(1)) if found else float("nan")
    values["rss_mb"] /= 1 << 20
    return values


# --- the clients --------------------------------------------------------------------------------


@dataclass
class Tally:
    sessions: int = 0
    events_sent: int = 0
    events_received: int = 0
    faults: Counter = field(default_factory=Counter)
    errors: Counter = field(default_factory=Counter)
    responses: Counter = field(default_factory=Counter)
    timeouts: int = 0
    refused: int = 0
    """Connections refused with 1013 (session limit)."""

    def as_dict(self) -> dict:
        return {name: dict(value) if isinstance(value, Counter) else value for name, value in vars(self).items()}


def _pcm(name: str) -> bytes:
    with wave.open(str(SPEECH / name)) as wav:
        return wav.readframes(wav.getnframes())


class Session:
    """One client session: sends count, received events are tallied (errors by code, responses by
    status)."""

    def __init__(self, ws, tally: Tally, wait_s: float) -> None:
        self.ws = ws
        self.tally = tally
        self.wait_s = wait_s

    async def send(self, event: dict | str) -> None:
        await self.ws.send(event if isinstance(event, str) else json.dumps(event))
        self.tally.events_sent += 1

    async def until(self, *types: str) -> dict:
        async with asyncio.timeout(self.wait_s):
            while True:
                event = json.loads(await self.ws.recv())
                self.tally.events_received += 1
                if event["type"] == "error":
                    self.tally.errors[event["error"]["code"]] += 1
                elif event["type"] == "response.done":
                    self.tally.responses[event["response"]["status"]] += 1
                if event["type"] in types:
                    return event

    async def audio(self, pcm: bytes) -> None:
        for i in range(0, len(pcm), FRAME_BYTES):
            chunk = base64.b64encode(pcm[i : i + FRAME_BYTES]).decode()
            await self.send({"type": "input_audio_buffer.append", "audio": chunk})


BAD_EVENTS = [
    "{not json",
    "[1, 2, 3]",
    "[" * 5000,
    json.dumps({"type": "conversation.nonsense"}),
    json.dumps({"type": "input_audio_buffer.append", "audio": "%%%"}),
    json.dumps({"type": "input_audio_buffer.commit"}),
    json.dumps({"type": "conversation.item.delete", "item_id": "ghost"}),
    json.dumps({"type": "response.cancel"}),
    json.dumps({"type": "session.update", "session": {"type": "realtime", "audio": {"output": {"voice": "Nobody"}}}}),
    json.dumps({"type": "response.create", "response": {"max_output_tokens": 10**6}}),
]


def _user_text(rng: random.Random) -> dict:
    text = rng.choice(["Hello!", "What is the capital of France?", "Tell me a joke.", "Count to five."])
    return {
        "type": "conversation.item.create",
        "item": {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]},
    }


async def text_turn(s: Session, rng: random.Random) -> None:
    await s.send(_user_text(rng))
    modalities = rng.choice([["text"], ["audio"]])
    await s.send({"type": "response.create", "response": {"output_modalities": modalities}})
    await s.until("response.done")


async def spoken_turn_with_barge_in(s: Session, rng: random.Random) -> None:
    """Server VAD turn; the user talks over the reply (a barge-in), then ends that turn too."""
    speech = rng.choice(["capital_of_france.wav", "short_joke.wav", "weather_today.wav", "count_to_five.wav"])
    await s.audio(_pcm(speech) + bytes(FRAME_BYTES * 8))
    first = await s.until("response.output_audio.delta", "response.done")
    s.tally.faults["barge_in"] += 1
    await s.audio(_pcm("short_joke.wav")[: 24_000 * 2 * 3 // 2])  # speech only: the turn stays open
    if first["type"] != "response.done":  # the reply was still coming: the barge-in ends it
        done = await s.until("response.done")
        if done["response"]["status"] == "cancelled" and done["response"]["output"]:
            item = done["response"]["output"][0]["id"]
            await s.send({"type": "conversation.item.truncate", "item_id": item, "content_index": 0, "audio_end_ms": 0})
    await s.audio(bytes(FRAME_BYTES * 8))  # the interrupting turn ends and gets its own reply
    await s.until("response.done")


async def cancel_turn(s: Session, rng: random.Random) -> None:
    await s.send(_user_text(rng))
    await s.send({"type": "response.create"})
    await s.until("response.created")
    s.tally.faults["client_cancel"] += 1
    await s.send({"type": "response.cancel"})
    await s.until("response.done")


async def bad_events(s: Session, rng: random.Random) -> None:
    for message in rng.sample(BAD_EVENTS, k=rng.randint(2, 5)):
        s.tally.faults["bad_event"] += 1
        await s.send(message)
        await s.until("error")
    await text_turn(s, rng)  # the session still works


async def leave_mid_response(s: Session, rng: random.Random) -> None:
    await s.send(_user_text(rng))
    await s.send({"type": "response.create"})
    await s.until("response.output_audio_transcript.delta", "response.output_audio.delta", "response.done")
    if rng.random() < 0.5:
        s.tally.faults["disconnect_close"] += 1
        await s.ws.close()
    else:
        s.tally.faults["disconnect_reset"] += 1
        sock = s.ws.transport.get_extra_info("socket")
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        s.ws.transport.abort()  # RST: no close frame, no FIN


SCENARIOS = [(text_turn, 3), (spoken_turn_with_barge_in, 2), (cancel_turn, 2), (bad_events, 2), (leave_mid_response, 2)]


async def worker(ws_url: str, deadline: float, rng: random.Random, tally: Tally, args: argparse.Namespace) -> None:
    scenarios, weights = zip(*[(s, w) for s, w in SCENARIOS if not args.scenario or s.__name__ in args.scenario])
    wait_s = args.wait_s
    while time.monotonic() < deadline:
        scenario = rng.choices(scenarios, weights)[0]
        try:
            async with websockets.connect(ws_url, max_size=None, open_timeout=wait_s) as ws:
                session = Session(ws, tally, wait_s)
                await session.until("session.created")
                tally.sessions += 1
                await scenario(session, rng)
        except TimeoutError:
            tally.timeouts += 1
        except websockets.ConnectionClosed as closed:
            if closed.rcvd is not None and closed.rcvd.code == 1013:
                tally.refused += 1
            elif scenario is not leave_mid_response:
                tally.faults["unexpected_close"] += 1


# --- the run ------------------------------------------------------------------------------------


async def wait_idle(url: str, timeout: float) -> dict[str, float]:
    """Sample until nothing of any session is held (or ``timeout``); the last sample."""
    deadline = time.monotonic() + timeout
    while True:
        sample = await scrape(url)
        if all(sample[name] == 0 for name in HELD) or time.monotonic() > deadline:
            return sample
        await asyncio.sleep(1)


async def soak(args: argparse.Namespace, server: Server) -> dict:
    ws_url = server.url.replace("http://", "ws://") + "/v1/realtime"
    tally = Tally()
    rng = random.Random(args.seed)
    baseline = await scrape(server.url)
    started = time.monotonic()
    deadline = started + args.duration
    workers = [
        asyncio.create_task(worker(ws_url, deadline, random.Random(rng.random()), tally, args))
        for _ in range(args.sessions)
    ]
    series = []
    while not all(w.done() for w in workers):
        await asyncio.wait(workers, timeout=args.sample_s)
        series.append({"t": round(time.monotonic() - started, 1)} | await scrape(server.url))
        if time.monotonic() > deadline + args.grace_s:
            for w in workers:
                w.cancel()
    await asyncio.gather(*workers, return_exceptions=True)
    load_s = time.monotonic() - started
    after = await wait_idle(server.url, 60)
    warmup_s = args.warmup_s if args.warmup_s is not None else 0.6 * args.duration
    warm = [s for s in series if s["t"] <= warmup_s] or series[:1]
    peak = {name: max(s[name] for s in series) for name in GAUGES}
    return {
        "tally": tally.as_dict(),
        "baseline": baseline,
        "warm": warm[-1],
        "peak": peak,
        "after": after,
        "series": series,
        "load_s": round(load_s, 1),
    }


def verdict(result: dict, exit_status: int, log: str, args: argparse.Namespace) -> list[str]:
    """What is wrong (empty: the soak passed)."""
    baseline, after = result["baseline"], result["after"]
    problems = [f"{name} = {after[name]:g} after the load" for name in HELD if after[name] != 0]
    if after["loop_tasks"] > baseline["loop_tasks"]:
        problems.append(f"event-loop tasks {baseline['loop_tasks']:g} -> {after['loop_tasks']:g}")
    if after["open_fds"] > baseline["open_fds"] + 2:
        problems.append(f"open files {baseline['open_fds']:g} -> {after['open_fds']:g}")
    growth = after["rss_mb"] - result["warm"]["rss_mb"]
    if growth > args.max_rss_growth_mb:
        problems.append(f"resident memory grew {growth:.0f} MB (limit {args.max_rss_growth_mb} MB)")
    if result["tally"]["timeouts"]:
        problems.append(f"{result['tally']['timeouts']} waits timed out")
    if result["tally"]["faults"].get("unexpected_close"):
        problems.append(f"{result['tally']['faults']['unexpected_close']} sessions closed unexpectedly")
    if exit_status != 0 or "Traceback" in log:
        traceback = " with a traceback in its log" if "Traceback" in log else ""
        problems.append(f"server exit status {exit_status}{traceback}")
    return problems


def report(result: dict, problems: list[str], args: argparse.Namespace) -> str:
    t = result["tally"]
    lines = [
        f"soak: {args.sessions} concurrent sessions for {args.duration:g} s (load ran {result['load_s']} s), "
        f"seed {args.seed}",
        f"sessions {t['sessions']}, client events sent {t['events_sent']}, "
        f"server events received {t['events_received']}",
        f"faults injected: {dict(t['faults'])}",
        f"errors returned: {sum(t['errors'].values())} {dict(t['errors'])}",
        f"responses: {dict(t['responses'])}; waits timed out: {t['timeouts']}; refused (1013): {t['refused']}",
        "",
        "| | " + " | ".join(GAUGES) + " |",
        "|---|" + "---|" * len(GAUGES),
    ]
    for label in ("baseline", "warm", "peak", "after"):
        row = result[label]
        cells = [f"{row[name]:.0f}" if row.get(name) == row.get(name) else "-" for name in GAUGES]  # NaN: absent
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    lines.append("")
    lines.append("PASS" if not problems else "FAIL: " + "; ".join(problems))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sessions", type=int, default=50, help="concurrent client sessions")
    parser.add_argument("--duration", type=float, default=300.0, help="seconds of load")
    parser.add_argument("--grace-s", type=float, default=120.0, help="then workers are cancelled")
    parser.add_argument("--wait-s", type=float, default=120.0, help="longest wait for one server event")
    parser.add_argument("--sample-s", type=float, default=10.0, help="/metrics sampling period")
    parser.add_argument(
        "--warmup-s", type=float, default=None, help="first seconds of load: the warm-up (default: 60 %% of --duration)"
    )
    parser.add_argument(
        "--scenario",
        action="append",
        choices=[s.__name__ for s, _ in SCENARIOS],
        help="play only these scenarios (repeat; default: all, weighted)",
    )
    parser.add_argument("--model", default=None, help="checkpoint folder (default: the embedded tiny model)")
    parser.add_argument("--max-text-tokens", type=int, default=16)
    parser.add_argument("--max-codec-tokens", type=int, default=60)
    parser.add_argument("--max-rss-growth-mb", type=float, default=64.0)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--json", type=Path, default=None, help="write the whole result (series included) here")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="soak-") as folder:
        server = Server(args, Path(folder))
        try:
            result = asyncio.run(soak(args, server))
        finally:
            status = server.stop()
    log = "".join(server.lines)
    problems = verdict(result, status, log, args)
    print(report(result, problems, args))
    if args.json is not None:
        args.json.write_text(json.dumps(result | {"problems": problems, "server_exit": status}, indent=1))
    return 0 if not problems else 1


if __name__ == "__main__":
    sys.exit(main())
