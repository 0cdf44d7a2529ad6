"""The DiT block's attention on the 7B layout (16 heads of 64, 24-frame blocks), GPU: the Triton kernel
(:mod:`pipeline.models.qwen2_5_omni.dit_attention`) at several launch settings, against the SDPA path
(:func:`~pipeline.models.qwen2_5_omni.dit.sdpa_attention` through ``torch.compile``, as the compiled block runs it:
inductor's RoPE/concatenation kernels, cuDNN's attention, the transpose).

    python scripts/bench_dit_attention.py --device cuda

µs per call (bfloat16), from a CUDA graph of 20 calls (best of 3 replays; ``bench_decode_attention.graph_us``), for
first-chunk (72 frames) and steady (144 frames) windows of 1 and 16 streams (2 rows each: CFG), at the reaches the 7B
uses; and the largest difference from the SDPA output (relative to its peak).
"""

from __future__ import annotations

import argparse
import itertools
import json
from pathlib import Path

import torch

from bench_decode_attention import graph_us

HEADS, HEAD_DIM, BLOCK = 16, 64, 24


def inputs(streams: int, frames: int, device: str):
    """A window of ``frames`` frames from frame 48 for each stream (rows: conditioned then unconditioned)."""
    rows = 2 * streams
    generator = torch.Generator().manual_seed(frames * 100 + streams)
    qkv = torch.randn(rows, frames, 3 * HEADS * HEAD_DIM, generator=generator).to(device, torch.bfloat16)
    positions = torch.arange(48, 48 + frames)
    angles = positions[:, None] / 10000 ** (torch.arange(0, HEAD_DIM, 2) / HEAD_DIM)[None, :]
    angles = torch.cat([angles, angles], dim=-1)
    cos = angles.cos().expand(rows, frames, HEAD_DIM).to(device, torch.bfloat16).contiguous()
    sin = angles.sin().expand(rows, frames, HEAD_DIM).to(device, torch.bfloat16).contiguous()
    blocks = (positions // BLOCK).expand(rows, frames).to(device).contiguous()
    return qkv, cos, sin, blocks


def main(argv: list[str] | None = None) -> int:
    from pipeline.models.qwen2_5_omni import dit_attention as kernel
    from pipeline.models.qwen2_5_omni.dit import sdpa_attention

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cuda")
    p.add_argument("--streams", default="1,16")
    p.add_argument("--frames", default="72,144")
    p.add_argument("--sweep", action="store_true", help="every tile size and launch setting, not only the packaged")
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args(argv)
    compiled_sdpa = torch.compile(sdpa_attention, dynamic=False)
    settings = [(kernel.NUM_WARPS, kernel.NUM_STAGES)]
    if args.sweep:
        settings += [s for s in itertools.product((1, 2, 4, 8), (1, 2)) if s != settings[0]]
    results = []
    for streams, frames, reach in itertools.product([int(s) for s in args.streams.split(",")],
                                                    [int(f) for f in args.frames.split(",")], ((0, 0), (1, 0))):
        qkv, cos, sin, blocks = inputs(streams, frames, args.device)
        bounds = torch.tensor(reach, device=args.device)
        diff = blocks[:, None, :] - blocks[:, :, None]
        mask = ((diff >= -reach[1]) & (diff <= reach[0])).unsqueeze(1)
        with torch.inference_mode():
            expected = compiled_sdpa(qkv, mask, cos, sin, HEADS)
            row = {"streams": streams, "frames": frames, "reach": reach,
                   "sdpa_us": graph_us(lambda: compiled_sdpa(qkv, mask, cos, sin, HEADS)), "triton": []}  # fmt: skip
            for warps, stages in settings:
                def call():
                    return kernel.launch(qkv, cos, sin, blocks, bounds, HEADS, BLOCK, num_warps=warps,
                                         num_stages=stages)  # fmt: skip

                error = ((call() - expected).abs().max() / expected.abs().max()).item()
                row["triton"].append({"warps": warps, "stages": stages, "us": graph_us(call), "error": error})
        best = min(row["triton"], key=lambda r: r["us"])
        packaged = row["triton"][0]
        print(f"streams {streams:2d} frames {frames:3d} reach {reach}: SDPA path {row['sdpa_us']:6.1f} us; "
              f"Triton packaged {packaged['us']:6.1f} us (error {packaged['error']:.2e}); best {best['us']:6.1f} us at "
              f"warps={best['warps']} stages={best['stages']}")
        results.append(row)
    if args.sweep:
        print("mean us per setting over the shapes above:")
        for i, (warps, stages) in enumerate(settings):
            mean = sum(r["triton"][i]["us"] for r in results) / len(results)
            print(f"  warps={warps} stages={stages}: {mean:6.1f}")
    if args.json:
        args.json.write_text(json.dumps({"device": torch.cuda.get_device_name(), "results": results}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
