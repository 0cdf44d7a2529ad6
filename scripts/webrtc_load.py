"""Which side lags under many WebRTC users: the server's media path, or the benchmark's simulated peers?

Serves a fast fake engine (``tests.fakes.FakeEngine``: every reply ``--reply-s`` seconds of tone, produced faster
than real time, so the engine is never the bottleneck) with the server's real media path: aiortc (SRTP, RTP, jitter
buffer, Opus decode and encode), resampling, batched silero VAD, the paced output track. The simulated users of
``omni-realtime bench`` (``realtime.bench``) talk to it, spread over ``--client-processes`` worker processes, at each
``--users`` level. Per level it prints, for each side:

- CPU per user: the process's CPU seconds (every thread) per user per second of the level (``%`` of one core; the
  server's split into its event-loop thread and the other threads, where aiortc decodes and encodes Opus; with
  ``--media-workers N`` the calls' media runs in N worker processes, whose CPU is shown apart);
- event-loop lag p50 / p99 / max (ms, :mod:`realtime.observe.loop_lag`): how late a sleeping task woke; a loop with
more work
  than time shows lag that grows with the level;
- the server's input delay (``realtime_webrtc_input_delay_seconds``): how far the microphone audio fell behind its
  own stream clock before reaching the session; the users' end of turn (real end of speech → ``speech_stopped``,
  the VAD's silence window included) and voice-to-voice, p50 / p95; and the turns whose playback starved (the bench's
  player model) with the longest starvation.

``--profile FILE`` also profiles the server's event-loop thread (cProfile) and writes its time per stage per user
per second of media (SRTP, RTP and jitter buffer, DTLS/ICE/SCTP, VAD, resampling, session and protocol, asyncio)
with the top functions. Run from the repository root:

    python scripts/webrtc_load.py --users 1,2,4 --turns 2                       # this machine
    python scripts/webrtc_load.py --users 1,2,4 --turns 2 --media-workers 0     # media on the server's loop
    python scripts/webrtc_load.py --users 16,32 --client-processes 8 --media-workers 8 --turns 2  # a 16-core host
    python scripts/webrtc_load.py --users 16,32 --transport ws --client-processes 8 --turns 2
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import io
import json
import os
import pstats
import sys
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from realtime.bench.client import ClientOptions, ClientTransport  # noqa: E402
from realtime.bench.metrics import summarize  # noqa: E402
from realtime.bench.speech import DEFAULT_FOLDER, load_speech_folder  # noqa: E402
from realtime.bench.sweep import SweepPlan, run_sweep  # noqa: E402
from realtime.config import ServerConfig  # noqa: E402
from realtime.server.app import create_app, serve_in_background  # noqa: E402
from tests.fakes import FakeEngine, Script  # noqa: E402

CHUNK_MS = 40
IDLE = "method 'poll' of 'select.epoll' objects"

STAGES = (
    ("srtp", ("pylibsrtp", "srtp")),
    ("udp send / receive", ("_socket.socket",)),
    ("audio level of sent frames", ("compute_audio_level_dbov",)),
    (
        "thread hand-offs (encode executor, decoder queue)",
        ("_thread.lock", "SimpleQueue", "concurrent/futures", "threading"),
    ),
    ("rtp + jitter buffer", ("aiortc/rtp.py", "aiortc/jitterbuffer.py", "aiortc/rtcrtpreceiver.py")),
    ("rtp send + opus encode dispatch", ("aiortc/rtcrtpsender.py", "aiortc/codecs")),
    ("dtls / ice / sctp", ("aiortc/rtcdtlstransport.py", "aioice", "aiortc/rtcsctptransport.py", "OpenSSL", "crypt")),
    ("vad", ("realtime/vad", "realtime/turns/server_vad.py", "torch", "silero")),
    ("resample + pcm", ("realtime/media/audio.py", "realtime/transports/media.py", "numpy", "scipy", "soxr")),
    (
        "session + protocol",
        ("realtime/session", "realtime/runner/", "realtime/protocol", "pydantic", "json", "base64"),
    ),
    ("transport glue", ("realtime/transports/webrtc/", "realtime/transports/input_delay.py", "prometheus")),
    ("fake engine", ("tests/fakes.py",)),
    ("asyncio + selectors", ("asyncio", "selectors", "socket")),
)


@dataclass
class ServerSample:
    cpu_s: float
    loop_thread_cpu_s: float
    media_workers_cpu_s: float
    """CPU seconds of the server's media worker processes (0 without workers)."""
    wall_s: float
    input_delay: list[tuple[float, float]]
    """Cumulative bucket counts of the input-delay histogram (upper bound, count)."""


def _snapshot(app) -> ServerSample:
    histogram = app.state.realtime.metrics.webrtc_input_delay
    buckets = [
        (float(s.labels["le"]), s.value)
        for metric in histogram.collect()
        for s in metric.samples
        if s.name.endswith("_bucket")
    ]
    return ServerSample(time.process_time(), time.thread_time(), _media_workers_cpu_s(app), time.monotonic(), buckets)


def _media_workers_cpu_s(app) -> float:
    """CPU seconds (user + system) of the server's live media worker processes, from /proc."""
    pool = getattr(app.state.webrtc, "pool", None)
    if pool is None:
        return 0.0
    ticks = os.sysconf("SC_CLK_TCK")
    total = 0.0
    for link in pool.workers.values():
        fields = Path(f"/proc/{link.process.pid}/stat").read_text().rsplit(")", 1)[1].split()
        total += (int(fields[11]) + int(fields[12])) / ticks  # utime, stime (fields 14 and 15 of stat)
    return total


def _percentile_bound(before: list, after: list, q: float) -> str:
    """The histogram bucket bound holding the q-quantile of what was observed between two snapshots."""
    counts = [(le, a - b) for (le, a), (_, b) in zip(after, before, strict=True)]
    total = counts[-1][1] if counts else 0
    if not total:
        return "–"
    for le, cumulative in counts:
        if cumulative >= q * total:
            return "> 5000" if le == float("inf") else f"≤ {le * 1000:g}"
    return "–"


def _stage_times(stats: pstats.Stats) -> dict[str, float]:
    out = {name: 0.0 for name, _ in STAGES} | {"other": 0.0}
    for (filename, _line, function), (_cc, _nc, tottime, _ct, _callers) in stats.stats.items():
        where = f"{filename}:{function}"
        if IDLE in where:
            continue  # the loop waiting for I/O: idle, not work
        for name, needles in STAGES:
            if any(needle in where for needle in needles):
                out[name] += tottime
                break
        else:
            out["other"] += tottime
    return out


def _fake_engine(reply_s: float, speed: float) -> FakeEngine:
    chunks = max(1, round(reply_s * 1000 / CHUNK_MS))
    script = Script(text=tuple(f" w{i}" for i in range(30)), audio_chunks=chunks, delay_s=CHUNK_MS / 1000 / speed / 2)
    return FakeEngine(default_script=script)


async def _main(args: argparse.Namespace) -> dict:
    levels = tuple(int(x) for x in args.users.split(","))
    speeches = load_speech_folder(args.wavs, max_seconds=args.max_wav_s)
    plan = SweepPlan(levels, turns=args.turns, min_samples=0, ramp_s=args.ramp_s, warmup_turns=1)
    options = ClientOptions(ClientTransport(args.transport), turn_timeout_s=120.0)
    config = ServerConfig(
        host="127.0.0.1",
        port=0,
        max_sessions=max(levels) + 1,
        webrtc=args.transport == "webrtc",
        ice_host_addresses=("127.0.0.1",),
        media_workers=args.media_workers,
        log_level="warning",
    )
    app = create_app(config, engine=_fake_engine(args.reply_s, args.engine_speed))
    profiler = cProfile.Profile() if args.profile else None
    rows = []
    state: dict = {}

    async def counters():
        # called as each level's users start (no engine counters: None); the window ends in on_level
        app.state.realtime.loop_lag.reset()
        state["before"] = _snapshot(app)
        if profiler is not None:
            profiler.enable()
        return None

    def on_level(level) -> None:
        if profiler is not None:
            profiler.disable()
        before, after = state.pop("before"), _snapshot(app)
        wall = after.wall_s - before.wall_s
        users = level.concurrency
        cpu, loop_cpu = after.cpu_s - before.cpu_s, after.loop_thread_cpu_s - before.loop_thread_cpu_s
        shares = level.client_processes
        client_cpu = sum(s["cpu_s"] for s in shares)
        client_wall = max(s["wall_s"] for s in shares)
        worst = max(shares, key=lambda s: s["loop_lag_ms"]["p99_ms"])["loop_lag_ms"]
        lag = app.state.realtime.loop_lag.summary()
        summary = summarize(level.turns)
        row = {
            "users": users,
            "transport": args.transport,
            "client_processes": len(shares),
            "server_cpu_pct_per_user": round(100 * cpu / wall / users, 2),
            "server_loop_thread_cpu_pct_per_user": round(100 * loop_cpu / wall / users, 2),
            "media_workers": config.media_worker_count if config.webrtc else 0,
            "media_workers_cpu_pct_per_user": round(
                100 * (after.media_workers_cpu_s - before.media_workers_cpu_s) / wall / users, 2
            ),
            "server_loop_lag_ms": lag.to_dict(),
            "server_input_delay_ms_p50": _percentile_bound(before.input_delay, after.input_delay, 0.5),
            "server_input_delay_ms_p99": _percentile_bound(before.input_delay, after.input_delay, 0.99),
            "client_cpu_pct_per_user": round(100 * client_cpu / client_wall / users, 2),
            "client_loop_lag_ms_worst_process": worst,
            "end_of_turn_ms_p50_p95": [summary["end_of_turn_ms"].p50, summary["end_of_turn_ms"].p95],
            "voice_to_voice_ms_p50_p95": [summary["voice_to_voice_ms"].p50, summary["voice_to_voice_ms"].p95],
            "turns_with_underruns": f"{sum(1 for t in level.turns if t.underruns)} of {len(level.turns)}",
            "starved_ms_max": max((t.starved_ms or 0.0 for t in level.turns), default=0.0),
            "statuses": sorted({t.status for t in level.turns}),
        }
        if profiler is not None:
            stats = pstats.Stats(profiler)
            media_s = wall * users
            row["server_loop_ms_per_user_per_media_s"] = {
                k: round(1000 * v / media_s, 2) for k, v in _stage_times(stats).items()
            }
            text = io.StringIO()
            pstats.Stats(profiler, stream=text).sort_stats("tottime").print_stats(25)
            Path(args.profile).with_suffix(f".{users}users.txt").write_text(text.getvalue())
            profiler.clear()
        rows.append(row)
        print(json.dumps(row), flush=True)

    async with serve_in_background(app, config) as url:
        await run_sweep(
            url,
            speeches,
            plan,
            options,
            on_level=on_level,
            counters=counters,
            client_processes=args.client_processes,
        )
    return {"levels": rows}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--users", default="1,2,4", help="comma-separated users per level")
    p.add_argument("--transport", choices=("webrtc", "ws"), default="webrtc")
    p.add_argument("--client-processes", type=int, default=1, help="worker processes of the simulated users")
    p.add_argument(
        "--media-workers",
        type=int,
        default=None,
        help="the server's WebRTC media worker processes (0: media on the server's event loop; default: serve's)",
    )
    p.add_argument("--turns", type=int, default=2)
    p.add_argument("--reply-s", type=float, default=8.0, help="seconds of audio in every reply")
    p.add_argument("--engine-speed", type=float, default=5.0, help="the fake engine's speed, × real time")
    p.add_argument("--ramp-s", type=float, default=1.0)
    p.add_argument("--wavs", type=Path, default=DEFAULT_FOLDER)
    p.add_argument("--max-wav-s", type=float, default=5.0)
    p.add_argument("--profile", default=None, help="profile the server's loop thread; per-level top functions here")
    p.add_argument("--json", type=Path, default=None, help="also write the rows here")
    args = p.parse_args()
    result = asyncio.run(_main(args))
    if args.json is not None:
        args.json.write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
