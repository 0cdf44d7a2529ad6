"""What an audio commit costs in the engine: the user stops speaking, the session commits the message, and
the engine encodes the tail (the audio after the last complete 2 s block) before it can answer (since f871cc8 the
commit command queues the encode and the engine's next step runs it: pipeline/runners/audio_encodes.py).

Streams a spoken fixture into a conversation (100 ms appends, faster than real time but waiting for the engine
to be idle before the commit, as after a VAD silence window), then times the commit as the caller sees it and,
inside the engine thread (``engine.process`` off, so the core can be instrumented), the ``commit_audio`` command
and the encoder call that follows it, each synchronised with the device. Then the encoder alone on blocks of 50–200
mel frames. Times in ms; medians over ``--turns`` turns after one warm-up turn.

    python scripts/bench_commit.py --model random:7b --device cuda --threads 4 --turns 6
    python scripts/bench_commit.py --turns 2          # the embedded tiny model on the CPU
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import soundfile as sf
import soxr
import torch

from pipeline.engine import OmniEngine
from realtime.bench.models import ReplyLength, bench_stage_config, model_loader

FIXTURE = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "speech" / "count_to_five.wav"
RATE = 16_000
APPEND_MS = 100
SILENCE_MS = 500
"""The server VAD's default silence window: audio the commit includes after the speech."""


def speech() -> np.ndarray:
    pcm, rate = sf.read(FIXTURE, dtype="float32", always_2d=True)
    pcm = soxr.resample(pcm.mean(axis=1), rate, RATE).astype(np.float32)
    return np.concatenate([pcm, np.zeros(RATE * SILENCE_MS // 1000, np.float32)])


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class Timers:
    """Wraps the core's ``commit_audio`` and the thinker's ``encode_many`` with device-synchronised timers; an encoder
    call is timed when it is the first after a commit (the one that encodes the commit's tail, its last block)."""

    def __init__(self, core) -> None:
        self.device = core.thinker.device
        self.commit_ms: list[float] = []
        self.encode_ms: list[tuple[int, float]] = []  # (the tail's mel frames, ms of the call), commits only
        self._after_commit = False
        commit, encode = core.commit_audio, core.thinker.encode_many

        def timed_commit(*args):
            sync(self.device)
            start = time.perf_counter()
            try:
                return commit(*args)
            finally:
                sync(self.device)
                self._after_commit = True
                self.commit_ms.append(1000 * (time.perf_counter() - start))

        def timed_encode(features):
            if not self._after_commit:
                return encode(features)
            sync(self.device)
            start = time.perf_counter()
            out = encode(features)
            sync(self.device)
            self._after_commit = False
            self.encode_ms.append((int(features[-1].shape[1]), 1000 * (time.perf_counter() - start)))
            return out

        core.commit_audio, core.thinker.encode_many = timed_commit, timed_encode


async def turns(engine: OmniEngine, n: int, vary_ms: int) -> list[float]:
    """Caller-side commit times (ms) of ``n`` turns (the first is a warm-up, left out). Each turn's speech is
    ``vary_ms`` shorter than the one before, so its tail (and the encoder's input length) differs."""
    step = RATE * APPEND_MS // 1000
    conv, caller_ms = engine.conversation(), []
    for turn in range(n + 1):
        pcm = speech()[RATE * vary_ms * turn // 1000:]
        audio = conv.open_audio(f"u{turn}")
        for start in range(0, len(pcm), step):
            audio.append(pcm[start:start + step])
            await asyncio.sleep(APPEND_MS / 4000)
        while (stats := await engine.stats()).pending_commands or stats.responses:
            await asyncio.sleep(0.01)  # the blocks heard so far are encoded and prefilled
        start = time.perf_counter()
        await audio.commit()
        if turn:
            caller_ms.append(1000 * (time.perf_counter() - start))
        await conv.respond(item_id=f"a{turn}").wait()
    await conv.close()
    return caller_ms


def encoder_alone(core, frames: list[int], reps: int) -> dict[int, tuple[float, float]]:
    """Mel frames -> (ms of the first call at that length, median ms of ``reps`` calls after it)."""
    thinker, out = core.thinker, {}
    n_mels = core.ckpt.feature_extractor.feature_size
    with torch.inference_mode():
        for t in frames:
            feats = torch.randn(n_mels, t)
            times = []
            for _ in range(reps + 1):
                sync(thinker.device)
                start = time.perf_counter()
                thinker.encode_features(feats)
                sync(thinker.device)
                times.append(1000 * (time.perf_counter() - start))
            out[t] = (times[0], statistics.median(times[1:]))
    return out


def without_cudnn(thinker) -> None:
    encode = thinker.encode_many

    def encode_without_cudnn(features):
        with torch.backends.cudnn.flags(enabled=False):
            return encode(features)

    thinker.encode_many = encode_without_cudnn


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=None, help="random:7b, random:tiny, a checkpoint (default: the embedded tiny one)")
    p.add_argument("--device", default=None)
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    p.add_argument("--turns", type=int, default=6)
    p.add_argument("--vary-ms", type=int, default=37, help="each turn's speech this much shorter (new tail lengths)")
    p.add_argument("--cudnn-benchmark", choices=("on", "off"), default=None,
                   help="set torch.backends.cudnn.benchmark (default: leave torch's setting)")
    p.add_argument("--encoder-cudnn", choices=("on", "off"), default="on",
                   help="off: the audio encoder's convolutions without cuDNN (a plan per new length?)")
    p.add_argument("--engine-process", choices=("on", "off"), default="off",
                   help="on: the engine core in its child process, timed from the caller only")
    p.add_argument("--json", default=None, help="write the result here")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    if args.cudnn_benchmark is not None:
        torch.backends.cudnn.benchmark = args.cudnn_benchmark == "on"
    cfg = bench_stage_config(None, device=args.device, length=ReplyLength(4, 30))
    cfg = replace(cfg, engine=replace(cfg.engine, process=args.engine_process))
    engine = OmniEngine.from_loader(model_loader(args.model), cfg, seed=0, torch_threads=args.threads)
    try:
        if engine.uses_process:
            caller = asyncio.run(turns(engine, args.turns, args.vary_ms))
            result = {"engine_process": True, "commit_caller_ms": caller, "commit_caller_p50": statistics.median(caller)}
        else:
            if args.encoder_cudnn == "off":
                without_cudnn(engine._thread.core.thinker)
            timers = Timers(engine._thread.core)
            caller = asyncio.run(turns(engine, args.turns, args.vary_ms))
            result = {
                "cudnn_benchmark": torch.backends.cudnn.benchmark, "commit_caller_ms": caller,
                "warm_up_commit_engine_ms": timers.commit_ms[0], "commit_engine_ms": timers.commit_ms[1:],
                "tail_encode": timers.encode_ms[1:],
                "encoder_alone_ms": engine._thread.submit(lambda c: encoder_alone(c, [53, 97, 151, 200], 5)).result(),
                "commit_caller_p50": statistics.median(caller),
                "commit_engine_p50": statistics.median(timers.commit_ms[1:]),
            }
    finally:
        engine.close()
    print(json.dumps(result))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
