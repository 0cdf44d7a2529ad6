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
from pathlib import Path
from typing import TYPE_CHECKING

from realtime.flags import ms_or_off

if TYPE_CHECKING:  # imported lazily at run time: `--help` and `demo` need no server stack
    from realtime.config import ServerConfig

log = logging.getLogger("omni-realtime")


def _setup_torch_threads(threads: int | None) -> None:
    if threads:
        import torch

        torch.set_num_threads(threads)


def cmd_demo(args: argparse.Namespace) -> int:
    """Run one spoken turn through the streaming pipeline and write the reply to a WAV."""
    import numpy as np
    import soundfile as sf

    from pipeline.embedded import resolve_model
    from pipeline.engine import OmniEngine
    from pipeline.outputs import OUTPUT_SAMPLE_RATE, AudioChunk, ResponseDone, TextDelta

    _setup_torch_threads(args.threads)
    engine = OmniEngine.from_pretrained(
        resolve_model(args.model, args.cache_dir), args.stage_config, seed=args.seed, torch_threads=args.threads or None
    )

    async def run() -> ResponseDone:
        conv = engine.conversation()
        if args.input_wav:
            pcm, rate = sf.read(args.input_wav, dtype="float32", always_2d=True)
            pcm = _to_16k(pcm.mean(axis=1), rate)
            await conv.add_audio("user_1", pcm)
        else:
            await conv.add_text("user_1", args.text)
        start = time.perf_counter()
        first_audio = None
        chunks = []
        async for ev in conv.respond(item_id="reply_1", voice=args.voice, max_output_tokens=args.max_output_tokens):
            if isinstance(ev, TextDelta):
                print(ev.text, end="", flush=True)
            elif isinstance(ev, AudioChunk):
                first_audio = first_audio or time.perf_counter() - start
                chunks.append(ev.pcm)
            else:
                done = ev
        print()
        audio = np.concatenate(chunks) if chunks else np.zeros(0, np.float32)
        sf.write(args.out, audio, OUTPUT_SAMPLE_RATE, subtype="PCM_16")
        first = f"{first_audio * 1000:.0f} ms" if first_audio else "n/a"
        print(
            f"{done.status.value}: {len(audio) / OUTPUT_SAMPLE_RATE:.2f} s of audio -> {args.out} "
            f"(first audio after {first}, {done.usage.output_text_tokens} text / "
            f"{done.usage.output_audio_tokens} codec tokens)"
        )
        await conv.close()
        return done

    try:
        done = asyncio.run(run())
    finally:
        engine.close()
    return 0 if done.status.value in ("completed", "incomplete") else 1


def _to_16k(pcm, rate: int):
    import numpy as np

    if rate == 16000:
        return pcm.astype(np.float32)
    import soxr

    return soxr.resample(pcm, rate, 16000).astype(np.float32)


def server_config(args: argparse.Namespace) -> ServerConfig:
    """The :class:`realtime.config.ServerConfig` of ``serve``'s flags (``ValueError`` if invalid)."""
    from dataclasses import replace

    from realtime.config import ServerConfig
    from realtime.limits import RateLimit

    defaults = ServerConfig()
    api_key = args.api_key
    if args.api_key_file is not None:
        api_key = args.api_key_file.read_text(encoding="utf-8").strip()
    return ServerConfig(
        host=args.host,
        port=args.port,
        api_key=api_key,
        max_sessions=args.max_sessions,
        max_message_bytes=args.max_message_bytes,
        allowed_origins=tuple(args.allowed_origins) if args.allowed_origins else None,
        model=args.model,
        stage_config=args.stage_config,
        cache_dir=args.cache_dir,
        seed=args.seed,
        torch_threads=args.threads or defaults.torch_threads,
        vad_batching=not args.no_vad_batching,
        preemptive_response_ms=args.preemptive_response_ms,
        ice_host_addresses=tuple(args.ice_hosts),
        webrtc=not args.no_webrtc,
        session_limits=replace(defaults.session_limits, max_buffer_ms=args.max_buffer_ms),
        rate_limit=RateLimit(
            events_per_second=args.events_per_second,
            burst=args.event_burst,
            audio_bytes_per_second=args.audio_bytes_per_second,
            audio_burst_bytes=args.audio_burst_bytes,
        ),
        web_demo_dir=args.web_demo_dir,
        log_level=args.log_level.lower(),
        ws_implementation=args.ws,
    )


def cmd_serve(args: argparse.Namespace) -> int:
    """Serve the OpenAI Realtime API (WebSocket, WebRTC, web demo) until interrupted."""
    try:
        config = server_config(args)
    except (ValueError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    from realtime.server import run_server

    try:
        run_server(config)
    except KeyboardInterrupt:  # uvicorn re-raises Ctrl-C after its graceful shutdown: the normal way out
        log.info("stopped")
    return 0


def _serve_args(p: argparse.ArgumentParser) -> None:
    from realtime.config import WS_IMPLEMENTATIONS, ServerConfig

    d = ServerConfig()
    p.add_argument("--host", default=d.host)
    p.add_argument("--port", type=int, default=d.port)
    p.add_argument(
        "--api-key",
        default=None,
        help="require this key (Authorization: Bearer, or the browser subprotocol "
        "openai-insecure-api-key.<key>); other users can read it in the process list: "
        "prefer --api-key-file",
    )
    p.add_argument("--api-key-file", type=Path, default=None, help="read the key from this file")
    p.add_argument("--max-sessions", type=int, default=d.max_sessions, help="concurrent sessions")
    p.add_argument(
        "--no-vad-batching",
        action="store_true",
        help="one VAD call per frame per session instead of every session's frames in shared calls",
    )
    p.add_argument(
        "--preemptive-response-ms",
        type=ms_or_off,
        default=d.preemptive_response_ms,
        metavar="MS|off",
        help="server VAD: start the reply after this much silence, unseen until speech stops (speech "
        f"resuming withdraws it); default {d.preemptive_response_ms}; off: start it when speech stops",
    )
    p.add_argument(
        "--max-message-bytes",
        type=int,
        default=d.max_message_bytes,
        help="largest client message; larger ones get an error event",
    )
    p.add_argument(
        "--max-buffer-ms",
        type=int,
        default=d.session_limits.max_buffer_ms,
        help="most uncommitted input audio per session",
    )
    p.add_argument(
        "--events-per-second",
        type=float,
        default=d.rate_limit.events_per_second,
        help="client event rate per session, audio appends aside",
    )
    p.add_argument("--event-burst", type=int, default=d.rate_limit.burst, help="events allowed in a burst")
    p.add_argument(
        "--audio-bytes-per-second",
        type=int,
        default=d.rate_limit.audio_bytes_per_second,
        help="input audio rate per session, in bytes of append events (64000 = 1 s of pcm16 at 24 kHz a second)",
    )
    p.add_argument(
        "--audio-burst-bytes", type=int, default=d.rate_limit.audio_burst_bytes, help="input audio allowed in a burst"
    )
    p.add_argument(
        "--allowed-origin",
        dest="allowed_origins",
        action="append",
        default=None,
        help="browser origin allowed to connect (repeat; default: any)",
    )
    p.add_argument(
        "--ice-host",
        dest="ice_hosts",
        action="append",
        default=[],
        help="WebRTC: ICE host candidate (repeat): ADDRESS, or ANNOUNCED@BIND behind a 1:1 NAT "
        "(a public address announced, a local one bound)",
    )
    p.add_argument("--no-webrtc", action="store_true", help="disable POST /v1/realtime/calls")
    p.add_argument("--web-demo-dir", type=Path, default=None, help="static files served at / (default: packaged)")
    p.add_argument(
        "--ws", choices=WS_IMPLEMENTATIONS, default=d.ws_implementation, help="uvicorn WebSocket implementation"
    )


def cmd_bench(args: argparse.Namespace) -> int:
    """Latency benchmark: concurrent simulated users, optional reference, JSON/Markdown/PNG report.

    The benchmark's own parser reads its options (``args.rest``), so that building this parser, and
    serving, never import :mod:`realtime.bench`."""
    from realtime.bench.cli import main as bench_main

    return bench_main(args.rest, command_argv=args.argv)


def cmd_make_tiny_model(argv: list[str]) -> int:
    from pipeline.models.qwen2_5_omni.tiny import main as make_main

    return make_main(argv)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="omni-realtime", description=__doc__)
    parser.add_argument("--log-level", default="INFO")
    sub = parser.add_subparsers(dest="command", required=True)

    def model_args(p: argparse.ArgumentParser) -> None:
        p.add_argument(
            "--model",
            default=None,
            help="checkpoint folder or hub id already in the local cache; default: the embedded tiny "
            "random-weight model (built on first run)",
        )
        p.add_argument("--stage-config", type=Path, default=None, help="stage graph YAML (default: packaged)")
        p.add_argument("--cache-dir", type=Path, default=None, help="where the embedded tiny model is built")
        p.add_argument(
            "--threads",
            type=int,
            default=None,
            help="torch CPU threads of the engine (serve: default 1, enough for a GPU engine)",
        )
        p.add_argument("--seed", type=int, default=None)

    serve = sub.add_parser("serve", help="the realtime server: OpenAI Realtime API over WebSocket and WebRTC")
    model_args(serve)
    _serve_args(serve)
    serve.set_defaults(func=cmd_serve)

    demo = sub.add_parser("demo", help="one turn through the streaming pipeline, reply written to a WAV")
    model_args(demo)
    demo.add_argument("--text", default="Hello! Who are you?")
    demo.add_argument("--input-wav", type=Path, default=None, help="speak this WAV instead of --text")
    demo.add_argument("--voice", default=None)
    demo.add_argument("--max-output-tokens", type=int, default=64)
    demo.add_argument("--out", type=Path, default=Path("reply.wav"))
    demo.set_defaults(func=cmd_demo)

    # the bench's options are its own parser's (see cmd_bench): `omni-realtime bench --help` lists them
    bench = sub.add_parser(
        "bench",
        add_help=False,
        help="latency benchmark: concurrent simulated users (TTFA, voice-to-voice, RTF, underruns, "
        "barge-in) beside transformers' reference (see bench --help)",
    )
    bench.set_defaults(func=cmd_bench)

    sub.add_parser("make-tiny-model", help="write a random Qwen2.5-Omni checkpoint (see --help)", add_help=False)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["make-tiny-model"]:
        return cmd_make_tiny_model(argv[1:])
    parser = build_parser()
    args, rest = parser.parse_known_args(argv)
    if rest and args.command != "bench":
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    args.argv, args.rest = argv, rest
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        return args.func(args)
    except Exception as exc:  # noqa: BLE001 - the CLI turns our errors into one clear line
        from pipeline.errors import PipelineError

        if isinstance(exc, PipelineError):
            print(f"error: {exc}", file=sys.stderr)
            return 2
        raise


if __name__ == "__main__":
    sys.exit(main())
