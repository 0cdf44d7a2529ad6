"""Would a first chunk wait less on a token2wav lane of its own? (an experiment for issue 7)

    python scripts/bench_t2w_lanes.py --device cuda --threads 4 --later 16 --repeats 5

Under load a reply's first chunk waits for the worker's running job (~100-300 ms at 16 users, BENCHMARKS.md §19.1,
§21) before its own ~40-100 ms job. This builds two synthesizers of the 7B architecture's token2wav (random weights,
as ``bench_token2wav.py``), each capturing its graphs on a stream of its own (one cuBLAS workspace each, §9.1), and
times, per repeat (ms, wall time until the audio is on the host):

- ``first alone``: one stream's first chunk on lane B;
- ``later alone``: ``--later`` streams' steady 72-frame chunks in one job on lane A;
- ``first beside later``: lane A's job started on a thread, lane B's first chunk 5 ms later on a stream of priority
  ``--priority`` (the worker's urgent priority is -2), both timed from their own start;
- ``first after later``: what the one-lane worker does, the first chunk waiting for the running job (A's remaining
  time + B's job), measured as A's job then B's, one after the other, from A's start + 5 ms.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import threading
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_token2wav import build_token2wav  # noqa: E402


def synthesizer(model, max_batch: int, stream):
    from pipeline.models.qwen2_5_omni.token2wav_stream import StreamingToken2Wav

    return StreamingToken2Wav(model, cuda_graphs=True, tf32_matmul=True, compile_dit=True, max_batch=max_batch,
                              fused_vocoder=True, dit_dtype=torch.bfloat16, capture_stream=stream,
                              dit_attention="triton")  # fmt: skip


def later_streams(t2w, n: int, cond, ref_mel, vocab: int, gen):
    """``n`` streams past their first chunk, each with the codes of a steady chunk ready."""
    streams = [t2w.start(cond, ref_mel, voice="v", max_codes=200, generator=gen) for _ in range(n)]
    for s in streams:
        s.push(torch.randint(0, vocab, (36,), generator=gen).tolist())
    t2w.step_many(streams)
    for s in streams:
        s.push(torch.randint(0, vocab, (36,), generator=gen).tolist())
        assert s.ready()
    return streams


def first_stream(t2w, cond, ref_mel, vocab: int, gen):
    s = t2w.start(cond, ref_mel, voice="v", max_codes=200, generator=gen)
    s.push(torch.randint(0, vocab, (36,), generator=gen).tolist())
    assert s.ready()
    return s


def timed(fn, stream) -> float:
    started = time.perf_counter()
    with torch.cuda.stream(stream):
        fn()
    return 1000 * (time.perf_counter() - started)


@torch.inference_mode()
def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cuda")
    p.add_argument("--threads", type=int, default=4)
    p.add_argument("--later", type=int, default=16)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--priority", type=int, default=-2)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    model, cond, ref_mel, vocab = build_token2wav(args.device, tiny=False)
    lane_a, lane_b = torch.cuda.Stream(), torch.cuda.Stream(priority=args.priority)
    a = synthesizer(model, args.later, torch.cuda.Stream())
    b = synthesizer(model, args.later, torch.cuda.Stream())
    started = time.perf_counter()
    a.warm_up(max_batch=args.later)
    b.warm_up(max_batch=args.later)
    print(f"{torch.cuda.get_device_name()} torch {torch.__version__}; warm-up of both lanes "
          f"{time.perf_counter() - started:.1f} s")
    gen = torch.Generator().manual_seed(0)
    rows: dict[str, list[float]] = {k: [] for k in ("first alone", "later alone", "first beside later",
                                                     "later beside first", "first after later")}
    for round_ in range(args.repeats + 1):  # round 0 warms what warm_up left
        got: dict[str, float] = {}
        f = first_stream(b, cond, ref_mel, vocab, gen)
        got["first alone"] = timed(lambda: b.step_many([f]), lane_b)
        later = later_streams(a, args.later, cond, ref_mel, vocab, gen)
        got["later alone"] = timed(lambda: a.step_many(later), lane_a)
        later = later_streams(a, args.later, cond, ref_mel, vocab, gen)
        f = first_stream(b, cond, ref_mel, vocab, gen)
        torch.cuda.synchronize()
        box: dict[str, float] = {}
        thread = threading.Thread(target=lambda: box.update(ms=timed(lambda: a.step_many(later), lane_a)))
        thread.start()
        time.sleep(0.005)
        got["first beside later"] = timed(lambda: b.step_many([f]), lane_b)
        thread.join()
        got["later beside first"] = box["ms"]
        later = later_streams(a, args.later, cond, ref_mel, vocab, gen)
        f = first_stream(b, cond, ref_mel, vocab, gen)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        timed(lambda: a.step_many(later), lane_a)
        timed(lambda: b.step_many([f]), lane_b)
        got["first after later"] = 1000 * (time.perf_counter() - t0) - 5.0
        if round_ > 0:
            for k, v in got.items():
                rows[k].append(v)
    print(f"| ms ({args.later} later streams, first-chunk lane priority {args.priority}) | median | min | max |")
    print("|---|---:|---:|---:|")
    for k, v in rows.items():
        print(f"| {k} | {statistics.median(v):.1f} | {min(v):.1f} | {max(v):.1f} |")


if __name__ == "__main__":
    main()
