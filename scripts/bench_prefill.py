"""Incremental-prefill benchmark (issue 4): time to first audio after the end of a user turn, for a
short and a long utterance and for an early and a late turn of a conversation.

    python scripts/bench_prefill.py                                   # tiny model, CPU
    python scripts/bench_prefill.py --random-7b --device cuda --runs 5

The user's audio is appended in 20 ms pieces, as a microphone delivers it; the engine encodes and
prefills complete 2 s blocks in the background while "the user speaks" (the script waits for the
engine to catch up, as it would in real time, where 2 s of speech takes 2 s to arrive). TTFA is
measured from the commit (end of turn known to the engine) to the first audio chunk. The baseline
is an engine that does not listen while the user speaks: every cache is dropped and the whole
message is encoded and the whole conversation prefilled at the end of the turn.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_common import FIXTURES, add_model_args, build_engine, load_wav_16k, percentile, stage_config, sync  # noqa: E402

PIECE = 320  # 20 ms at 16 kHz


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_model_args(p)
    p.set_defaults(text_tokens=8, codec_tokens=60)
    p.add_argument("--turns", type=int, default=6)
    return p.parse_args(argv)


def utterance(seconds: float) -> np.ndarray:
    """Speech of the given length from the fixtures (the long story, cut or repeated)."""
    speech = load_wav_16k(FIXTURES / "long_story.wav")
    n = int(seconds * 16000)
    return np.resize(speech, n).astype(np.float32)


async def spoken_turn(engine, conv, item_id: str, pcm: np.ndarray, *, baseline: bool) -> dict:
    """Stream ``pcm``, commit, respond. Returns ms from the commit to: the end of the prefill
    (commit + prefill tail: what incremental prefill shortens) and the first audio chunk."""
    from pipeline.outputs import AudioChunk, ResponseDone

    if baseline:
        # no listening while speaking: nothing is encoded or prefilled before the end of the turn
        state = engine._thread.core.conversations[conv.id]
        await engine._call(lambda core: state.free())
        sync(engine.cfg.thinker.device)
        t0 = time.perf_counter()
        await conv.add_audio(item_id, pcm)
    else:
        audio = conv.open_audio(item_id)
        for start in range(0, len(pcm), PIECE):
            audio.append(pcm[start:start + PIECE])
        await engine.wait_idle()
        sync(engine.cfg.thinker.device)
        t0 = time.perf_counter()
        await audio.commit()
    ttfa = None
    responded = (time.perf_counter() - t0) * 1000
    async for ev in conv.respond(item_id=f"reply_{item_id}"):
        if isinstance(ev, AudioChunk) and ttfa is None:
            ttfa = (time.perf_counter() - t0) * 1000
        if isinstance(ev, ResponseDone):
            prefill = responded + ev.timings.prefill_done_ms
    return {"prefill": prefill, "ttfa": ttfa}


async def length_case(engine, seconds: float, baseline: bool) -> dict:
    conv = engine.conversation()
    ttfa = await spoken_turn(engine, conv, "u", utterance(seconds), baseline=baseline)
    await conv.close()
    return ttfa


async def turn_case(engine, turns: int, baseline: bool) -> list[dict]:
    conv = engine.conversation()
    out = [await spoken_turn(engine, conv, f"u{i}", utterance(2.0), baseline=baseline) for i in range(turns)]
    await conv.close()
    return out


def row(name: str, values: list[dict]) -> str:
    pre = [v["prefill"] for v in values]
    ttfa = [v["ttfa"] for v in values]
    return (f"| {name} | {percentile(pre, 50):.1f} | {percentile(pre, 90):.1f} | {percentile(ttfa, 50):.0f} "
            f"| {percentile(ttfa, 90):.0f} | {len(values)} |")


def main(argv=None) -> None:
    args = parse_args(argv)
    cfg = stage_config(args)
    # the baseline drops a conversation's cache through the EngineCore itself: the core must run in this process
    engine, label = build_engine(args, replace(cfg, engine=replace(cfg.engine, process="off")))
    asyncio.run(length_case(engine, 2.0, False))  # warm-up
    rows = []
    for baseline in (False, True):
        tag = "one-shot prefill at commit (baseline)" if baseline else "incremental"
        for seconds in (2.0, 20.0):
            values = [asyncio.run(length_case(engine, seconds, baseline)) for _ in range(args.runs)]
            rows.append(row(f"{tag}: {seconds:.0f} s utterance, turn 1", values))
        firsts, lasts = [], []
        for _ in range(args.runs):
            t = asyncio.run(turn_case(engine, args.turns, baseline))
            firsts.append(t[0])
            lasts.append(t[-1])
        rows.append(row(f"{tag}: 2 s utterance, turn 1 of {args.turns}", firsts))
        rows.append(row(f"{tag}: 2 s utterance, turn {args.turns} of {args.turns}", lasts))
    engine.close()
    print(f"\nmodel: {label}\ndevice: {args.device}, torch threads: {args.threads}")
    print(f"reply forced to {args.text_tokens} text / {args.codec_tokens} codec tokens; first chunk "
          f"= {engine.cfg.token2wav.chunking.get('first_chunk_frames')} mel frames\n")
    print("| case | commit → prefill done p50 (ms) | p90 (ms) | commit → first audio p50 (ms) | p90 (ms) | n |")
    print("|---|---:|---:|---:|---:|---:|")
    print("\n".join(rows))


if __name__ == "__main__":
    main()
