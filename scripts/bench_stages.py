"""Per-stage decode step time against the time needed to read the stage's weights (GPU).

    python scripts/bench_stages.py --random-7b --device cuda

For the thinker and the talker at batch 1: eager step time (DynamicCache, as the engine runs today) and,
with ``--graphs``, a CUDA-graph-captured step over a StaticCache (a prototype of issue 7's decode path).
The roofline is the stage's weight bytes divided by the device-to-device copy bandwidth measured here.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))


def measure_bandwidth(device: str, gib: float = 2.0) -> float:
    """Bytes per second of a device-to-device copy (read + write counted)."""
    n = int(gib * (1 << 30)) // 2
    src = torch.empty(n, dtype=torch.bfloat16, device=device)
    dst = torch.empty_like(src)
    dst.copy_(src)
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(10):
        dst.copy_(src)
    torch.cuda.synchronize()
    return 10 * 2 * src.numel() * src.element_size() / (time.perf_counter() - start)


def weight_bytes(*modules) -> int:
    seen, total = set(), 0
    for m in modules:
        for p in m.parameters():
            if id(p) not in seen:
                seen.add(id(p))
                total += p.numel() * p.element_size()
    return total


class Stage:
    """One decoder: ``body`` (HF text model taking inputs_embeds), ``head``; ``pre`` maps inputs."""

    def __init__(self, name, body, head, pre, hidden_in: int, dtype, device):
        self.name, self.body, self.head, self.pre = name, body, head, pre
        self.hidden_in, self.dtype, self.device = hidden_in, dtype, device

    def forward(self, x, cache, positions, cache_position=None):
        kwargs = {"cache_position": cache_position} if cache_position is not None else {}
        out = self.body(inputs_embeds=self.pre(x), position_ids=positions, past_key_values=cache, use_cache=True,
                        **kwargs)
        return self.head(out.last_hidden_state[:, -1:])


def positions(start: int, n: int, device) -> torch.Tensor:
    return torch.arange(start, start + n, device=device).view(1, 1, -1).expand(3, 1, -1)


@torch.inference_mode()
def eager_step_ms(stage: Stage, prompt: int, steps: int) -> float:
    from transformers import DynamicCache

    cache = DynamicCache(config=stage.body.config)
    x = torch.randn(1, prompt, stage.hidden_in, device=stage.device, dtype=stage.dtype)
    stage.forward(x, cache, positions(0, prompt, stage.device))
    one = torch.randn(1, 1, stage.hidden_in, device=stage.device, dtype=stage.dtype)
    for i in range(3):
        stage.forward(one, cache, positions(prompt + i, 1, stage.device))
    torch.cuda.synchronize()
    start = time.perf_counter()
    for i in range(steps):
        logits = stage.forward(one, cache, positions(prompt + 3 + i, 1, stage.device))
        int(logits.argmax())  # the engine needs each token on the host
    return (time.perf_counter() - start) * 1000 / steps


@torch.inference_mode()
def graph_step_ms(stage: Stage, prompt: int, steps: int) -> float:
    from transformers import StaticCache

    dev = stage.device
    cache = StaticCache(config=stage.body.config, max_cache_len=prompt + steps + 16)
    x = torch.randn(1, prompt, stage.hidden_in, device=dev, dtype=stage.dtype)
    stage.forward(x, cache, positions(0, prompt, dev), torch.arange(prompt, device=dev))
    static_x = torch.randn(1, 1, stage.hidden_in, device=dev, dtype=stage.dtype)
    static_pos = positions(prompt, 1, dev).clone()
    static_cp = torch.tensor([prompt], device=dev)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            stage.forward(static_x, cache, static_pos, static_cp)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_out = stage.forward(static_x, cache, static_pos, static_cp)
    torch.cuda.synchronize()
    start = time.perf_counter()
    for i in range(steps):
        static_pos.fill_(prompt + i)
        static_cp.fill_(prompt + i)
        graph.replay()
        int(static_out.argmax())
    return (time.perf_counter() - start) * 1000 / steps


def main(argv=None) -> None:
    from bench_common import add_model_args

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_model_args(p)
    p.add_argument("--prompt", type=int, default=300)
    p.add_argument("--steps", type=int, default=50)
    p.add_argument("--graphs", action="store_true")
    args = p.parse_args(argv)
    from pipeline.models.qwen2_5_omni.parts import thinker_text_model
    from pipeline.models.qwen2_5_omni.tiny import RandomModelSpec, build_random_model

    ckpt = build_random_model(RandomModelSpec.qwen2_5_omni_7b(), device=args.device, dtype=torch.bfloat16)
    bw = measure_bandwidth(args.device)
    th, ta = ckpt.thinker, ckpt.talker
    text = thinker_text_model(th)
    hidden = text.config.hidden_size
    stages = [
        Stage("thinker", text, th.lm_head, lambda x: x, hidden, torch.bfloat16, args.device),
        Stage("talker", ta.model, ta.codec_head, ta.thinker_to_talker_proj, hidden, torch.bfloat16, args.device),
    ]
    weights = {"thinker": weight_bytes(text.layers, text.norm, th.lm_head),
               "talker": weight_bytes(ta.model.layers, ta.model.norm, ta.codec_head, ta.thinker_to_talker_proj)}
    print(f"\ndevice: {torch.cuda.get_device_name()}, copy bandwidth {bw / 1e12:.2f} TB/s; batch 1, prompt "
          f"{args.prompt} positions, {args.steps} steps\n")
    print("| stage | weights read per step (GB) | roofline (ms) | eager step (ms) | CUDA-graph step (ms) |")
    print("|---|---:|---:|---:|---:|", flush=True)
    for stage in stages:
        eager = eager_step_ms(stage, args.prompt, args.steps)
        graphed = f"{graph_step_ms(stage, args.prompt, args.steps):.2f}" if args.graphs else "-"
        gb = weights[stage.name] / 1e9
        print(f"| {stage.name} | {gb:.2f} | {weights[stage.name] / bw * 1000:.2f} | {eager:.2f} | {graphed} |",
              flush=True)


if __name__ == "__main__":
    main()
