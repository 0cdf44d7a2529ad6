"""``omni-realtime`` command line: serve, demo, make-tiny-model, bench.

Every option maps onto a typed config object; nothing is read from environment variables here
except what the standard libraries themselves honour.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from operator import attrgetter
from pathlib import Path
from typing import TYPE_CHECKING

from pipeline.errors import PipelineError
from realtime.cli.flags import HelpFormatter, count, ms_or_off, positive_float, positive_int, voice_alias
from realtime.cli.preflight import UsageError

if TYPE_CHECKING:  # imported lazily at run time: `--help` and `demo` need no server stack
    from realtime.config import ServerConfig

log = logging.getLogger("omni-realtime")

TRACE_LEVEL = 5
"""``--log-level trace``: uvicorn's level below DEBUG (every message of every connection)."""


def _setup_torch_threads(threads: int | None) -> None:
    if threads:
        import torch

        torch.set_num_threads(threads)


DEMO_OUT = Path("demo_out") / "reply.wav"
"""``demo``'s default output file, in a folder ``.gitignore`` covers (like the bench's ``bench_out``)."""


def cmd_demo(args: argparse.Namespace) -> int:
    """Run one turn (text or a spoken WAV) through the streaming pipeline and write the reply to a WAV; print the
    reply's text, then its status (with the reason when not completed) and where the audio went. Every input is
    checked before the model loads."""
    from realtime.cli.preflight import check_audio_file, check_model, check_output_file, check_stage_config

    if args.input_wav is not None:
        check_audio_file(args.input_wav)
    check_model(args.model)
    check_stage_config(args.stage_config)
    check_output_file(args.out)

    from pipeline.embedded import resolve_model
    from pipeline.engine import OmniEngine

    _setup_torch_threads(args.threads)
    engine = OmniEngine.from_pretrained(
        resolve_model(args.model, args.cache_dir), args.stage_config, seed=args.seed, torch_threads=args.threads or None
    )
    try:
        done = asyncio.run(_demo_turn(engine, args))
    finally:
        engine.close()
    return 0 if done.status.value in ("completed", "incomplete") else 1


async def _demo_turn(engine, args: argparse.Namespace):
    """The demo's one turn on ``engine``: the reply's text printed as it comes, its audio written to ``args.out``
    (nothing written when the model answers in text only); returns the ``ResponseDone``."""
    import numpy as np
    import soundfile as sf

    from pipeline.response_events import OUTPUT_SAMPLE_RATE, AudioChunk, TextDelta

    conv = engine.conversation()
    if args.input_wav:
        pcm, rate = sf.read(args.input_wav, dtype="float32", always_2d=True)
        await conv.add_audio("user_1", _to_16k(pcm.mean(axis=1), rate))
    else:
        await conv.add_text("user_1", args.text)
    start = time.perf_counter()
    first_audio = None
    chunks = []
    modalities = frozenset({"text", "audio"}) if engine.audio_output else frozenset({"text"})
    reply = conv.respond(
        item_id="reply_1", modalities=modalities, voice=args.voice, max_output_tokens=args.max_output_tokens
    )
    with _logs_held():  # the reply's text is one line (stdout): a record (stderr) would land inside it
        async for ev in reply:
            if isinstance(ev, TextDelta):
                print(ev.text, end="", flush=True)
            elif isinstance(ev, AudioChunk):
                first_audio = first_audio or time.perf_counter() - start
                chunks.append(ev.pcm)
            else:
                done = ev
        print(flush=True)
    status = done.status.value + (f" ({done.reason})" if done.reason else "")
    if not engine.audio_output:
        print(f"{status}: {done.usage.output_text_tokens} text tokens (the model answers in text only)")
        await conv.close()
        return done
    audio = np.concatenate(chunks) if chunks else np.zeros(0, np.float32)
    sf.write(args.out, audio, OUTPUT_SAMPLE_RATE, subtype="PCM_16")
    first = f"{first_audio * 1000:.0f} ms" if first_audio else "n/a"
    print(
        f"{status}: {len(audio) / OUTPUT_SAMPLE_RATE:.2f} s of audio written to {args.out} "
        f"(first audio after {first}; {done.usage.output_text_tokens} text and "
        f"{done.usage.output_audio_tokens} audio tokens)"
    )
    await conv.close()
    return done


@contextmanager
def _logs_held() -> Iterator[None]:
    """The root logger's handlers hold every record emitted inside (by any thread) and write them, in order, when
    it ends."""
    held: list[tuple[logging.Handler, logging.LogRecord]] = []

    def hold(handler: logging.Handler):
        def keep_for_later(record: logging.LogRecord) -> bool:
            held.append((handler, record))
            return False  # not now

        return keep_for_later

    holds = {handler: hold(handler) for handler in logging.getLogger().handlers}
    for handler, keep in holds.items():
        handler.addFilter(keep)
    try:
        yield
    finally:
        for handler, keep in holds.items():
            handler.removeFilter(keep)
        for handler, record in held:
            handler.handle(record)


def _to_16k(pcm, rate: int):
    import numpy as np

    if rate == 16000:
        return pcm.astype(np.float32)
    import soxr

    return soxr.resample(pcm, rate, 16000).astype(np.float32)


def server_config(args: argparse.Namespace) -> ServerConfig:
    """The :class:`realtime.config.ServerConfig` of ``serve``'s flags (``ValueError`` if invalid, ``UsageError``
    for an unreadable ``--api-key-file``)."""
    from dataclasses import replace

    from realtime.cli.preflight import UsageError
    from realtime.config import ServerConfig
    from realtime.media.images import ImageLimits
    from realtime.media.video_settings import CameraSettings
    from realtime.server.limits import RateLimit
    from realtime.turns.model_settings import TurnModelSettings
    from realtime.voices import with_aliases

    defaults = ServerConfig()
    api_key = args.api_key
    if args.api_key_file is not None:
        try:
            api_key = args.api_key_file.read_text(encoding="utf-8").strip()
        except OSError as exc:
            raise UsageError(f"--api-key-file {args.api_key_file}: {exc.strerror}") from None
    if (args.image_max_bytes + 2) // 3 * 4 > args.max_message_bytes:
        raise UsageError(
            f"--image-max-bytes {args.image_max_bytes}: a picture that large is a data URI of "
            f"{(args.image_max_bytes + 2) // 3 * 4} bytes, over --max-message-bytes {args.max_message_bytes}"
        )
    return ServerConfig(
        host=args.host,
        port=args.port,
        api_key=api_key,
        max_sessions=args.max_sessions,
        max_sessions_per_engine=args.max_sessions_per_engine,
        data_parallel_size=args.data_parallel_size,
        max_message_bytes=args.max_message_bytes,
        allowed_origins=tuple(args.allowed_origins) if args.allowed_origins else None,
        model=args.model,
        stage_config=args.stage_config,
        cache_dir=args.cache_dir,
        seed=args.seed,
        torch_threads=args.threads or defaults.torch_threads,
        preemptive_response_ms=args.preemptive_response_ms,
        semantic_vad=replace(defaults.semantic_vad, score_after_ms=args.semantic_score_after_ms),
        turn_model=TurnModelSettings(
            enabled=not args.no_turn_model,
            threads=args.turn_model_threads,
            max_batch=args.turn_model_batch,
            max_waiting=args.turn_model_queue,
        ),
        voice_aliases=with_aliases(defaults.voice_aliases, args.voice_aliases),
        ice_host_addresses=tuple(args.ice_hosts),
        webrtc=not args.no_webrtc,
        media_workers=args.media_workers,
        session_limits=replace(defaults.session_limits, max_buffer_ms=args.max_buffer_ms),
        image_limits=ImageLimits(
            max_bytes=args.image_max_bytes,
            max_pixels=args.image_max_pixels,
            low_detail_pixels=args.image_low_detail_pixels,
            high_detail_pixels=args.image_high_detail_pixels,
        ),
        camera=CameraSettings(fps=args.camera_fps, max_pixels=args.camera_max_pixels),
        rate_limit=RateLimit(
            events_per_second=args.events_per_second,
            burst=args.event_burst,
            audio_bytes_per_second=args.audio_bytes_per_second,
            audio_burst_bytes=args.audio_burst_bytes,
        ),
        web_demo_dir=args.web_demo_dir,
        ssl_certfile=args.ssl_certfile,
        ssl_keyfile=args.ssl_keyfile,
        ssl_keyfile_password=args.ssl_keyfile_password,
        ssl_ca_certs=args.ssl_ca_certs,
        log_level=args.log_level.lower(),
        ws_implementation=args.ws,
    )


def cmd_serve(args: argparse.Namespace) -> int:
    """Serve the OpenAI Realtime API (WebSocket, WebRTC, web demo) until interrupted. The options, the model,
    the stage config and the port are checked before the model loads."""
    from realtime.cli.preflight import check_model, check_port_free, check_stage_config, check_tls

    try:
        config = server_config(args)
    except ValueError as exc:  # ServerConfig's own checks name the setting
        raise UsageError(str(exc)) from None
    check_tls(config.ssl_certfile, config.ssl_keyfile, config.ssl_keyfile_password, config.ssl_ca_certs)
    check_model(config.model)
    check_stage_config(config.stage_config)
    check_port_free(config.host, config.port)
    from realtime.server.app import run_server

    try:
        run_server(config)
    except KeyboardInterrupt:  # uvicorn re-raises Ctrl-C after its graceful shutdown: the normal way out
        pass
    # Also after a plain return: a SIGINT that asyncio's runner turns into a cancel landing after the server's last
    # await ends it without the KeyboardInterrupt, and the server stopped all the same.
    log.info("stopped")
    return 0


def _serve_args(p: argparse.ArgumentParser) -> None:
    from realtime.config import WS_IMPLEMENTATIONS, ServerConfig

    d = ServerConfig()
    p.add_argument("--host", default=d.host, help="address to listen on; 0.0.0.0 listens on every interface")
    p.add_argument("--port", type=int, default=d.port, help="port to listen on; 0 picks a free one")
    p.add_argument(
        "--api-key",
        default=None,
        help="require this key from clients (an 'Authorization: Bearer KEY' header, or the browser's "
        "subprotocol openai-insecure-api-key.KEY); other users of the machine can read it in the process "
        "list: prefer --api-key-file (default: none, no key required)",
    )
    p.add_argument(
        "--api-key-file", type=Path, default=None, help="read the key from this file (default: none, no key required)"
    )
    p.add_argument(
        "--max-sessions",
        type=int,
        default=d.max_sessions,
        help="most sessions at once over every engine (WebSocket and WebRTC); one more is refused (WebSocket: an "
        "error event and close code 1013; WebRTC: HTTP 503)",
    )
    p.add_argument(
        "--max-sessions-per-engine",
        type=int,
        default=None,
        metavar="N",
        help="most sessions one engine serves at its latency goal (measure it with bench: docs/server.md, "
        "Admission); a session that finds every engine full is refused like one over --max-sessions "
        "(default: none, the engines share --max-sessions)",
    )
    p.add_argument(
        "--data-parallel-size",
        type=int,
        default=d.data_parallel_size,
        metavar="N",
        help="engines, one per GPU (cuda:0..N-1; on the CPU, N engines on the CPU), each in a process of its own; "
        "a session stays on the engine with the most headroom when it started",
    )
    p.add_argument(
        "--preemptive-response-ms",
        type=ms_or_off,
        default=d.preemptive_response_ms,
        metavar="MS|off",
        help="with server voice detection: start the reply after this much silence, shown to the client only once "
        "the user has stopped speaking (speaking on withdraws it); off: start it when the user stops speaking",
    )
    p.add_argument(
        "--voice-alias",
        dest="voice_aliases",
        action="append",
        type=voice_alias,
        default=[],
        metavar="NAME=SPEAKER",
        help="a client asking for voice NAME gets the model's speaker SPEAKER; repeat for more; adds to (or replaces "
        "an entry of) the default table, which maps OpenAI's voices to Chelsie (alloy, coral, marin, sage, shimmer) "
        "and Ethan (ash, ballad, cedar, echo, verse) (default: that table alone)",
    )
    p.add_argument(
        "--max-message-bytes",
        type=int,
        default=d.max_message_bytes,
        help="largest client message in bytes; a larger one is answered with an error event",
    )
    p.add_argument(
        "--max-buffer-ms",
        type=int,
        default=d.session_limits.max_buffer_ms,
        help="most input audio a session holds before the turn is committed, in milliseconds",
    )
    p.add_argument(
        "--events-per-second",
        type=float,
        default=d.rate_limit.events_per_second,
        help="client events other than audio appends allowed per second in a session; more are refused with an "
        "error event",
    )
    p.add_argument(
        "--event-burst",
        type=int,
        default=d.rate_limit.burst,
        help="client events other than audio appends allowed at once above that rate",
    )
    p.add_argument(
        "--audio-bytes-per-second",
        type=int,
        default=d.rate_limit.audio_bytes_per_second,
        help="input audio allowed per second in a session, counted in bytes of input_audio_buffer.append messages "
        "(base64 JSON: about 64000 bytes carry 1 s of pcm16 audio at 24 kHz)",
    )
    p.add_argument(
        "--audio-burst-bytes",
        type=int,
        default=d.rate_limit.audio_burst_bytes,
        help="input audio bytes allowed at once above that rate (a recorded utterance uploaded at full speed)",
    )
    p.add_argument(
        "--allowed-origin",
        dest="allowed_origins",
        action="append",
        default=None,
        help="a web page origin (https://host:port) allowed to connect from a browser; repeat for more "
        "(default: any origin)",
    )
    p.add_argument(
        "--ice-host",
        dest="ice_hosts",
        action="append",
        default=[],
        help="WebRTC: an address offered to browsers for the audio connection; repeat for more. ADDRESS, or "
        "PUBLIC@LOCAL behind a 1:1 NAT (the public address offered, the local one listened on) "
        "(default: this machine's own addresses, loopback excepted)",
    )
    p.add_argument(
        "--media-workers",
        type=count,
        default=d.media_workers,
        metavar="N",
        help="WebRTC: processes that carry the calls' media (encryption, Opus, resampling, pacing), spreading it "
        "over cores; 0 keeps it in the server's process (default: half the CPU cores, at most 8; none below 4 cores)",
    )
    p.add_argument("--no-webrtc", action="store_true", help="turn WebRTC off (POST /v1/realtime/calls)")
    _turn_model_args(p, d)
    _picture_args(p, d)
    p.add_argument(
        "--web-demo-dir",
        type=Path,
        default=None,
        help="folder of static files served at / (default: the packaged web demo)",
    )
    _tls_args(p)
    p.add_argument(
        "--ws",
        choices=WS_IMPLEMENTATIONS,
        default=d.ws_implementation,
        help="uvicorn's WebSocket implementation; websockets is its older one, deprecated",
    )


def _turn_model_args(p: argparse.ArgumentParser, d: ServerConfig) -> None:
    """``serve``'s options for ``semantic_vad``'s turn model (docs/server.md, semantic_vad)."""
    p.add_argument(
        "--no-turn-model",
        action="store_true",
        help="load no turn model: semantic_vad sessions end turns on silence alone, as server VAD would "
        "(default: the model loads when the first semantic_vad session starts)",
    )
    p.add_argument(
        "--turn-model-threads",
        type=positive_int,
        default=d.turn_model.threads,
        metavar="N",
        help="CPU threads of the turn model's calls (the cores also serve every session's audio and the engine)",
    )
    p.add_argument(
        "--turn-model-batch",
        type=positive_int,
        default=d.turn_model.max_batch,
        metavar="N",
        help="most sessions' turns one turn-model call scores",
    )
    p.add_argument(
        "--turn-model-queue",
        type=positive_int,
        default=d.turn_model.max_waiting,
        metavar="N",
        help="most turns waiting for the turn model; beyond it a turn is not scored and ends on silence alone "
        "(counted by turn_model_shed)",
    )
    p.add_argument(
        "--semantic-score-after-ms",
        type=count,
        default=d.semantic_vad.score_after_ms,
        metavar="MS",
        help="semantic_vad: silence after which the turn model is asked and a preemptive reply starts; at most "
        f"high eagerness's {d.semantic_vad.high.max_wait_ms} ms wait",
    )


_PICTURE_FLAGS = (
    (
        "--image-max-bytes",
        positive_int,
        "BYTES",
        "image_limits.max_bytes",
        "largest input_image picture accepted, in bytes of the image file (its data URI is a third larger: "
        "keep it under --max-message-bytes); a larger one is answered with an error event (image_too_large)",
    ),
    (
        "--image-max-pixels",
        positive_int,
        "PIXELS",
        "image_limits.max_pixels",
        "largest input_image picture accepted, in pixels (width x height), checked before it is decoded",
    ),
    (
        "--image-low-detail-pixels",
        positive_int,
        "PIXELS",
        "image_limits.low_detail_pixels",
        "an input_image with detail 'low' is downscaled to at most this many pixels; the model reads one "
        "token per 28x28 pixels",
    ),
    (
        "--image-high-detail-pixels",
        positive_int,
        "PIXELS",
        "image_limits.high_detail_pixels",
        "an input_image with detail 'high' or 'auto' is downscaled to at most this many pixels (and never "
        "more than the checkpoint's own limit)",
    ),
    (
        "--camera-fps",
        positive_float,
        "FPS",
        "camera.fps",
        "WebRTC camera: frames a second kept for the model while the user speaks "
        "(default: the model's own rate, 2 for Qwen2.5-Omni)",
    ),
    (
        "--camera-max-pixels",
        positive_int,
        "PIXELS",
        "camera.max_pixels",
        "WebRTC camera: each kept frame is downscaled to at most this many pixels; the model reads one token "
        "per 28x28 pixels per pair of frames",
    ),
)
"""``serve``'s picture and camera options: flag, value type, metavar, the :class:`ServerConfig` setting that gives
its default, help."""


def _picture_args(p: argparse.ArgumentParser, d: ServerConfig) -> None:
    """``serve``'s options for pictures (``input_image`` items) and WebRTC cameras (docs/server.md, Pictures and
    the camera)."""
    for flag, kind, metavar, setting, text in _PICTURE_FLAGS:
        p.add_argument(flag, type=kind, default=attrgetter(setting)(d), metavar=metavar, help=text)


def _tls_args(p: argparse.ArgumentParser) -> None:
    """``serve``'s TLS options, named as uvicorn's and vLLM's."""
    p.add_argument(
        "--ssl-certfile",
        type=Path,
        default=None,
        help="serve https:// and wss:// with this certificate (PEM), for clients that require wss:// and browsers "
        "on other machines (microphone and camera need a secure page) (default: none, plain http:// and ws://)",
    )
    p.add_argument(
        "--ssl-keyfile",
        type=Path,
        default=None,
        help="the certificate's private key (PEM) (default: none, the key is in --ssl-certfile)",
    )
    p.add_argument(
        "--ssl-keyfile-password",
        default=None,
        help="the password of an encrypted private key; other users of the machine can read it in the process "
        "list (default: none, the key is not encrypted)",
    )
    p.add_argument(
        "--ssl-ca-certs",
        type=Path,
        default=None,
        help="CA certificates (PEM): every client must present a certificate one of them signed (mutual TLS) "
        "(default: none, clients present no certificate)",
    )


def cmd_bench(args: argparse.Namespace) -> int:
    """Latency benchmark: concurrent simulated users, optional reference, JSON/Markdown/PNG report.

    The benchmark's own parser reads its options (``args.rest``), so that building this parser, and
    serving, never import :mod:`realtime.bench`."""
    from realtime.bench.cli import main as bench_main

    return bench_main(args.rest, command_argv=args.argv)


FAMILY_NAMES = {"qwen2.5-omni": "qwen2_5_omni", "qwen3-omni": "qwen3_omni"}
"""``make-tiny-model --family`` values -> model families."""


def cmd_make_tiny_model(argv: list[str]) -> int:
    """A family's random checkpoint writer: ``--family`` (default the packaged family) picks it; the family's own
    options (``--out``, ``--preset``, ...) follow."""
    from pipeline.models import DEFAULT_FAMILY, family_of

    picker = argparse.ArgumentParser(add_help=False)
    picker.add_argument("--family", choices=sorted(FAMILY_NAMES), default=None)
    known, rest = picker.parse_known_args(argv)
    family = FAMILY_NAMES[known.family] if known.family else DEFAULT_FAMILY
    prog = "omni-realtime make-tiny-model" + (f" --family {known.family}" if known.family else "")
    return family_of(family).random_checkpoint_command(rest, prog=prog)


DESCRIPTION = (
    "omni-realtime: a real-time voice assistant server speaking the OpenAI Realtime API (WebSocket and WebRTC), "
    "and its tools. Without --model every command runs the embedded tiny model: random weights, built on first "
    "use, for trying things out (its replies are noise). 'omni-realtime COMMAND --help' lists a command's options."
)


def _model_args(p: argparse.ArgumentParser, threads_default: str) -> None:
    """The options of the commands that load a model (``serve``, ``demo``)."""
    p.add_argument(
        "--model",
        default=None,
        help="a checkpoint folder, or a Hugging Face model id (Org/Name) already downloaded with "
        "'hf download Org/Name'; nothing is downloaded here (default: the embedded tiny model)",
    )
    p.add_argument(
        "--stage-config",
        type=Path,
        default=None,
        help="the pipeline's settings file (YAML: devices, batch sizes, reply lengths) "
        "(default: the packaged one of the checkpoint's model family, pipeline/stage_configs/<family>.yaml)",
    )
    p.add_argument(
        "--cache-dir",
        type=Path,
        default=None,
        help="folder the embedded tiny model is built in on first use (default: ~/.cache/omni-realtime)",
    )
    p.add_argument("--threads", type=int, default=None, help=f"CPU threads of the model (default: {threads_default})")
    p.add_argument(
        "--seed",
        type=int,
        default=None,
        help="make replies repeatable: each reply's sampling is seeded from this number "
        "(default: none, every reply differs)",
    )


def _demo_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--text", default="Hello! Who are you?", help="what the user says, as text")
    p.add_argument(
        "--input-wav",
        type=Path,
        default=None,
        help="say this audio file (WAV, any sample rate) instead of --text (default: none, --text is used)",
    )
    p.add_argument("--voice", default=None, help="the reply's voice, one of the model's speakers (default: its first)")
    p.add_argument(
        "--max-output-tokens",
        type=int,
        default=None,
        help="cut the reply after this many text tokens; a cut reply ends as 'incomplete' "
        "(default: no limit but the pipeline's own cap)",
    )
    p.add_argument("--out", type=Path, default=DEMO_OUT, help="WAV file the spoken reply is written to")


def build_parser() -> argparse.ArgumentParser:
    from realtime.config import LOG_LEVELS

    parser = argparse.ArgumentParser(prog="omni-realtime", description=DESCRIPTION, formatter_class=HelpFormatter)
    parser.add_argument("--log-level", type=str.lower, choices=LOG_LEVELS, default="info", help="how much the log says")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    serve = sub.add_parser(
        "serve",
        help="the server: OpenAI Realtime API over WebSocket and WebRTC, and a web demo at /",
        description="Serve the OpenAI Realtime API over WebSocket (/v1/realtime) and WebRTC "
        "(/v1/realtime/calls), and a web demo at /, until Ctrl-C.",
        formatter_class=HelpFormatter,
    )
    _model_args(serve, threads_default="1, enough when the model runs on a GPU; raise it for a model on the CPU")
    _serve_args(serve)
    serve.set_defaults(func=cmd_serve)

    demo = sub.add_parser(
        "demo",
        help="one turn through the pipeline: a question in, the reply's text printed and its audio written to a WAV",
        description="One turn through the streaming pipeline: --text or --input-wav in; the reply's text is "
        "printed as it comes, its audio written to --out.",
        formatter_class=HelpFormatter,
    )
    _model_args(demo, threads_default="torch's own choice, about one per CPU core")
    _demo_args(demo)
    demo.set_defaults(func=cmd_demo)

    # the bench's options are its own parser's (see cmd_bench): `omni-realtime bench --help` lists them
    bench = sub.add_parser(
        "bench",
        add_help=False,
        help="latency benchmark: simulated users talk to a server at rising concurrency (see bench --help)",
    )
    bench.set_defaults(func=cmd_bench)

    sub.add_parser(
        "make-tiny-model",
        add_help=False,
        help="write a random-weight checkpoint folder: Qwen2.5-Omni, or Qwen3-Omni with --family qwen3-omni (see "
        "make-tiny-model --help)",
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    """The ``omni-realtime`` command: its exit status. Bad input is one ``error:`` line on stderr and status 2,
    no traceback."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["make-tiny-model"]:
        return cmd_make_tiny_model(argv[1:])
    parser = build_parser()
    args, rest = parser.parse_known_args(argv)
    if rest and args.command != "bench":
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    args.argv, args.rest = argv, rest
    level = TRACE_LEVEL if args.log_level == "trace" else args.log_level.upper()
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        return args.func(args)
    except (UsageError, PipelineError) as exc:  # bad input, the model's or the config's own checks: one clear line
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
