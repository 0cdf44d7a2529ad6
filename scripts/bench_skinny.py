"""Decode-step kernels of the 7B architecture, one at a time: cuBLAS against the Triton skinny products, and the
decode attention in one pass against split over several programs (GPU).

    python scripts/bench_skinny.py --device cuda

Products: every fused decode layer's four (q|k|v, o, gate|up, down) of the thinker and the talker, at 1, 4 and 16
rows, random bfloat16 weights of the real shapes; each candidate is timed as the engine's planner times it (µs per
call, from a CUDA graph of 20 calls, best of 3 replays). Attention: µs per call of :func:`attend_triton` with
``splits`` 1 (one program per row and head) and the automatic choice, at several context lengths.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

PRODUCTS = {  # (out, in, bias): the 7B architecture's layer shapes (RandomModelSpec.qwen2_5_omni_7b)
    "thinker": {"qkv": (4608, 3584, True), "o": (3584, 3584, False), "gate_up": (37888, 3584, False),
                "down": (3584, 18944, False)},
    "talker": {"qkv": (1280, 896, True), "o": (896, 768, False), "gate_up": (37888, 896, False),
               "down": (896, 18944, False)},
}
ATTENTION = {"thinker": (28, 4, 128), "talker": (12, 4, 64)}  # query heads, kv heads, head dim


@torch.inference_mode()
def products(rows: list[int], device: str) -> list[dict]:
    from pipeline.stages.skinny_gemm import LinearPlanner

    planner = LinearPlanner()
    out = []
    print("| stage | product | rows | cuBLAS µs | best Triton µs | best config | GB/s best |")
    print("|---|---|---:|---:|---:|---|---:|", flush=True)
    for stage, shapes in PRODUCTS.items():
        for name, (n, k, has_bias) in shapes.items():
            weight = torch.randn(n, k, device=device, dtype=torch.bfloat16) / k**0.5
            bias = torch.randn(n, device=device, dtype=torch.bfloat16) if has_bias else None
            for m in rows:
                x = torch.randn(m, k, device=device, dtype=torch.bfloat16)
                key = (m, n, k, has_bias, x.dtype, x.device)
                with planner.planning():
                    planner.linear(x, weight, bias)
                timed = planner.timings[key]
                triton_only = {c: us for c, us in timed.items() if c != "cublas"}
                best = min(triton_only, key=triton_only.get)
                fastest = min(timed["cublas"], triton_only[best])
                gbps = n * k * 2 / (fastest * 1e-6) / 1e9
                print(f"| {stage} | {name} | {m} | {timed['cublas']:.1f} | {triton_only[best]:.1f} | {best} | "
                      f"{gbps:.0f} |", flush=True)
                top = sorted(triton_only.items(), key=lambda kv: kv[1])[:5]
                out.append({"stage": stage, "product": name, "rows": m, "cublas_us": timed["cublas"],
                            "top": top, "chosen": repr(planner.plans[key])})
    return out


@torch.inference_mode()
def attention(batches: list[int], lengths: list[int], device: str) -> list[dict]:
    from pipeline.stages.decode_attention import attend_triton, attention_splits
    from pipeline.stages.skinny_gemm import LinearPlanner

    timer = LinearPlanner()
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
                one = timer._time(lambda: attend_triton(q, keys, values, slots, lens, d**-0.5, splits=1))
                many = timer._time(lambda: attend_triton(q, keys, values, slots, lens, d**-0.5, splits=splits))
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
    result["products"] = products(rows, args.device)
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
