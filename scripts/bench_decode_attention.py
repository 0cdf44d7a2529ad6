"""The decode attention of the 7B architecture's thinker and talker: one program per row and head against the
row's positions shared by several programs (:func:`~pipeline.kernels.decode_attention.attention_splits`), GPU.

    python scripts/bench_decode_attention.py --device cuda

µs per call of :func:`attend_triton` (bfloat16, every row at the same length), from a CUDA graph of 20 calls, best of
3 replays, at 1, 4 and 16 rows and several context lengths; and the largest difference between the two outputs.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

def graph_us(fn, calls: int = 20, repeats: int = 3) -> float:
    """µs per call of ``fn``, from a CUDA graph of ``calls`` calls (so launch gaps do not count), best of ``repeats``."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn()  # compile and warm up outside the capture
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=stream):
            for _ in range(calls):
                fn()
        best = float("inf")
        for _ in range(repeats):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record(stream)
            graph.replay()
            end.record(stream)
            end.synchronize()
            best = min(best, start.elapsed_time(end) * 1000 / calls)
    torch.cuda.current_stream().wait_stream(stream)
    return best


ATTENTION = {"thinker": (28, 4, 128), "talker": (12, 4, 64)}  # query heads, kv heads, head dim


@torch.inference_mode()
def attention(batches: list[int], lengths: list[int], device: str) -> list[dict]:
    from pipeline.kernels.decode_attention import attend_triton, attention_splits

    out = []
    print("\n| stage | rows | positions | one pass µs | split µs (splits) | max abs diff |")
    print("|---|---:|---:|---:|---:|---:|", flush=True)
    for stage, (hq, hkv, d) in ATTENTION.items():
        for b in batches:
            max_len = max(lengths) + 1
            keys = torch.randn(b + 1, max_len, hkv, d, device=device, dtype=torch.bfloat16)
            values = torch.randn_like(keys)
            q = torch.randn(b, hq, d, device=device, dtype=torch.bfloat16)
            slots = torch.arange(b, device=device)
            splits = attention_splits(b, hq, torch.device(device))
            for length in lengths:
                lens = torch.full((b,), length, device=device)
                one = graph_us(lambda: attend_triton(q, keys, values, slots, lens, d**-0.5, splits=1))
                many = graph_us(lambda: attend_triton(q, keys, values, slots, lens, d**-0.5, splits=splits))
                ref = attend_triton(q, keys, values, slots, lens, d**-0.5, splits=1).float()
                got = attend_triton(q, keys, values, slots, lens, d**-0.5, splits=splits).float()
                err = (ref - got).abs().max().item()
                print(f"| {stage} | {b} | {length} | {one:.1f} | {many:.1f} ({splits}) | {err:.1e} |", flush=True)
                out.append({"stage": stage, "rows": b, "positions": length, "one_pass_us": one, "split_us": many,
                            "splits": splits, "max_abs_diff": err})
    return out


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cuda")
    p.add_argument("--rows", default="1,4,16")
    p.add_argument("--lengths", default="128,300,1000,4000")
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args(argv)
    rows = [int(r) for r in args.rows.split(",")]
    print(f"device: {torch.cuda.get_device_name()}\n")
    result = {"device": torch.cuda.get_device_name(), "attention": attention(rows, [int(n) for n in
                                                                                   args.lengths.split(",")], args.device)}
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
