"""``omni-realtime bench``: options, and the run that ties server, users, reference and report.

Without ``--url`` the bench serves the model itself (uvicorn on a free loopback port, the users in a child
process; the engine core in a process of its own or on a thread, as the stage config's ``engine.process``
says, like ``serve``); with ``--url`` it measures a running server (which
must have been started with the same forced reply lengths, e.g. ``--stage-config
pipeline/stage_configs/bench_forced.yaml``, or ``bench_forced_qwen3_omni.yaml``, for the report's length and the
reference to be right). Stage throughput and device memory come from the in-process engine's counters, or from the
``--url`` server's ``/metrics`` ("–" in the report when it does not export them).

The default workload is a conversation: several turns per user (:data:`NORMAL`), each reply forced to
``--reply-s`` seconds of audio (8 by default), in the served family's codes (its ``codes_per_second``: 400
Qwen2.5-Omni codec tokens, 100 Qwen3-Omni frames) and text tokens in proportion (30 for 8 s); ``--codec-tokens`` and
``--text-tokens`` set either length exactly instead. The report states the length in seconds and in codes. A
``--url`` server's family is the one ``--model`` or ``--stage-config`` names, else the one its ``/healthz`` model
names when this machine can read that checkpoint's config; otherwise the report gives the length as asked. A run with
shorter replies or fewer turns (``--quick`` among them) says so in its report (``lighter workload: ...``), so its
figures are never read as the default's.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import functools
import logging
import os
import platform
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, TypedDict, TypeVar

from realtime.bench.goal import DEFAULT_P95_TTFA_MS, LatencyGoal
from realtime.bench.models import DEFAULT_REPLY_S, ReplyRequest

if TYPE_CHECKING:
    from realtime.bench.camera import CameraOptions

logger = logging.getLogger(__name__)
T = TypeVar("T")

DEFAULT_OUT = Path("bench_out")
DESCRIPTION = (
    "Latency benchmark: simulated users talk to a server at rising concurrency and the report gives time to first "
    "audio (TTFA), voice-to-voice latency, real-time factor (RTF: generation time / audio time), playback "
    "underruns and barge-in, optionally beside transformers' own generate as a reference. Writes results.json, "
    "report.md and PNG plots to --out. The default workload is a conversation: several turns per user, each reply "
    "forced to 8 seconds of audio (--reply-s) in the model family's codes; --quick, and shorter --reply-s, "
    "--text-tokens, --codec-tokens or --turns, are reported as a lighter workload."
)


@dataclass(frozen=True)
class BenchOptions:
    """The resolved options of one bench run (``--quick`` applied)."""

    url: str | None
    model: str | None
    device: str | None
    stage_config: Path | None
    text_tokens: int | None
    """``--text-tokens`` (or ``--quick``'s); None: in proportion to the reply's audio (:class:`ReplyRequest`)."""
    codec_tokens: int | None
    """``--codec-tokens``; None: :attr:`reply_s` sets the audio's length."""
    transport: str
    levels: tuple[int, ...]
    turns: int
    min_samples: int
    warmup_turns: int
    wavs: Path
    max_wav_s: float
    barge_in_every: int
    barge_in_after_ms: float
    ramp_s: float
    jitter_ms: float
    turn_timeout_s: float
    reference: bool
    out: Path
    threads: int
    seed: int
    api_key: str | None
    plots: bool
    preemptive_response_ms: int | None
    """The in-process server's ``ServerConfig.preemptive_response_ms`` (its default unless ``off``: None)."""
    pause_inside_ms: float | None
    transcription: bool = False
    data_parallel_size: int = 1
    """The bench's own server: engines, one per GPU, as ``serve --data-parallel-size``."""
    media_workers: int | None = None
    """The bench's own server: WebRTC media worker processes, as ``serve --media-workers`` (None: its default)."""
    client_processes: int = 1
    camera: CameraOptions | None = None
    """``--camera``: every user shows this camera; None: no camera."""
    goal: LatencyGoal = LatencyGoal()
    """The latency goal the report counts the users served at (``--goal-ms``)."""
    reply_s: float | None = None
    """``--reply-s`` (or the workload's default): each reply's audio in seconds, turned into the family's codes; None
    when ``--codec-tokens`` gives the length instead."""
    reference_levels: frozenset[int] | None = None
    """``--reference LEVELS``: the levels after which the reference serves the users' turns; None: every level."""

    @property
    def reply(self) -> ReplyRequest:
        """The forced reply length as asked (:meth:`ReplyRequest.resolve` gives it in a family's codes)."""
        return ReplyRequest(self.reply_s, self.codec_tokens, self.text_tokens)


class WorkloadDefaults(TypedDict):
    """What a run sets for the options left unset (:data:`QUICK`, :data:`NORMAL`)."""

    levels: tuple[int, ...]
    turns: int
    min_samples: int
    warmup_turns: int
    barge_in_every: int
    text_tokens: int | None
    reply_s: float
    max_wav_s: float
    ramp_s: float
    turn_timeout_s: float


QUICK: WorkloadDefaults = {
    "levels": (1,),
    "turns": 2,
    "min_samples": 0,
    "warmup_turns": 0,
    "barge_in_every": 1,
    "text_tokens": 4,
    "reply_s": 0.8,
    "max_wav_s": 5.0,
    "ramp_s": 0.0,
    "turn_timeout_s": 60.0,
}
"""``--quick``: one user, two turns (the first interrupted by the second), short replies: a smoke test, reported
as a lighter workload."""
NORMAL: WorkloadDefaults = {
    "levels": (1, 2, 4),
    "turns": 3,
    "min_samples": 8,
    "warmup_turns": 1,
    "barge_in_every": 0,
    "text_tokens": None,
    "reply_s": DEFAULT_REPLY_S,
    "max_wav_s": 10.0,
    "ramp_s": 1.0,
    "turn_timeout_s": 300.0,
}
"""The default workload: a conversation of several turns per user, each reply 8 seconds of audio (in the family's
codes: 400 Qwen2.5-Omni codec tokens, 100 Qwen3-Omni frames) and 30 text tokens, the lengths the bench's stage
configs (``bench_forced*.yaml``) force for a ``--url`` server."""


def build_parser() -> argparse.ArgumentParser:
    """The options of ``omni-realtime bench``."""
    from realtime.bench.models import default_reply_length
    from realtime.bench.speech import DEFAULT_FOLDER
    from realtime.cli.flags import HelpFormatter, count, ms_or_off
    from realtime.config import DEFAULT_PREEMPTIVE_RESPONSE_MS

    p = argparse.ArgumentParser(prog="omni-realtime bench", description=DESCRIPTION, formatter_class=HelpFormatter)
    qwen25, qwen3 = default_reply_length("qwen2_5_omni"), default_reply_length("qwen3_omni")
    p.add_argument(
        "--url",
        default=None,
        help="measure a running server (http://host:port or ws://host:port) (default: none, the bench serves "
        "--model itself)",
    )
    p.add_argument(
        "--model",
        default=None,
        help="a checkpoint folder, a Hugging Face model id already downloaded, or random:7b / random:tiny / "
        "random:qwen3-omni-30b-a3b / random:qwen3-omni-tiny (that architecture with random weights, built in memory) "
        "(default: the embedded tiny model)",
    )
    p.add_argument(
        "--device",
        default=None,
        help="run every part of the model on this device, e.g. cuda:0 or cpu (default: the settings file's)",
    )
    p.add_argument(
        "--stage-config",
        type=Path,
        default=None,
        help="the pipeline's settings file (YAML); the bench forces its replies' lengths (--reply-s) over the file's "
        "own (default: the family's pipeline/stage_configs/bench_forced*.yaml)",
    )
    p.add_argument(
        "--reply-s",
        type=float,
        default=None,
        metavar="SECONDS",
        help="forced length of each reply's audio in seconds, turned into the model family's codes (Qwen2.5-Omni: "
        f"50 codec tokens a second, {DEFAULT_REPLY_S:g} s = {qwen25.codec_tokens}; Qwen3-Omni: 12.5 frames a second, "
        f"{DEFAULT_REPLY_S:g} s = {qwen3.codec_tokens}), with text tokens in proportion ({qwen25.text_tokens} for "
        f"{DEFAULT_REPLY_S:g} s) unless --text-tokens; not with --codec-tokens. Shorter than the default is reported "
        f"as a lighter workload (default: {DEFAULT_REPLY_S:g}; --quick: {QUICK['reply_s']:g})",
    )
    p.add_argument(
        "--text-tokens",
        type=int,
        default=None,
        help="forced length of each reply's text, in tokens, instead of the one in proportion to the audio; shorter "
        f"than the default is reported as a lighter workload (default: {qwen25.text_tokens} for "
        f"{DEFAULT_REPLY_S:g} s of audio; --quick: {QUICK['text_tokens']})",
    )
    p.add_argument(
        "--codec-tokens",
        type=int,
        default=None,
        help="forced length of each reply's audio in the family's codes instead of --reply-s (Qwen2.5-Omni: codec "
        "tokens, 50 a second; Qwen3-Omni: frames, 12.5 a second); shorter than the default is reported as a "
        "lighter workload (default: --reply-s's)",
    )
    p.add_argument(
        "--transport", choices=("ws", "webrtc"), default="ws", help="how the users connect: WebSocket or WebRTC"
    )
    p.add_argument(
        "--concurrency",
        default=None,
        help="comma-separated numbers of simultaneous users, one measured level each "
        f"(default: {','.join(map(str, NORMAL['levels']))})",
    )
    p.add_argument(
        "--turns",
        type=int,
        default=None,
        help="turns per user, one conversation each; fewer than the default is reported as a lighter workload "
        f"(default: {NORMAL['turns']})",
    )
    p.add_argument(
        "--min-samples",
        type=int,
        default=None,
        help="at least this many measured turns per level in all: low levels run more turns per user "
        f"(default: {NORMAL['min_samples']})",
    )
    p.add_argument(
        "--warmup-turns",
        type=int,
        default=None,
        help=f"unmeasured turns before the first level (default: {NORMAL['warmup_turns']})",
    )
    p.add_argument(
        "--wavs",
        type=Path,
        default=DEFAULT_FOLDER,
        help="folder of spoken WAV files the users say (any sample rate, mono or not) "
        "(default: the repository's tests/fixtures/speech)",
    )
    p.add_argument(
        "--max-wav-s",
        type=float,
        default=None,
        help=f"leave out WAV files longer than this many seconds (default: {NORMAL['max_wav_s']:g})",
    )
    p.add_argument(
        "--barge-in-every",
        type=int,
        default=None,
        help="every K-th turn the user talks over the reply with its next utterance; 0: never "
        f"(default: {NORMAL['barge_in_every']})",
    )
    p.add_argument(
        "--barge-in-after-ms",
        type=float,
        default=300.0,
        help="on barge-in turns the user starts speaking this many milliseconds after the reply starts playing at the "
        "client, whether or not the reply is still being generated",
    )
    p.add_argument(
        "--ramp-s",
        type=float,
        default=None,
        help=f"the users' starts spread over this many seconds (default: {NORMAL['ramp_s']:g})",
    )
    p.add_argument(
        "--jitter-ms",
        type=float,
        default=60.0,
        help="the simulated audio player's buffer, in milliseconds: audio arriving later than that is an underrun",
    )
    p.add_argument(
        "--goal-ms",
        type=float,
        default=DEFAULT_P95_TTFA_MS,
        help="the latency goal of the report's 'users at the goal' line: the p95 time to first audio after "
        "speech_stopped, in milliseconds, with no turn having underruns",
    )
    p.add_argument(
        "--turn-timeout-s",
        type=float,
        default=None,
        help=f"longest wait for one reply, in seconds (default: {NORMAL['turn_timeout_s']:g})",
    )
    p.add_argument(
        "--reference",
        nargs="?",
        const="all",
        default=None,
        metavar="LEVELS",
        help="also answer the same turns with transformers' own generate (Qwen2.5-Omni or Qwen3-Omni, the same forced "
        "lengths), one request at a time, after each level (or only after the comma-separated LEVELS, e.g. 1), "
        "for comparison; at 1 user the latency table gets a 'transformers reference' row (request -> its only "
        "audio). It runs in the bench's process: with the engine core in a child process (engine.process) that is "
        "a second copy of the weights (default: no reference)",
    )
    p.add_argument(
        "--quick",
        action="store_true",
        help="a quick check: 1 user, 2 turns (the first interrupted by the second), replies of 4 text tokens and "
        f"{QUICK['reply_s']:g} s of audio, no warm-up; reported as a lighter workload",
    )
    p.add_argument("--out", type=Path, default=DEFAULT_OUT, help="folder for results.json, report.md and the plots")
    p.add_argument("--no-plots", action="store_true", help="write no PNG plots")
    p.add_argument("--threads", type=int, default=1, help="CPU threads of the model")
    p.add_argument(
        "--data-parallel-size",
        type=int,
        default=1,
        metavar="N",
        help="the bench's own server runs N engines, one per GPU (cuda:0..N-1), each in a process of its own, as "
        "serve --data-parallel-size does; stage throughput is their sum",
    )
    p.add_argument(
        "--media-workers",
        type=count,
        default=None,
        metavar="N",
        help="the bench's own server: processes carrying the WebRTC calls' media, as serve --media-workers "
        "(default: serve's default)",
    )
    p.add_argument(
        "--preemptive-response-ms",
        type=ms_or_off,
        default=DEFAULT_PREEMPTIVE_RESPONSE_MS,
        metavar="MS|off",
        help="the bench's own server starts a reply after this much silence, shown to the client only once the "
        "user has stopped speaking; off: when the user stops speaking (the figure other servers publish). TTFA "
        "counts from the end of speech either way; the report says which. Not with --url: start that server with "
        "serve --preemptive-response-ms",
    )
    p.add_argument(
        "--pause-inside-ms",
        type=float,
        default=None,
        metavar="MS",
        help="insert MS milliseconds of silence mid-sentence (at a word gap) into every utterance: users who pause "
        "once and go on; with --preemptive-response-ms below MS each turn withdraws one reply (default: none)",
    )
    p.add_argument(
        "--transcription",
        action="store_true",
        help="every user turns input audio transcription on (audio.input.transcription in its session.update); "
        "the report counts the transcription events received",
    )
    p.add_argument(
        "--client-processes",
        type=int,
        default=1,
        metavar="N",
        help="spread each level's simulated users over N worker processes, each with its own event loop (users "
        "dealt round-robin): a WebRTC user costs its process Opus, SRTP and RTP work every 20 ms, and the report's "
        "client loop lag shows when the users fell behind",
    )
    _camera_arguments(p)
    _turn_taking_arguments(p)
    p.add_argument("--seed", type=int, default=0, help="seed of the replies' sampling, for repeatable runs")
    p.add_argument("--api-key", default=None, help="the key a --url server requires (default: none, no key sent)")
    return p


DEFAULT_CAMERA_SIZE = "640x480"
DEFAULT_CAMERA_FPS = 5.0
"""The simulated camera's rate: above the server's sampling rate (2 a second), a third of a browser camera's, so that
the users' VP8 encoding stays a small load (``--camera-fps`` sends more)."""


def _camera_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--camera",
        action="store_true",
        help="every user shows a camera (a moving test pattern): over WebRTC a video track beside the microphone, "
        "sampled and downscaled by the server; over WebSocket one input_image item (a JPEG still, shrunk to the "
        "server's camera pixel budget) sent when each turn's speech starts. The report counts the frames the server "
        "received and the image tokens in the replies' usage",
    )
    p.add_argument(
        "--camera-size",
        default=DEFAULT_CAMERA_SIZE,
        metavar="WxH",
        help="the camera's frame size in pixels (even numbers)",
    )
    p.add_argument(
        "--camera-fps",
        type=float,
        default=DEFAULT_CAMERA_FPS,
        help="frames a second of the WebRTC camera track (the server keeps its own rate of them, 2 a second by "
        "default; each sent frame costs the user's process a VP8 encode and the server a decode)",
    )


TURN_TRIALS = 24
"""``--turn-taking``'s trials per measure: every fixture sentence once."""
QUICK_TURN_TRIALS = 1
TURN_REPLY_S = 3.0
"""``--turn-taking``'s reply audio in seconds (unless ``--reply-s`` or ``--codec-tokens``): long enough to talk over
``--barge-in-after-ms`` into it; the first audio, which the latency measures, comes before the length matters."""
QUICK_TURN_REPLY_S = 1.5


def _turn_taking_arguments(p: argparse.ArgumentParser) -> None:
    from realtime.bench.turn_bench import EAGERNESS

    p.add_argument(
        "--turn-taking",
        action="store_true",
        help="instead of the latency sweep, Full-Duplex-Bench's three turn-taking measures on the espeak-ng "
        "fixtures (realtime/bench/turn_fixtures.py), one user, each --turn-detection setting in turn: reply latency "
        "(end of speech → first reply audio), pause takeover (share of 0.6–1.2 s mid-sentence pauses where the "
        "server takes the turn) and interruption stop (speech onset over a reply → the reply stops). Writes "
        "turn_taking.json and turn_taking.md to --out; needs espeak-ng and sox",
    )
    p.add_argument(
        "--turn-detection",
        default=None,
        metavar="TYPES",
        help="--turn-taking: comma-separated turn_detection types the sessions ask for, one report row each "
        "(default: server_vad,semantic_vad)",
    )
    p.add_argument(
        "--silence-ms",
        type=int,
        default=None,
        metavar="MS",
        help="--turn-taking: server_vad's silence_duration_ms (default: 500)",
    )
    p.add_argument(
        "--eagerness",
        choices=EAGERNESS,
        default=None,
        help="--turn-taking: semantic_vad's eagerness (default: auto)",
    )
    p.add_argument(
        "--turn-fixtures",
        type=Path,
        default=None,
        metavar="DIR",
        help="--turn-taking: play the clips of this folder (written by `python -m realtime.bench.turn_fixtures DIR`) "
        "instead of rendering them with espeak-ng and sox, e.g. on a machine without them (default: render them)",
    )
    p.add_argument(
        "--turn-trials",
        type=int,
        default=None,
        metavar="N",
        help=f"--turn-taking: trials per measure and setting (default: {TURN_TRIALS}, every sentence once; "
        f"--quick: {QUICK_TURN_TRIALS})",
    )


def _camera(args: argparse.Namespace) -> CameraOptions | None:
    """``--camera`` with its size and rate; ``ValueError`` on a malformed size."""
    from realtime.bench.camera import CameraOptions

    width, sep, height = args.camera_size.partition("x")
    if not sep or not width.isdigit() or not height.isdigit():
        raise ValueError(f"--camera-size must be WIDTHxHEIGHT in pixels, e.g. 640x480, got {args.camera_size!r}")
    options = CameraOptions(int(width), int(height), args.camera_fps)
    return options if args.camera else None


def main(argv: list[str], *, command_argv: list[str] | None = None) -> int:
    """``omni-realtime bench ARGV``; ``command_argv`` (default: ``bench`` + ``argv``) is the command line
    the report quotes."""
    args = build_parser().parse_args(argv)
    return run(args, command_argv if command_argv is not None else ["bench", *argv])


def resolve_options(args: argparse.Namespace) -> BenchOptions:
    """Apply ``--quick`` (or the normal defaults) to the options left unset; ``ValueError`` on
    nonsense."""
    base = QUICK if args.quick else NORMAL

    def pick(default: T, value: T | None) -> T:
        return default if value is None else value

    levels = base["levels"] if args.concurrency is None else _levels(args.concurrency)
    if args.client_processes < 1:
        raise ValueError(f"--client-processes must be at least 1, got {args.client_processes}")
    if args.reply_s is not None and args.codec_tokens is not None:
        raise ValueError("--reply-s and --codec-tokens both set the reply's audio: give one of them")
    _check_preemptive(args)
    text_tokens = pick(base["text_tokens"], args.text_tokens)
    reply_s = None if args.codec_tokens is not None else pick(base["reply_s"], args.reply_s)
    ReplyRequest(reply_s, args.codec_tokens, text_tokens)  # the length's own checks, before any model loads
    return BenchOptions(
        url=args.url,
        model=args.model,
        device=args.device,
        stage_config=args.stage_config,
        text_tokens=text_tokens,
        codec_tokens=args.codec_tokens,
        reply_s=reply_s,
        transport=args.transport,
        levels=levels,
        turns=pick(base["turns"], args.turns),
        min_samples=pick(base["min_samples"], args.min_samples),
        warmup_turns=pick(base["warmup_turns"], args.warmup_turns),
        wavs=args.wavs,
        max_wav_s=pick(base["max_wav_s"], args.max_wav_s),
        barge_in_every=pick(base["barge_in_every"], args.barge_in_every),
        barge_in_after_ms=args.barge_in_after_ms,
        ramp_s=pick(base["ramp_s"], args.ramp_s),
        jitter_ms=args.jitter_ms,
        goal=LatencyGoal(args.goal_ms),
        turn_timeout_s=pick(base["turn_timeout_s"], args.turn_timeout_s),
        reference=args.reference is not None,
        reference_levels=_reference_levels(args.reference, levels),
        out=args.out,
        threads=args.threads,
        transcription=args.transcription,
        data_parallel_size=_data_parallel_size(args),
        media_workers=args.media_workers,
        client_processes=args.client_processes,
        camera=_camera(args),
        seed=args.seed,
        preemptive_response_ms=args.preemptive_response_ms,
        pause_inside_ms=args.pause_inside_ms,
        api_key=args.api_key,
        plots=not args.no_plots,
    )


def _check_preemptive(args: argparse.Namespace) -> None:
    """``--preemptive-response-ms`` sets the bench's own server: a ``--url`` server keeps the setting it was started
    with, so asking for another one there is refused rather than silently not applied."""
    from realtime.config import DEFAULT_PREEMPTIVE_RESPONSE_MS

    if args.url is not None and args.preemptive_response_ms != DEFAULT_PREEMPTIVE_RESPONSE_MS:
        raise ValueError(
            "--preemptive-response-ms is for the bench's own server: start the --url server with "
            "serve --preemptive-response-ms instead"
        )


def _reference_levels(value: str | None, levels: tuple[int, ...]) -> frozenset[int] | None:
    """``--reference [LEVELS]``: None for every level (``all``, or no reference); else the levels named, each one
    of ``levels``."""
    if value is None or value == "all":
        return None
    chosen = frozenset(_levels(value, flag="--reference"))
    if not chosen <= set(levels):
        raise ValueError(
            f"--reference {value}: levels {', '.join(map(str, sorted(chosen - set(levels))))} are not among the "
            f"measured levels ({', '.join(map(str, levels))})"
        )
    return chosen


def _data_parallel_size(args: argparse.Namespace) -> int:
    if args.data_parallel_size < 1:
        raise ValueError(f"--data-parallel-size must be >= 1, got {args.data_parallel_size}")
    if args.data_parallel_size > 1 and args.url is not None:
        raise ValueError("--data-parallel-size is for the bench's own server: start the --url server with it instead")
    return args.data_parallel_size


def _levels(text: str, *, flag: str = "--concurrency") -> tuple[int, ...]:
    try:
        levels = tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise ValueError(f"{flag} must be comma-separated integers, got {text!r}") from None
    if not levels or min(levels) < 1:
        raise ValueError(f"{flag} levels must be >= 1, got {text!r}")
    return levels


def run(args: argparse.Namespace, argv: list[str] | None = None) -> int:
    """The ``bench`` subcommand. Returns the exit status: 2 for bad options, inputs or model, 1 when
    the server could not be used."""
    from realtime.bench.client import BenchClientError
    from realtime.bench.models import BenchConfigError
    from realtime.bench.speech import SpeechFolderError, load_speech_folder, with_pause
    from realtime.bench.sweep import SweepPlan

    if args.turn_taking:
        return _turn_taking_main(args, argv)
    turn_only = ("turn_detection", "silence_ms", "eagerness", "turn_trials", "turn_fixtures")
    given = [f"--{name.replace('_', '-')}" for name in turn_only if getattr(args, name) is not None]
    if given:
        print(f"error: {', '.join(given)} go with --turn-taking", file=sys.stderr)
        return 2
    try:
        options = resolve_options(args)
        plan = SweepPlan(
            options.levels,
            options.turns,
            options.min_samples,
            options.barge_in_every,
            options.ramp_s,
            options.warmup_turns,
            warmup_users=options.data_parallel_size,
            reference_levels=options.reference_levels,
        )
        speeches = load_speech_folder(options.wavs, max_seconds=options.max_wav_s)
        if options.pause_inside_ms is not None:
            speeches = [with_pause(speech, options.pause_inside_ms) for speech in speeches]
    except (ValueError, SpeechFolderError) as exc:  # the options' and the folder's own checks
        print(f"error: {exc}", file=sys.stderr)
        return 2
    command = "omni-realtime " + shlex.join(argv if argv is not None else sys.argv[1:])
    try:
        return asyncio.run(_bench(options, plan, speeches, command))
    except BenchConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except BenchClientError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1


async def _bench(options: BenchOptions, plan, speeches, command: str) -> int:
    from realtime.bench.camera import scrape_camera_frames
    from realtime.bench.client import ClientOptions, ClientTransport
    from realtime.bench.models import reply_length, served_family, served_model
    from realtime.bench.report import REPORT_MD, where_written, write_report
    from realtime.bench.sweep import run_sweep
    from realtime.bench.throughput import engines_counters, scrape_counters

    family = _local_family(options)
    server_model = await asyncio.to_thread(served_model, options.url) if options.url is not None else None
    if family is None and server_model is not None:
        family = served_family(server_model)
    cfg = _stage_config(options, family) if family is not None else None
    length = reply_length(cfg) if cfg is not None else None
    client = ClientOptions(
        ClientTransport(options.transport),
        options.api_key,
        options.barge_in_after_ms,
        options.jitter_ms,
        turn_timeout_s=options.turn_timeout_s,
        transcription=options.transcription,
        camera=options.camera,
    )
    loaded = None
    if options.url is None or options.reference:
        assert cfg is not None, "a model the bench loads has a family (_local_family)"
        loaded = await asyncio.to_thread(_load, options, cfg)
    info = _run_info(options, command, length, loaded, family, server_model)
    results = []

    def on_level(level) -> None:
        results.append(level)
        write_report(options.out, info, results, plots=options.plots)

    reference = None
    if options.reference:
        from pipeline.models import family_of
        from realtime.bench.reference_generate import reference_generator

        assert loaded is not None and cfg is not None and length is not None, "loaded above for --reference"
        reference = reference_generator(loaded.ckpt, length, family_of(cfg.model_family))
    try:
        if options.url is not None:
            await run_sweep(
                options.url,
                speeches,
                plan,
                client,
                reference=reference,
                on_level=on_level,
                counters=functools.partial(scrape_counters, options.url),
                counters_source="metrics",
                client_processes=options.client_processes,
                camera_frames=functools.partial(scrape_camera_frames, options.url) if options.camera else None,
            )
        else:
            assert loaded is not None, "loaded above: no --url"
            async with _in_process_server(loaded.engines, options) as url:
                await run_sweep(
                    url,
                    speeches,
                    plan,
                    client,
                    reference=reference,
                    on_level=on_level,
                    counters=functools.partial(engines_counters, loaded.engines),
                    counters_source="engine",
                    client_processes=options.client_processes,
                    camera_frames=functools.partial(scrape_camera_frames, url) if options.camera else None,
                )
    finally:
        if loaded is not None:
            await asyncio.gather(*(asyncio.to_thread(engine.close) for engine in loaded.engines))
    info.load_average["end"] = list(os.getloadavg())
    paths = write_report(options.out, info, results, plots=options.plots)
    print((options.out / REPORT_MD).read_text(encoding="utf-8"))
    print(where_written(options.out, paths))
    return 0


def _local_family(options: BenchOptions) -> str | None:
    """The model family of what the bench loads or is told it measures: ``--stage-config``'s, else ``--model``'s
    (the embedded model's without one). None for a ``--url`` run that names neither and needs no model here (no
    reference): the server's family is then its ``/healthz``'s to tell."""
    from realtime.bench.models import bench_family

    if options.url is not None and options.model is None and options.stage_config is None and not options.reference:
        return None
    return bench_family(options.model, options.stage_config)


def _stage_config(options: BenchOptions, family: str | None = None):
    """The stage graph of ``family`` (default: the one ``--stage-config`` or ``--model`` names) with the forced reply
    length (:attr:`BenchOptions.reply` in the family's codes, over the stage config's own) and ``--device`` applied."""
    from pipeline.models import family_of
    from realtime.bench.models import bench_family, bench_stage_config

    family = family or bench_family(options.model, options.stage_config)
    length = options.reply.resolve(family_of(family).codes_per_second)
    return bench_stage_config(options.stage_config, device=options.device, length=length, family=family)


@dataclass
class _Loaded:
    ckpt: object | None
    """The reference's checkpoint in this process (``--reference`` only)."""
    engine: object | None
    """The first engine (``engines[0]``), None with ``--url``."""
    engines: tuple
    """The bench's own server's engines (``--data-parallel-size``); empty with ``--url``."""
    label: str
    device: str
    """The thinker's device in words."""


def _load(options: BenchOptions, cfg) -> _Loaded:
    import torch

    from realtime.bench.models import model_label, model_loader

    torch.set_num_threads(options.threads)
    loader = model_loader(options.model, family=cfg.model_family)
    engine = ckpt = None
    engines: list = []
    if options.url is None:
        from pipeline.engine import OmniEngine
        from realtime.engines.pool import check_devices, replica_configs, start_engines

        def start(replica_cfg):
            # with the engine core in a child process the child builds or loads the weights from the loader itself
            return OmniEngine.from_loader(loader, replica_cfg, seed=options.seed, torch_threads=options.threads)

        configs = replica_configs(cfg, options.data_parallel_size)
        check_devices(configs, torch.cuda.device_count)
        engines = start_engines(start, configs)
        engine = engines[0]
        ckpt = engine.ckpt
    if options.reference and ckpt is None:
        # transformers' generate runs in this process: it needs weights here, a second copy when the engine
        # core loaded its own in a child process
        if engine is not None:
            logger.warning(
                "--reference: the engine core runs in a child process (engine.process), so transformers' generate "
                "loads a second copy of the weights in the bench's process; a stage config with engine.process: "
                "off shares one copy"
            )
        ckpt = loader.load(cfg)
    if engine is not None:
        source, random_weights, device = engine.model_name, engine.random_weights, engine.facts.device_name
    else:
        assert ckpt is not None, "no engine (--url): loaded for --reference"
        source, random_weights, device = ckpt.source, ckpt.random_weights, _device_name(cfg.thinker.device)
    if len(engines) > 1:
        device = f"{len(engines)} engines, one on each of {len(engines)} × {device}"
    return _Loaded(
        ckpt if options.reference else None,
        engine,
        tuple(engines),
        model_label(options.model, cfg, source=source, random_weights=random_weights),
        device,
    )


def _in_process_server(engines, options: BenchOptions):
    from realtime.server.app import create_app, serve_in_background

    config = server_config(options)
    return serve_in_background(create_app(config, engines=engines), config)


def server_config(options: BenchOptions):
    """The settings of the bench's own server: serve's defaults but for what ``options`` set, on a free loopback
    port, room for the highest level's users."""
    from realtime.config import ServerConfig

    return ServerConfig(
        host="127.0.0.1",
        port=0,
        max_sessions=max(options.levels) + 1,
        webrtc=options.transport == "webrtc",
        ice_host_addresses=("127.0.0.1",),
        torch_threads=options.threads,
        log_level="warning",
        preemptive_response_ms=options.preemptive_response_ms,
        media_workers=options.media_workers,  # None: serve's default (ServerConfig.media_worker_count picks)
    )


def _run_info(
    options: BenchOptions,
    command: str,
    length,
    loaded: _Loaded | None,
    family: str | None,
    server_model: str | None = None,
):
    """The report's facts of a run; ``length`` (a :class:`ReplyLength`) and ``family`` are None for a ``--url``
    server whose family the bench does not know (the length as asked then); ``server_model``: the ``--url`` server's
    ``/healthz`` model."""
    from pipeline.models import DEFAULT_FAMILY
    from realtime.bench.models import Workload, default_reply_length
    from realtime.bench.report import RunInfo

    workload = Workload(length if length is not None else options.reply, options.turns)
    default = Workload(default_reply_length(family or DEFAULT_FAMILY), NORMAL["turns"])
    if loaded is not None:
        model = loaded.label
    else:
        model = f"the server at {options.url}" + (f", serving {server_model}" if server_model else "")
    return RunInfo(
        command=command,
        date=datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        model=model,
        device=loaded.device if loaded is not None else "the server's",
        transport=options.transport,
        server=_served_by(options, "users"),
        text_tokens=length.text_tokens if length is not None else options.text_tokens,
        codec_tokens=length.codec_tokens if length is not None else options.codec_tokens,
        reply_s=length.audio_s if length is not None else options.reply_s,
        codes_per_second=length.codes_per_second if length is not None else None,
        turns_per_user=options.turns,
        workload=workload.describe(),
        lighter_workload=workload.lighter_than(default),
        wavs=str(options.wavs)
        + (f", each with a {options.pause_inside_ms:g} ms pause inside" if options.pause_inside_ms is not None else ""),
        torch_threads=options.threads,
        load_average={"start": list(os.getloadavg())},
        versions=_versions(),
        transcription=options.transcription,
        camera=_camera_info(options),
        goal=options.goal.describe(),
        goal_p95_ttfa_ms=options.goal.p95_ttfa_ms,
    )


def _camera_info(options: BenchOptions) -> dict | None:
    """How the users showed their camera (``results.json`` info.camera; None: no camera)."""
    camera = options.camera
    if camera is None:
        return None
    if options.transport == "webrtc":
        how = f"WebRTC video track, {camera.describe()} (VP8), sampled by the server"
    else:
        how = "one input_image item (JPEG, detail low, on the server's camera pixel budget) at each turn's speech start"
    return {"width": camera.width, "height": camera.height, "fps": camera.fps, "sent_as": how}


def _device_name(device: str) -> str:
    import torch

    if device.startswith("cuda") and torch.cuda.is_available():
        return torch.cuda.get_device_name(torch.device(device))
    return f"CPU ({os.cpu_count()} cores, {platform.machine()})"


def _versions() -> dict[str, str]:
    import torch
    import transformers

    return {"python": platform.python_version(), "torch": torch.__version__, "transformers": transformers.__version__}


# --- --turn-taking ---------------------------------------------------------------------------------


def _turn_taking_main(args: argparse.Namespace, argv: list[str] | None) -> int:
    """``bench --turn-taking``: 2 for bad options, missing tools or model, 1 when the server could not be used."""
    from dataclasses import replace

    from realtime.bench.client import BenchClientError
    from realtime.bench.models import BenchConfigError, default_reply_length
    from realtime.bench.turn_bench import render_trials, turn_settings

    try:
        if args.reference:
            raise ValueError("--reference does not go with --turn-taking")
        options = resolve_options(args)
        if args.codec_tokens is None and args.reply_s is None:
            # the turn-taking replies' own length: shorter audio, the default workload's text
            text = options.text_tokens or default_reply_length().text_tokens
            options = replace(options, reply_s=QUICK_TURN_REPLY_S if args.quick else TURN_REPLY_S, text_tokens=text)
        types = [t.strip() for t in (args.turn_detection or "server_vad,semantic_vad").split(",") if t.strip()]
        settings = turn_settings(
            types,
            silence_ms=500 if args.silence_ms is None else args.silence_ms,
            eagerness=args.eagerness or "auto",
        )
        count = args.turn_trials if args.turn_trials is not None else QUICK_TURN_TRIALS if args.quick else TURN_TRIALS
        trials = render_trials(count, fixtures=args.turn_fixtures)
    except (ValueError, RuntimeError) as exc:  # the options' checks; espeak-ng or sox missing
        print(f"error: {exc}", file=sys.stderr)
        return 2
    command = "omni-realtime " + shlex.join(argv if argv is not None else sys.argv[1:])
    try:
        return asyncio.run(_turn_taking(options, settings, trials, command, quick=args.quick))
    except BenchConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except BenchClientError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1


async def _turn_taking(options: BenchOptions, settings, trials, command: str, *, quick: bool) -> int:
    from realtime.bench.client import ClientOptions, ClientTransport
    from realtime.bench.models import reply_length
    from realtime.bench.report import where_written
    from realtime.bench.turn_bench import run_turn_taking
    from realtime.bench.turn_report import TURN_MD, write_report

    cfg = _stage_config(options)
    length = reply_length(cfg)
    client = ClientOptions(
        ClientTransport(options.transport),
        options.api_key,
        options.barge_in_after_ms,
        options.jitter_ms,
        turn_timeout_s=options.turn_timeout_s,
    )
    loaded = await asyncio.to_thread(_load, options, cfg) if options.url is None else None
    try:
        if options.url is not None:
            results = await run_turn_taking(options.url, settings, trials, client)
        else:
            assert loaded is not None
            async with _in_process_server(loaded.engines, options) as url:
                results = await run_turn_taking(url, settings, trials, client)
    finally:
        if loaded is not None:
            await asyncio.gather(*(asyncio.to_thread(engine.close) for engine in loaded.engines))
    info = _turn_run_info(options, command, length, loaded, len(trials.complete), quick=quick)
    paths = write_report(options.out, info, results)
    print((options.out / TURN_MD).read_text(encoding="utf-8"))
    print(where_written(options.out, paths))
    return 0


def _turn_run_info(options: BenchOptions, command: str, length, loaded: _Loaded | None, trials: int, *, quick: bool):
    from realtime.bench.turn_fixtures import SENTENCES, VOICES
    from realtime.bench.turn_report import TurnRunInfo

    lighter = []
    if quick:
        lighter.append("--quick")
    if trials < TURN_TRIALS:
        lighter.append(f"{trials} trial{'s' * (trials > 1)} per measure, not {TURN_TRIALS}")
    if loaded is not None and "random" in loaded.label and "tiny" in loaded.label:
        lighter.append("the tiny model")
    return TurnRunInfo(
        command=command,
        date=datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        model=loaded.label if loaded is not None else f"the server at {options.url}",
        device=loaded.device if loaded is not None else "the server's",
        transport=options.transport,
        server=_served_by(options, "the user"),
        trials=trials,
        reply=f"{length.text_tokens} text and {length.codec_tokens} audio tokens ({length.audio_s:.1f} s), "
        f"talked over {options.barge_in_after_ms:g} ms into their first sound",
        fixtures=f"espeak-ng turn fixtures ({len(SENTENCES)} sentences × {len(VOICES)} voices, seed 45)",
        lighter_workload="; ".join(lighter) or None,
        versions=_versions(),
    )


def _served_by(options: BenchOptions, users: str) -> str:
    """The report's server line: the URL, or the in-process server with ``users`` in a child process and when replies
    start."""
    if options.url:
        return f"{options.url} (preemptive replies as that server was started)"
    if options.preemptive_response_ms is None:
        starts = "replies start at speech_stopped"
    else:
        starts = f"replies start on a {options.preemptive_response_ms} ms pause, shown at speech_stopped"
    return f"in process (uvicorn on loopback; {users} in a child process; {starts})"
