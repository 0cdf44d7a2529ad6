"""Shared setup of the benchmark scripts: which model, on which device, with forced reply lengths."""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import torch

FIXTURES = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "speech"


def add_model_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default=None, help="checkpoint folder (default: the embedded tiny model)")
    p.add_argument("--random-7b", action="store_true",
                   help="build the full Qwen2.5-Omni-7B architecture with random weights in memory (GPU)")
    p.add_argument("--device", default="cpu")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--text-tokens", type=int, default=20)
    p.add_argument("--codec-tokens", type=int, default=150, help="50 per second of audio")
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--tf32", action="store_true", help="token2wav: TF32 DiT matmuls on CUDA")
    p.add_argument("--first-chunk-frames", type=int, default=None,
                   help="token2wav first chunk in mel frames (default: the stage config's)")
    p.add_argument("--ramp-frames", default=None, help="comma-separated chunk sizes after the first")
    p.add_argument("--no-graphs", action="store_true", help="thinker/talker decode without CUDA graphs")
    p.add_argument("--no-fused", action="store_true", help="thinker/talker graphs of HF's layer code (fused_decode off)")
    p.add_argument("--t2w-worker", choices=("auto", "on", "off"), default=None,
                   help="token2wav on its own thread (default: the stage config's token2wav.worker_thread; auto: on with CUDA)")
    p.add_argument("--t2w-compile", choices=("auto", "on", "off"), default=None,
                   help="token2wav: torch.compile the DiT blocks at start (default: the stage config's "
                        "token2wav.compile, auto: on with CUDA)")
    p.add_argument("--engine-process", choices=("auto", "on", "off"), default=None,
                   help="engine core in a child process (default: the stage config's engine.process, auto: on with "
                        "CUDA)")


def stage_config(args, **thinker):
    """The packaged stage graph on ``args.device`` with reply lengths forced (stop tokens
    suppressed until the lengths are reached) so runs with random weights do the same work."""
    from pipeline.config import load_stage_config

    chunking = {}
    if args.first_chunk_frames:
        chunking["first_chunk_frames"] = args.first_chunk_frames
    if args.ramp_frames is not None:
        chunking["ramp_frames"] = [int(x) for x in args.ramp_frames.split(",") if x]
    thinker.setdefault("cuda_graphs", not args.no_graphs)
    thinker.setdefault("fused_decode", not args.no_fused)
    token2wav = {"device": args.device, "chunking": chunking}
    if args.tf32:
        token2wav["tf32_matmul"] = True
    if args.t2w_worker is not None:
        token2wav["worker_thread"] = args.t2w_worker
    if args.t2w_compile is not None:
        token2wav["compile"] = args.t2w_compile
    stages = {
        "thinker": {"device": args.device, "min_tokens": args.text_tokens, "max_tokens": args.text_tokens, **thinker},
        "talker": {"device": args.device, "min_tokens": args.codec_tokens, "max_tokens": args.codec_tokens,
                   "cuda_graphs": not args.no_graphs, "fused_decode": not args.no_fused},
        "token2wav": token2wav,
    }
    engine = {} if args.engine_process is None else {"process": args.engine_process}
    return load_stage_config(overrides={"stages": stages, "engine": engine})


def checkpoint_loader(args):
    """Returns (picklable checkpoint recipe, model label). Random 7B weights are built in memory (nothing
    downloaded), on ``args.device`` in bf16."""
    from pipeline.loaders import PretrainedCheckpoint, RandomCheckpoint

    if args.random_7b:
        from pipeline.models.qwen2_5_omni.tiny import RandomModelSpec

        loader = RandomCheckpoint(RandomModelSpec.qwen2_5_omni_7b(), dtype=torch.bfloat16)
        return loader, "Qwen2.5-Omni-7B architecture, random weights (bf16)"
    from pipeline.embedded import resolve_model

    path = resolve_model(args.model)
    return PretrainedCheckpoint(path), path


def build_engine(args, cfg):
    """Returns (engine, model label). With ``engine.process`` on (auto: on CUDA) the engine core runs in a child
    process that builds or loads the weights itself; ``engine.ckpt`` is then None."""
    from pipeline.engine import OmniEngine

    torch.set_num_threads(args.threads)
    loader, label = checkpoint_loader(args)
    return OmniEngine.from_loader(loader, cfg, seed=0, torch_threads=args.threads), label


def sync_engine(engine) -> None:
    """Wait for the engine's queued GPU work, when it runs in this process (a child process's work is its own:
    an idle engine's last results already reached the host)."""
    if not engine.uses_process:
        sync(engine.cfg.thinker.device)


def reference_model(ckpt):
    """transformers' Qwen2_5OmniForConditionalGeneration sharing the engine's loaded parts."""
    from transformers import Qwen2_5OmniForConditionalGeneration

    with torch.device("meta"):
        model = Qwen2_5OmniForConditionalGeneration(ckpt.config)
    model.thinker, model.talker, model.token2wav = ckpt.thinker, ckpt.talker, ckpt.token2wav
    model.speaker_map = {
        name: {"bos_token": s.bos_token, "cond": s.cond, "ref_mel": s.ref_mel} for name, s in ckpt.speakers.items()
    }
    return model.eval()


def load_wav_16k(path: Path) -> np.ndarray:
    import soundfile as sf
    import soxr

    pcm, rate = sf.read(path, dtype="float32", always_2d=True)
    return soxr.resample(pcm.mean(axis=1), rate, 16000).astype(np.float32)


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def percentile(values, q: float) -> float:
    return float(np.percentile(np.asarray(values, dtype=np.float64), q))
