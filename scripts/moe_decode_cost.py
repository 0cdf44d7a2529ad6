"""What one mixture-of-experts block of Qwen3-Omni costs in a decode step, per experts implementation and batch size.

Builds one thinker MoE block and one talker MoE block of the released 30B-A3B shapes (random bf16 weights, on the GPU),
captures each implementation's forward in a CUDA graph per batch size and prints the median replay time beside the time
to read the experts it touches at the GPU's copy bandwidth (measured here with a large device-to-device copy): the
floor a decode step cannot beat. Routing is the block's own (random router weights spread the tokens over experts).

    python scripts/moe_decode_cost.py                       # grouped_mm and batched_mm, batches 1..32
    python scripts/moe_decode_cost.py --impl grouped_mm --batches 1,16

Units: µs per block; "touched" is the number of distinct experts the batch's tokens route to.
"""

from __future__ import annotations

import argparse
import statistics
import sys

import torch


def _bandwidth(device: torch.device) -> float:
    """Bytes per second of a 1 GiB device-to-device copy (read + write counted once each)."""
    src = torch.empty(1 << 29, dtype=torch.bfloat16, device=device)
    dst = torch.empty_like(src)
    for _ in range(3):
        dst.copy_(src)
    torch.cuda.synchronize(device)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(10):
        dst.copy_(src)
    end.record()
    torch.cuda.synchronize(device)
    return 10 * 2 * src.numel() * 2 / (start.elapsed_time(end) / 1e3)


def _blocks(impl: str, device: torch.device):
    from transformers.models.qwen3_omni_moe.modeling_qwen3_omni_moe import (
        Qwen3OmniMoeTalkerTextSparseMoeBlock,
        Qwen3OmniMoeThinkerTextSparseMoeBlock,
    )

    from pipeline.models.qwen3_omni.tiny_config import build_config
    from pipeline.models.qwen3_omni.tiny_spec import Qwen3OmniRandomModelSpec

    config = build_config(Qwen3OmniRandomModelSpec.qwen3_omni_30b_a3b())
    thinker_cfg = config.thinker_config.text_config
    talker_cfg = config.talker_config.text_config
    out = {}
    for name, cls, cfg in (
        ("thinker", Qwen3OmniMoeThinkerTextSparseMoeBlock, thinker_cfg),
        ("talker", Qwen3OmniMoeTalkerTextSparseMoeBlock, talker_cfg),
    ):
        cfg._experts_implementation = impl
        with torch.device(device):
            block = cls(cfg).to(torch.bfloat16).eval()
        for p in block.parameters():
            torch.nn.init.normal_(p, std=0.02)
        out[name] = (block, cfg)
    return out


def _time_graph(fn, x: torch.Tensor, reps: int) -> float:
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):
            fn(x)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn(x)
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3)
    return statistics.median(times)


@torch.inference_mode()
def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--impl", default="grouped_mm,batched_mm", help="comma-separated experts implementations")
    p.add_argument("--batches", default="1,2,4,8,16,32")
    p.add_argument("--reps", type=int, default=50)
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        print("needs a CUDA GPU", file=sys.stderr)
        return 2
    device = torch.device("cuda")
    bandwidth = _bandwidth(device)
    print(f"{torch.cuda.get_device_name(device)}: copy bandwidth {bandwidth / 1e12:.2f} TB/s")
    batches = [int(b) for b in args.batches.split(",")]
    for impl in args.impl.split(","):
        blocks = _blocks(impl, device)
        for name, (block, cfg) in blocks.items():
            expert_bytes = 3 * cfg.hidden_size * cfg.moe_intermediate_size * 2
            for b in batches:
                x = torch.randn(1, b, cfg.hidden_size, dtype=torch.bfloat16, device=device)
                _, _, chosen = block.gate(x.view(-1, cfg.hidden_size))
                touched = int(torch.unique(chosen).numel())
                try:
                    us = _time_graph(block, x, args.reps)
                except Exception as exc:  # a kernel path that cannot be captured is a result to print, not a crash
                    print(f"{impl:>10} {name:>7} B={b:>2}: failed: {type(exc).__name__}: {exc}")
                    continue
                floor = touched * expert_bytes / bandwidth * 1e6
                print(
                    f"{impl:>10} {name:>7} B={b:>2}: {us:8.1f} µs  touched {touched:>3} experts, "
                    f"read floor {floor:6.1f} µs ({floor / us:5.1%} of it)"
                )
        del blocks
        torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
