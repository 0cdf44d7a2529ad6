"""Streaming token2wav benchmark: per-chunk latency and real-time factor, eager vs CUDA graphs (not a test; prints
Markdown tables).

    python scripts/bench_token2wav.py --device cuda                     # 7B token2wav, random weights, GPU
    python scripts/bench_token2wav.py --device cuda --batches 4,8 --tf32 --json out.json
    python scripts/bench_token2wav.py --device cuda --tf32 --compile    # + rows with the DiT blocks compiled
    python scripts/bench_token2wav.py --tiny --device cpu               # tiny token2wav on CPU (smoke run)

Builds only the token2wav of the Qwen2.5-Omni-7B architecture (DiT 22 layers, BigVGAN 1536 channels; float32, as
the reference requires) with random weights, one random speaker, random codes. One utterance has all its codes
available (the talker ahead of token2wav), so each chunk is timed as pure synthesis:

- first chunk: the first ``step()`` (48 mel frames = 0.48 s of audio with the default schedule; DiT window 72 frames);
  this is token2wav's share of the time to first audio;
- steady chunk: median of the middle chunks (72 frames = 0.72 s of audio; DiT window 144 frames);
- RTF: total synthesis time / audio duration (< 1 is faster than real time);
- batched: N streams advanced together, ``step_many`` (one DiT launch per round) vs ``step()`` one stream after
  the other; RTF per stream = wall time until every stream is done / one stream's audio duration.

Each chunk's time includes the copy of its samples to the host (``step()`` returns numpy). The graphs rows also
report max |graphs - eager| over the whole utterance (same noise, same codes).

``--compile`` adds, after each mode, the same mode with the DiT blocks run through ``torch.compile``
(``compile_dit=True``; on the CPU: eager solves of compiled blocks) and, on CUDA, the vocoder's activations fused
(``fused_vocoder=True``, as the engine's ``compile`` does), compiled by ``warm_up`` before its graphs are
captured; the compile time is reported apart from the capture time, with the number of graphs dynamo compiled.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the repository, when not installed

SAMPLE_RATE = 24_000


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cuda")
    p.add_argument("--tiny", action="store_true", help="the tiny random token2wav of the tests (CPU smoke run)")
    p.add_argument("--codes", type=int, default=250, help="codec tokens per utterance (50 per second of audio)")
    p.add_argument("--runs", type=int, default=3, help="timed utterances per mode (median reported)")
    p.add_argument("--eager-runs", type=int, default=2)
    p.add_argument("--batches", default="4,8", help="stream counts for the batched rows")
    p.add_argument("--tf32", action="store_true", help="add rows with TF32 matmuls in the DiT (tf32_matmul=True)")
    p.add_argument(
        "--compile",
        action="store_true",
        help="add rows with the DiT blocks through torch.compile (compile_dit=True) after each mode",
    )
    p.add_argument(
        "--dit-dtypes",
        default="",
        help="comma-separated half precisions (bfloat16, float16): after the float32 modes, the best one "
        "(graphs, with TF32 and compile when given) again with the DiT blocks in each",
    )
    p.add_argument("--together-only", action="store_true", help="batched rows: only step_many, not step() in turn")
    p.add_argument(
        "--only-best",
        action="store_true",
        help="of the float32 modes, run only the best one (graphs, with TF32 and compile when given)",
    )
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--json", default=None, help="also write the results here")
    return p.parse_args(argv)


def build_token2wav(device: str, tiny: bool):
    """(model, cond, ref_mel, code vocabulary size); random weights, seeded."""
    from transformers.models.qwen2_5_omni.modeling_qwen2_5_omni import Qwen2_5OmniToken2WavModel

    from pipeline.models.qwen2_5_omni.tiny import RandomModelSpec, build_config, make_speakers

    spec = RandomModelSpec.tiny() if tiny else RandomModelSpec.qwen2_5_omni_7b()
    config = build_config(spec).token2wav_config
    torch.manual_seed(spec.seed)
    with torch.device(device):
        model = Qwen2_5OmniToken2WavModel(config).float().eval()
    with torch.no_grad():  # audible output, as the random checkpoints do (tiny.py: output_gain)
        model.code2wav_bigvgan_model.conv_post.weight.mul_(spec.output_gain)
    speaker = make_speakers(spec)["Chelsie"]
    return model, speaker["cond"].to(device), speaker["ref_mel"].to(device), spec.codec_speech_vocab


@dataclass
class Utterance:
    chunk_s: list[float]
    audio: np.ndarray

    @property
    def total_s(self) -> float:
        return sum(self.chunk_s)


def synthesize(t2w, cond, ref_mel, codes, noise, sync) -> Utterance:
    """One utterance, all codes pushed up front; each chunk timed alone."""
    stream = t2w.start(cond, ref_mel, voice="bench", noise=noise, max_codes=len(codes))
    stream.push(codes)
    stream.finish()
    times, chunks = [], []
    while not stream.done:
        sync()
        start = time.perf_counter()
        chunks.append(stream.step())
        times.append(time.perf_counter() - start)
    return Utterance(times, np.concatenate(chunks))


def summarize(mode: str, runs: list[Utterance], reference: np.ndarray | None, extra: dict) -> dict:
    audio_s = len(runs[0].audio) / SAMPLE_RATE
    steady = [statistics.median(r.chunk_s[1:-1]) for r in runs if len(r.chunk_s) > 2]
    row = {
        "mode": mode,
        "first_chunk_ms": 1000 * statistics.median(r.chunk_s[0] for r in runs),
        "steady_chunk_ms": 1000 * statistics.median(steady) if steady else float("nan"),
        "total_ms": 1000 * statistics.median(r.total_s for r in runs),
        "audio_s": audio_s,
        "rtf": statistics.median(r.total_s for r in runs) / audio_s,
        "chunks": len(runs[0].chunk_s),
        "max_abs_diff": float(np.abs(runs[0].audio - reference).max()) if reference is not None else 0.0,
        "peak": float(np.abs(runs[0].audio).max()),
        **extra,
    }
    return row


def run_batched(t2w, cond, ref_mel, codes, noise, streams: int, together: bool, sync) -> float:
    """Seconds until ``streams`` utterances are all synthesized, stepped together or one after the other."""
    opened = [t2w.start(cond, ref_mel, voice="bench", noise=noise, max_codes=len(codes)) for _ in range(streams)]
    for stream in opened:
        stream.push(codes)
        stream.finish()
    sync()
    start = time.perf_counter()
    while not all(s.done for s in opened):
        ready = [s for s in opened if s.ready()]
        if together:
            t2w.step_many(ready)
        else:
            for stream in ready:
                stream.step()
    sync()
    return time.perf_counter() - start


def timed_ms(fn, sync, repeats: int) -> float:
    """Median wall time of ``repeats`` calls of ``fn``, each between two ``sync()``s, in ms."""
    samples = []
    for _ in range(repeats):
        sync()
        start = time.perf_counter()
        fn()
        sync()
        samples.append(time.perf_counter() - start)
    return 1000 * statistics.median(samples)


def steady_breakdown(eager, graphed, sync, compiled=None, repeats: int = 5) -> dict:
    """Median ms of a steady chunk's two parts, eager and graphed (and graphed with compiled DiT blocks, when given):
    the DiT solve of a 144-frame window and the vocoder on 40 + 72 frames. Reaches into the synthesizers' internals: a
    measurement, not an API."""
    from pipeline.models.qwen2_5_omni.token2wav_graphs import WindowJob

    dit, device = eager.dit, eager.device
    width = dit.input_embed.proj.in_features - dit.config.mel_dim
    job = WindowJob(
        torch.randn(1, 144, dit.config.mel_dim, device=device),
        torch.randn(2 if eager.use_cfg else 1, 144, width, device=device),
        first_frame=48,
    )
    mel = torch.randn(1, dit.config.mel_dim, 112, device=device) - 4.0

    def timed(fn) -> float:
        return timed_ms(fn, sync, repeats)

    parts = {
        "dit_eager_ms": timed(lambda: eager._dit_batches.solve([job])),
        "dit_graph_ms": timed(lambda: graphed._dit_batches.solve([job])),
        "vocoder_eager_ms": timed(lambda: eager._vocoder.many([mel])),
        "vocoder_graph_ms": timed(lambda: graphed._vocoder.many([mel])),
    }
    if compiled is not None:
        parts["dit_compiled_graph_ms"] = timed(lambda: compiled._dit_batches.solve([job]))
    return parts


def graphs_compiled() -> int:
    """Graphs dynamo compiled so far in this process (every function)."""
    return torch._dynamo.utils.counters["stats"]["unique_graphs"]


def main(argv=None) -> None:
    from pipeline.models.qwen2_5_omni.token2wav_stream import StreamingToken2Wav

    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    cuda = args.device.startswith("cuda")
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    built = time.perf_counter()
    model, cond, ref_mel, vocab = build_token2wav(args.device, args.tiny)
    build_s = time.perf_counter() - built
    g = torch.Generator().manual_seed(0)
    codes = torch.randint(0, vocab, (args.codes,), generator=g).tolist()
    noise = torch.randn(1, 2 * args.codes, model.code2wav_dit_model.config.mel_dim, generator=g)
    rows, batched, breakdown = [], [], {}

    with torch.inference_mode():
        eager = StreamingToken2Wav(model, cuda_graphs=False)
        synthesize(eager, cond, ref_mel, codes, noise, sync)  # warm-up (kernels, allocator, speaker cache)
        eager_runs = [synthesize(eager, cond, ref_mel, codes, noise, sync) for _ in range(args.eager_runs)]
        reference = eager_runs[0].audio
        rows.append(summarize("eager", eager_runs, None, {"warm_up_s": 0.0, "compile_s": 0.0}))
        base = [("CUDA graphs", True, False)] if cuda else []  # (label, graphs, tf32)
        base += [("CUDA graphs + TF32 matmul", True, True)] if cuda and args.tf32 else []
        modes = []  # each mode, then the same with compiled DiT blocks: (label, graphs, tf32, compile_dit, dtype)
        for label, graphs, tf32 in base:
            modes += [(label, graphs, tf32, False, "float32")]
            modes += [(f"{label} + compiled DiT", graphs, tf32, True, "float32")] * args.compile
        modes += [("eager + compiled DiT", False, False, True, "float32")] if args.compile and not cuda else []
        if args.only_best:
            modes = modes[-1:]
        label, graphs, tf32, compile_dit, _ = modes[-1] if modes else ("eager", False, False, False, "float32")
        for dtype in filter(None, args.dit_dtypes.split(",")):
            modes.append((f"{label}, DiT in {dtype}", graphs, tf32, compile_dit, dtype))
        max_batch = max(int(n) for n in args.batches.split(","))
        graphed = {}  # (tf32, compile_dit) -> float32 synthesizer, for the breakdown
        for label, graphs, tf32, compile_dit, dtype in modes:
            t2w = StreamingToken2Wav(
                model,
                cuda_graphs=graphs,
                tf32_matmul=tf32,
                compile_dit=compile_dit,
                fused_vocoder=compile_dit and cuda,
                max_batch=max_batch,
                dit_dtype=getattr(torch, dtype),
            )
            graphs_before = graphs_compiled()
            started = time.perf_counter()
            t2w.warm_up(max_batch=max_batch)
            sync()
            warm_up_s = time.perf_counter() - started
            runs = [synthesize(t2w, cond, ref_mel, codes, noise, sync) for _ in range(args.runs)]
            extra = {
                "warm_up_s": warm_up_s,
                "compile_s": t2w.compile_seconds,
                "compiled_graphs": graphs_compiled() - graphs_before,
                "stats": asdict(t2w.graph_stats()),
            }
            rows.append(summarize(label, runs, reference, extra))
            if dtype == "float32":
                graphed[(tf32, compile_dit)] = t2w
            for n in (int(n) for n in args.batches.split(",")):
                for together in (True,) if args.together_only else (False, True):
                    seconds = run_batched(t2w, cond, ref_mel, codes, noise, n, together, sync)
                    how = "step_many" if together else "step() in turn"
                    batched.append(
                        {
                            "mode": label,
                            "streams": n,
                            "how": how,
                            "seconds": seconds,
                            "rtf_per_stream": seconds / rows[0]["audio_s"],
                        }
                    )
        if cuda and (False, False) in graphed:
            breakdown = steady_breakdown(eager, graphed[(False, False)], sync, graphed.get((False, True)))

    device = torch.cuda.get_device_name() if cuda else "CPU"
    peak_gib = torch.cuda.max_memory_allocated() / 2**30 if cuda else 0.0
    import transformers

    print(
        f"\ntoken2wav: {'tiny' if args.tiny else 'Qwen2.5-Omni-7B architecture'}, random weights, float32; "
        f"built in {build_s:.1f} s"
    )
    print(
        f"device: {device}; torch {torch.__version__}, transformers {transformers.__version__}; "
        f"peak GPU memory allocated {peak_gib:.2f} GiB (model, every captured graph, 8-stream batches)"
    )
    print(
        f"utterance: {args.codes} codes = {rows[0]['audio_s']:.2f} s of audio, {rows[0]['chunks']} chunks "
        f"(default schedule: first 48 frames, then 72; past 48, future 24)\n"
    )
    print(
        "| mode | first chunk (ms) | steady chunk (ms) | total (ms) | RTF | graph capture (s) | compile (s) "
        "| max abs diff vs eager |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        diff = "—" if r["mode"] == "eager" else f"{r['max_abs_diff']:.2g} (peak {r['peak']:.2g})"
        compiled = f"{r['compile_s']:.1f} ({r['compiled_graphs']} graphs)" if r["compile_s"] else "—"
        print(
            f"| {r['mode']} | {r['first_chunk_ms']:.1f} | {r['steady_chunk_ms']:.1f} | {r['total_ms']:.0f} "
            f"| {r['rtf']:.3f} | {r['warm_up_s'] - r['compile_s']:.1f} | {compiled} | {diff} |"
        )
    if batched:
        print("\n| mode | streams | stepped | wall (ms) | RTF per stream | audio s per s |")
        print("|---|---:|---|---:|---:|---:|")
        for b in batched:
            print(
                f"| {b['mode']} | {b['streams']} | {b['how']} | {b['seconds'] * 1000:.0f} "
                f"| {b['rtf_per_stream']:.3f} | {b['streams'] / b['rtf_per_stream']:.1f} |"
            )
    if breakdown:
        compiled = "dit_compiled_graph_ms" in breakdown
        print(
            "\n| steady chunk part | eager (ms) | CUDA graph (ms) |" + (" CUDA graph, compiled DiT (ms) |" * compiled)
        )
        print("|---|---:|---:|" + ("---:|" * compiled))
        print(
            f"| DiT ODE solve, 144-frame window (36 evaluations, CFG batched) | {breakdown['dit_eager_ms']:.1f} "
            f"| {breakdown['dit_graph_ms']:.1f} |" + (f" {breakdown.get('dit_compiled_graph_ms', 0):.1f} |" * compiled)
        )
        print(
            f"| BigVGAN, 112 frames | {breakdown['vocoder_eager_ms']:.1f} | {breakdown['vocoder_graph_ms']:.1f} |"
            + (" — |" * compiled)
        )
    for r in rows:
        if "stats" in r:
            print(f"\n{r['mode']} graph stats: {r['stats']}")
    if args.json:
        with open(args.json, "w") as f:
            result = {
                "device": device,
                "rows": rows,
                "batched": batched,
                "breakdown": breakdown,
                "build_s": build_s,
                "peak_gpu_mem_gib": peak_gib,
            }
            json.dump(result, f, indent=2)


if __name__ == "__main__":
    main()
