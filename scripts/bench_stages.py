"""Per-stage decode step time against the time needed to read the stage's weights (GPU).

    python scripts/bench_stages.py --random-7b --device cuda --batches 1,4,16,32,64

For the thinker and the talker: the engine's decode step (``ThinkerRunner.decode`` / ``TalkerRunner.decode``: KV
slot pool, Triton attention, one CUDA graph replay per step, logits read back as the engine samples them) at each
batch size, every row in its own slot after a ``--prompt``-position prefill; and, with ``--eager-baseline``,
transformers' own forward at batch 1 over a DynamicCache (how the engine decoded before the slot pool). The
roofline is the bytes a step must read (weights + the rows' KV) divided by the device-to-device copy bandwidth
measured in the same run.
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


def positions(start: int, n: int, device) -> torch.Tensor:
    return torch.arange(start, start + n, device=device).view(1, 1, -1).expand(3, 1, -1)


@torch.inference_mode()
def eager_hf_step_ms(body, head, pre, hidden_in: int, prompt: int, steps: int, device) -> float:
    """transformers' forward at batch 1 over a DynamicCache, each token read back to the host."""
    from transformers import DynamicCache

    cache = DynamicCache(config=body.config)
    x = torch.randn(1, prompt, hidden_in, device=device, dtype=torch.bfloat16)
    body(inputs_embeds=pre(x), position_ids=positions(0, prompt, device), past_key_values=cache, use_cache=True)
    one = torch.randn(1, 1, hidden_in, device=device, dtype=torch.bfloat16)
    times = []
    for i in range(steps + 3):
        torch.cuda.synchronize()
        start = time.perf_counter()
        out = body(inputs_embeds=pre(one), position_ids=positions(prompt + i, 1, device), past_key_values=cache,
                   use_cache=True)
        int(head(out.last_hidden_state[:, -1:]).argmax())
        times.append(time.perf_counter() - start)
    return sorted(times[3:])[len(times[3:]) // 2] * 1000


@torch.inference_mode()
def engine_step_ms(runner, kind: str, batch: int, prompt: int, steps: int, hidden_in: int) -> float:
    """The engine's batched decode step (median of ``steps``), rows in slots 0..batch-1 after a prefill."""
    dev = runner.device
    for slot in range(batch):
        x = torch.randn(prompt, hidden_in, device=dev, dtype=runner.dtype)
        if kind == "thinker":
            runner.prefill(x, slot, 0)
        else:
            runner.decoder.prefill(slot, runner.proj(x), 0)
    slots = list(range(batch))
    vectors = torch.randn(batch, hidden_in, device=dev, dtype=runner.dtype)
    times = []
    for i in range(steps + 3):
        pos = [prompt + i] * batch
        torch.cuda.synchronize()
        start = time.perf_counter()
        if kind == "thinker":
            logits = runner.decode([7] * batch, slots, pos).logits
        else:
            logits, _ = runner.decode([3] * batch, vectors, slots, pos)
        logits.argmax(-1).tolist()  # the engine needs each token on the host
        times.append(time.perf_counter() - start)
    return sorted(times[3:])[len(times[3:]) // 2] * 1000


def kv_bytes_per_position(runner) -> int:
    pool = runner.pool
    return sum(k[0, 0].numel() * k.element_size() for k in (*pool.keys, *pool.values))


def main(argv=None) -> None:
    from bench_common import add_model_args

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_model_args(p)
    p.add_argument("--prompt", type=int, default=300)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--batches", default="1,4,16,32,64")
    p.add_argument("--eager-baseline", action="store_true")
    p.add_argument("--unfused-baseline", action="store_true",
                   help="also time the graphs of HF's own layer code (fused_decode off) beside the fused kernels")
    args = p.parse_args(argv)
    from pipeline.models.qwen2_5_omni.parts import thinker_text_model
    from pipeline.models.qwen2_5_omni.tiny import RandomModelSpec, build_random_model
    from pipeline.runners.talker import TalkerRunner
    from pipeline.runners.thinker import ThinkerRunner

    batches = [int(b) for b in args.batches.split(",")]
    ckpt = build_random_model(RandomModelSpec.qwen2_5_omni_7b(), device=args.device, dtype=torch.bfloat16)
    bw = measure_bandwidth(args.device)
    th, ta = ckpt.thinker, ckpt.talker
    text = thinker_text_model(th)
    hidden = text.config.hidden_size
    max_len = args.prompt + args.steps + 8
    kw = dict(device=torch.device(args.device), dtype=torch.bfloat16, kv_slots=max(batches), max_len=max_len,
              graph_batch_sizes=tuple(batches))
    runners = {}
    if args.unfused_baseline:  # built first: the fused runners re-point the HF weights at views (same values)
        runners.update({("thinker", "HF layers"): ThinkerRunner(th, **kw, fused_decode=False),
                        ("talker", "HF layers"): TalkerRunner(ta, **kw, fused_decode=False)})
    runners.update({("thinker", "fused"): ThinkerRunner(th, **kw), ("talker", "fused"): TalkerRunner(ta, **kw)})
    weights = {"thinker": weight_bytes(text.layers, text.norm, th.lm_head),
               "talker": weight_bytes(ta.model.layers, ta.model.norm, ta.codec_head, ta.thinker_to_talker_proj)}
    print(f"\ndevice: {torch.cuda.get_device_name()}, copy bandwidth {bw / 1e12:.2f} TB/s; prompt {args.prompt} "
          f"positions per row, median of {args.steps} steps\n")
    if args.eager_baseline:
        eager = {"thinker": eager_hf_step_ms(text, th.lm_head, lambda x: x, hidden, args.prompt, args.steps, args.device),
                 "talker": eager_hf_step_ms(ta.model, ta.codec_head, ta.thinker_to_talker_proj, hidden, args.prompt,
                                            args.steps, args.device)}
        print("transformers forward, batch 1, DynamicCache (eager): " +
              ", ".join(f"{k} {v:.2f} ms" for k, v in eager.items()) + "\n")
    print("| stage | layer kernels | batch | bytes read per step (GB) | roofline (ms) | engine step (ms) | x roofline "
          "| tokens/s |")
    print("|---|---|---:|---:|---:|---:|---:|---:|", flush=True)
    for (name, kernels), runner in sorted(runners.items()):
        if kernels == "fused" and runner.decoder.fused is None:
            kernels = "HF layers (fusing unavailable)"
        runner.batched.capture()
        for b in batches:
            ms = engine_step_ms(runner, name, b, args.prompt, args.steps, hidden)
            read = weights[name] + b * (args.prompt + args.steps) * kv_bytes_per_position(runner)
            roof = read / bw * 1000
            print(f"| {name} | {kernels} | {b} | {read / 1e9:.2f} | {roof:.2f} | {ms:.2f} | {ms / roof:.2f} | {b / ms * 1000:.0f} |",
                  flush=True)
        print(f"<!-- {name} ({kernels}): graphs captured for {runner.batched.captured}, replays {runner.batched.replays}, "
              f"eager steps {runner.batched.eager_steps} -->", flush=True)


if __name__ == "__main__":
    main()
