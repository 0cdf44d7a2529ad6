"""Where token2wav's time goes on a GPU: the DiT solve and the vocoder per chunk shape and batch, and the kernels of
one DiT velocity evaluation and one vocoder call (a diagnostic, not a test; prints Markdown, ``--json`` keeps it all).

    python scripts/profile_token2wav.py --device cuda --threads 4 --slots 1,4,16
    python scripts/profile_token2wav.py --tiny --device cpu --slots 1,2        # smoke run on the CPU

Builds the token2wav of the Qwen2.5-Omni-7B architecture with random weights and a
synthesizer with the packaged GPU settings (CUDA graphs, TF32, compiled bfloat16 DiT blocks, the vocoder's
activations fused; ``--plain`` for none of them, ``--vocoder reference`` for the activations as transformers writes
them), warmed up for the largest slot count. Then, per slot count (streams in one batch):

- ``solve_ms``: one DiT ODE solve (36 evaluations, CFG batched) of the first chunk's window and of a steady chunk's
  window, through the synthesizer's batched path (a graph replay on CUDA), median of ``--repeats``;
- ``vocoder_ms``: the vocoder on the first chunk's and a steady chunk's mel frames for that many rows;
- kernels: with ``torch.profiler``, one velocity evaluation of the steady window run eagerly (the compiled blocks'
  kernels, without a graph) and one vocoder call: kernel count and GPU time, the top kernels by time.

Kernel times under the profiler are the GPU's own; the host launch gaps between them are what the graphs remove, so
``solve_ms / 36`` against the evaluation's summed kernel time shows how much of a replayed evaluation is gaps.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the repository, when not installed

EVALUATIONS = 36
"""Velocity evaluations per ODE solve: RK4 (4 each) over the 9 intervals of the packaged 10 time points."""


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cuda")
    p.add_argument("--tiny", action="store_true", help="the tiny random token2wav of the tests")
    p.add_argument(
        "--slots",
        default="1,4,16",
        help="streams per batch to time (each padded to the next power of two below the largest, as the "
        "engine pads its jobs)",
    )
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--plain", action="store_true", help="no graphs, TF32, compile or bfloat16 (the float32 reference)")
    p.add_argument(
        "--vocoder",
        choices=("fused", "reference"),
        default="fused",
        help="the vocoder's activations: one Triton kernel each (packaged on CUDA) or the modules' forward",
    )
    p.add_argument("--top", type=int, default=12, help="kernels listed per profile")
    p.add_argument(
        "--dit-attention",
        choices=("triton", "auto", "cudnn", "efficient", "math"),
        default="triton",
        help="triton: the packaged one-kernel block attention (needs the fast path on CUDA); otherwise the "
        "SDPA backend the DiT blocks are compiled and captured with (auto: torch's choice); run "
        "with a fresh TORCHINDUCTOR_CACHE_DIR: inductor's on-disk cache reuses a graph traced with "
        "another backend",
    )
    p.add_argument(
        "--inductor",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="set torch._inductor.config.NAME before the DiT blocks compile (repeatable), e.g. "
        "max_autotune=1: to try inductor's settings on the compiled blocks (fresh caches, as above)",
    )
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--json", default=None)
    return p.parse_args(argv)


def inductor_settings(pairs: list[str]) -> dict[str, object]:
    """``NAME=VALUE`` pairs as torch._inductor.config values, typed as the setting's current value (a boolean takes
    1/0/true/false, an integer digits, anything else the text). Unknown names are refused (a typo would otherwise
    measure the default)."""
    import torch._inductor.config as inductor

    settings: dict[str, object] = {}
    for pair in pairs:
        name, sep, raw = pair.partition("=")
        if not sep or not hasattr(inductor, name):
            raise SystemExit(f"--inductor {pair!r}: expected NAME=VALUE with NAME in torch._inductor.config")
        current = getattr(inductor, name)
        try:
            if isinstance(current, bool):
                value: object = {"1": True, "true": True, "0": False, "false": False}[raw.lower()]
            elif isinstance(current, int):
                value = int(raw)
            else:
                value = raw
        except (KeyError, ValueError):
            raise SystemExit(f"--inductor {pair!r}: {name} is a {type(current).__name__}") from None
        settings[name] = value
    return settings


def synthesizer(model, device: str, plain: bool, max_batch: int, fused_vocoder: bool, triton_attention: bool = False):
    from pipeline.models.qwen2_5_omni.token2wav_stream import StreamingToken2Wav

    cuda = device.startswith("cuda")
    fast = cuda and not plain
    return StreamingToken2Wav(
        model,
        cuda_graphs=fast,
        tf32_matmul=fast,
        compile_dit=fast,
        max_batch=max_batch,
        fused_vocoder=fast and fused_vocoder,
        dit_dtype=torch.bfloat16 if fast else torch.float32,
        dit_attention="triton" if fast and triton_attention else "sdpa",
    )


def window_job(t2w, frames: int, first_frame: int):
    from pipeline.models.qwen2_5_omni.token2wav_graphs import WindowJob

    dit = t2w.dit
    width = dit.input_embed.proj.in_features - dit.config.mel_dim
    groups = 2 if t2w.use_cfg else 1
    return WindowJob(
        torch.randn(1, frames, dit.config.mel_dim, device=t2w.device),
        torch.randn(groups, frames, width, device=t2w.device),
        first_frame=first_frame,
    )


def kernel_table(fn, sync, top: int, cuda: bool) -> dict:
    """Kernels (``cuda``: the work is on the GPU) or top-level operators (CPU) of one call of ``fn`` under the
    profiler: count, summed time, the top ones."""
    from torch.profiler import ProfilerActivity, profile

    fn()  # outside the profile: anything lazy (allocator, handles) happens here
    sync()
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=activities) as prof:
        fn()
        sync()
    kernels: dict[str, list[float]] = {}
    for event in prof.events():
        on_gpu = event.device_type == torch.autograd.DeviceType.CUDA
        if on_gpu or (not cuda and event.cpu_parent is None):
            kernels.setdefault(event.name, []).append(event.device_time if on_gpu else event.cpu_time)
    rows = sorted(((name, len(us), sum(us)) for name, us in kernels.items()), key=lambda r: -r[2])
    return {
        "kernels": sum(r[1] for r in rows),
        "total_us": sum(r[2] for r in rows),
        "top": [{"name": name[:90], "count": count, "us": us} for name, count, us in rows[:top]],
    }


def measure(t2w, slots: int, sync, repeats: int, top: int) -> dict:
    cfg = t2w.cfg
    first = cfg.first_chunk_frames + cfg.future_frames
    steady = cfg.past_frames + cfg.chunk_frames + cfg.future_frames
    mel_dim = t2w.dit.config.mel_dim
    out = {"slots": slots, "first_window": first, "steady_window": steady}
    for name, frames, first_frame in (("first", first, 0), ("steady", steady, 480)):
        jobs = [window_job(t2w, frames, first_frame) for _ in range(slots)]
        out[f"{name}_solve_ms"] = timed_ms(lambda jobs=jobs: t2w._dit_batches.solve(jobs), sync, repeats)
    voc_first = cfg.first_chunk_frames + cfg.first_vocoder_lookahead_frames
    voc_steady = cfg.vocoder_overlap_frames + cfg.chunk_frames
    for name, frames in (("first", voc_first), ("steady", voc_steady)):
        mels = [torch.randn(1, mel_dim, frames, device=t2w.device) - 4.0 for _ in range(slots)]
        out[f"{name}_vocoder_ms"] = timed_ms(lambda mels=mels: t2w._vocoder.many(mels), sync, repeats)
    cuda = t2w.device.type == "cuda"
    out["evaluation"] = kernel_table(lambda: t2w._dit_batches.evaluate_blank(steady, slots), sync, top, cuda)
    mels = [torch.randn(1, mel_dim, voc_steady, device=t2w.device) - 4.0 for _ in range(slots)]
    out["vocoder"] = kernel_table(lambda: t2w._vocoder._call(torch.cat(mels), voc_steady), sync, top, cuda)
    return out


def print_report(results: list[dict], device: str) -> None:
    print(f"\ntoken2wav profile on {device}\n")
    print(
        "| slots | first window solve (ms) | per evaluation | steady window solve (ms) | per evaluation "
        "| eval kernels | eval kernel time (ms) | vocoder first / steady (ms) | vocoder kernels / time (ms) |"
    )
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in results:
        ev, voc = r["evaluation"], r["vocoder"]
        print(
            f"| {r['slots']} | {r['first_solve_ms']:.1f} | {r['first_solve_ms'] / EVALUATIONS:.2f} "
            f"| {r['steady_solve_ms']:.1f} | {r['steady_solve_ms'] / EVALUATIONS:.2f} | {ev['kernels']} "
            f"| {ev['total_us'] / 1000:.2f} | {r['first_vocoder_ms']:.1f} / {r['steady_vocoder_ms']:.1f} "
            f"| {voc['kernels']} / {voc['total_us'] / 1000:.2f} |"
        )
    for r in results:
        for part in ("evaluation", "vocoder"):
            print(f"\n{part}, {r['slots']} slots, steady shape: top kernels\n")
            print("| kernel | count | ms |")
            print("|---|---:|---:|")
            for k in r[part]["top"]:
                print(f"| `{k['name']}` | {k['count']} | {k['us'] / 1000:.3f} |")


def attention_backend(name: str):
    """``sdpa_kernel`` for the named backend, around compile, capture and the runs (a compiled graph keeps the backend
    it was traced with); ``auto`` leaves torch's choice."""
    import contextlib

    from torch.nn.attention import SDPBackend, sdpa_kernel

    backends = {
        "cudnn": SDPBackend.CUDNN_ATTENTION,
        "efficient": SDPBackend.EFFICIENT_ATTENTION,
        "math": SDPBackend.MATH,
    }
    return contextlib.nullcontext() if name in ("auto", "triton") else sdpa_kernel([backends[name]])


def build_token2wav(device: str, tiny: bool):
    """The token2wav of the tiny or the 7B random Qwen2.5-Omni, float32 (as the reference requires), seeded."""
    from transformers.models.qwen2_5_omni.modeling_qwen2_5_omni import Qwen2_5OmniToken2WavModel

    from pipeline.models.qwen2_5_omni.tiny import Qwen25OmniRandomModelSpec, build_config

    spec = Qwen25OmniRandomModelSpec.tiny() if tiny else Qwen25OmniRandomModelSpec.qwen2_5_omni_7b()
    torch.manual_seed(spec.seed)
    with torch.device(device):
        model = Qwen2_5OmniToken2WavModel(build_config(spec).token2wav_config).float().eval()
    with torch.no_grad():  # audible output, as the random checkpoints do (tiny.py: output_gain)
        model.code2wav_bigvgan_model.conv_post.weight.mul_(spec.output_gain)
    return model


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


def main(argv=None) -> None:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    cuda = args.device.startswith("cuda")
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    slots = [int(n) for n in args.slots.split(",")]
    model = build_token2wav(args.device, args.tiny)
    settings = inductor_settings(args.inductor)
    import torch._inductor.config as inductor

    with torch.inference_mode(), attention_backend(args.dit_attention), inductor.patch(settings):
        # a timed batch is padded as in the engine: to the next power of two, or the largest slot count
        t2w = synthesizer(
            model, args.device, args.plain, max(slots), args.vocoder == "fused", args.dit_attention == "triton"
        )
        started = time.perf_counter()
        t2w.warm_up(max_batch=max(slots))
        sync()
        warm_up_s = time.perf_counter() - started
        results = [measure(t2w, n, sync, args.repeats, args.top) for n in slots]
    device = torch.cuda.get_device_name() if cuda else "CPU"
    print(
        f"DiT attention: {args.dit_attention}; inductor settings: {settings or 'defaults'}; "
        f"warm-up (compile + capture) {warm_up_s:.1f} s; "
        f"graphs: {t2w.graph_stats()}"
    )
    print_report(results, device)
    if args.json:
        Path(args.json).write_text(
            json.dumps({"device": device, "warm_up_s": warm_up_s, "inductor": settings, "results": results}, indent=2)
        )


if __name__ == "__main__":
    main()
