"""Would fp8 weights speed up the 7B thinker's and talker's decode products on this GPU? (an experiment for issue 7)

    python scripts/bench_fp8_linear.py --rows 1,16,32

Per decode product shape (in -> out features of the Qwen2.5-Omni-7B thinker and talker layers) and row count, the
median time (µs, CUDA graph of 20 replays, divided) of: the bf16 product (``F.linear``, as the engine's decode step),
the fp8 e4m3 product with row-wise scales (``torch._scaled_mm``) on already quantized rows, and the same with the
rows' quantization (amax, scale, cast) in front of it. Also the time to read the weights at ``--bandwidth`` GB/s.
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F

SHAPES = {  # name: (in, out)
    "thinker qkv": (3584, 4608), "thinker o": (3584, 3584), "thinker gate_up": (3584, 37888),
    "thinker down": (18944, 3584), "talker qkv": (896, 1280), "talker gate_up": (896, 37888),
    "talker down": (18944, 896),
}
FP8_MAX = 448.0


def quantize_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    scale = x.abs().amax(dim=-1, keepdim=True).float().clamp(min=1e-12) / FP8_MAX
    return (x / scale).to(torch.float8_e4m3fn), scale


def graph_us(fn, reps: int = 20) -> float:
    fn()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(reps):
            fn()
    times = []
    for _ in range(15):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        g.replay()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) * 1000 / reps)
    return sorted(times)[len(times) // 2]


@torch.inference_mode()
def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--rows", default="1,16,32")
    p.add_argument("--bandwidth", type=float, default=3350.0)
    args = p.parse_args()
    dev = torch.device("cuda")
    print(f"{torch.cuda.get_device_name()} torch {torch.__version__}")
    print("| product | rows | bf16 µs | fp8 µs | fp8 + quant µs | bf16 read µs | fp8 read µs | max rel err |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for name, (k, n) in SHAPES.items():
        w = torch.randn(n, k, device=dev, dtype=torch.bfloat16) * 0.02
        w_scale = w.abs().amax(dim=1, keepdim=True).float() / FP8_MAX
        w8 = (w / w_scale).to(torch.float8_e4m3fn)
        w_scale_t = w_scale.t().contiguous()
        for m in (int(r) for r in args.rows.split(",")):
            x = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
            x8, x_scale = quantize_rows(x)
            bf = graph_us(lambda: F.linear(x, w))
            f8 = graph_us(lambda: torch._scaled_mm(x8, w8.t(), scale_a=x_scale, scale_b=w_scale_t,
                                                   out_dtype=torch.bfloat16))

            def both():
                q, s = quantize_rows(x)
                return torch._scaled_mm(q, w8.t(), scale_a=s, scale_b=w_scale_t, out_dtype=torch.bfloat16)

            fq = graph_us(both)
            ref = F.linear(x.float(), w.float())
            err = ((both().float() - ref).abs().max() / ref.abs().max()).item()
            print(f"| {name} | {m} | {bf:.1f} | {f8:.1f} | {fq:.1f} | {n * k * 2 / args.bandwidth / 1e3:.1f} | "
                  f"{n * k / args.bandwidth / 1e3:.1f} | {err:.4f} |")


if __name__ == "__main__":
    main()
