"""What seeing costs: the vision tower's time per camera frame pair, and the context of a long call with the camera on.

Builds only the vision tower of a random architecture (``--model random:7b`` or ``random:tiny``: the released sizes
or the test ones, random weights, bf16 on CUDA, float32 on the CPU) and its image processor settings, then for each
frame size (``--sizes``: ``camera`` is a 640x480 camera downscaled to the server's camera pixel budget, as
``realtime.media.video`` does; ``WxH`` a size put on the tower's grid) and each number of users (``--users``) times
``Qwen25OmniVisionEncoder.encode_many`` on one frame pair per user in one call, ``--iterations`` times after
``--warmup`` calls (CUDA-synchronised; the median is reported). Prints a Markdown table: ms per call and per pair, pairs
a second, and the GPU share one user's camera takes at the model's rate (2 frames a second: one pair a second, so the
share is the time per pair over 1 s), with the CPU preprocessing of a pair (resize, normalise, patchify) beside it.

``--prefill`` also times the thinker's text model (transformers' forward, the same random architecture) prefilling one
second of video positions after ``--prefill-context`` cached positions, the other half of a camera's cost: an
estimate (the engine batches prefill chunks of several users with its own kernels). It builds the whole text model
(the 7B one needs about 16 GB).

``--call-minutes M`` estimates the thinker context at the end of an M-minute call: turns of ``--speech-s`` seconds of
user speech (25 audio positions a second, camera video while the user speaks) and ``--reply-s`` seconds of reply
(``--reply-tokens`` text positions in the context), with no camera, with the camera and no budget, and with the video
budget of the stage config (thinker ``video_history_seconds`` / ``video_retention_ratio``; when the config has none,
the values assumed are printed).

    python scripts/vision_cost.py --model random:7b --device cuda --prefill --call-minutes 5
    python scripts/vision_cost.py --model random:tiny --users 1,2 --iterations 2   # seconds, on the CPU
"""

from __future__ import annotations

import argparse
import inspect
import math
import statistics
import sys
import time
from dataclasses import dataclass

import numpy as np
import torch

AUDIO_POSITIONS_PER_S = 25
"""Thinker positions per second of user audio (Qwen2.5-Omni's audio encoder)."""
CAMERA_FRAME = (480, 640)
"""(height, width) of the camera frame the ``camera`` size starts from."""
ASSUMED_BUDGET = (20, 0.5)
"""(video_history_seconds, video_retention_ratio) assumed when the stage config has no video budget."""


@dataclass(frozen=True)
class Timing:
    size: tuple[int, int]
    users: int
    call_ms: float
    preprocess_ms: float

    @property
    def pair_ms(self) -> float:
        return self.call_ms / self.users


def build_tower(preset: str, device: torch.device):
    """(vision tower module, :class:`Qwen25OmniVisionPreprocessor`) of the random preset, weights seeded."""
    from transformers.models.qwen2_5_omni.modeling_qwen2_5_omni import Qwen2_5OmniVisionEncoder

    from pipeline.models.qwen2_5_omni.tiny import PRESETS, build_config
    from pipeline.models.qwen2_5_omni.vision import Qwen25OmniVisionPreprocessor

    spec = PRESETS[preset]()
    vision_config = build_config(spec).thinker_config.vision_config
    raw = {
        "min_pixels": spec.image_min_pixels,
        "max_pixels": spec.image_max_pixels,
        "patch_size": spec.vision_patch_size,
        "merge_size": spec.vision_merge_size,
        "temporal_patch_size": spec.vision_temporal_patch_size,
        "image_mean": list(spec.image_mean),
        "image_std": list(spec.image_std),
    }
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    torch.manual_seed(spec.seed)
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            tower = Qwen2_5OmniVisionEncoder._from_config(vision_config)
    finally:
        torch.set_default_dtype(previous)
    return tower.eval(), Qwen25OmniVisionPreprocessor.from_preprocessor_config(raw, vision_config)


def frame_size(name: str, info) -> tuple[int, int]:
    """(height, width) the tower sees for a ``--sizes`` entry."""
    from realtime.media.video_settings import DEFAULT_CAMERA

    if name == "camera":
        return DEFAULT_CAMERA.frame_size(info, *CAMERA_FRAME)
    width, sep, height = name.partition("x")
    if not sep or not width.isdigit() or not height.isdigit():
        raise ValueError(f"a size is 'camera' or WIDTHxHEIGHT, got {name!r}")
    return info.resized(int(height), int(width))


def time_encode(encoder, preprocessor, size: tuple[int, int], users: int, *, warmup: int, iterations: int) -> Timing:
    """Median time of one ``encode_many`` call on ``users`` frame pairs of ``size``, and of preprocessing a pair."""
    rng = np.random.default_rng(0)
    pair = [rng.integers(0, 256, (*size, 3), dtype=np.uint8) for _ in range(2)]
    preprocess = []
    for _ in range(3):
        started = time.perf_counter()
        item = preprocessor(pair)
        preprocess.append(1000 * (time.perf_counter() - started))
    preprocess_ms = statistics.median(preprocess)
    items = [item] * users
    sync = torch.cuda.synchronize if encoder.device.type == "cuda" else (lambda: None)
    for _ in range(warmup):
        encoder.encode_many(items)
    sync()
    times = []
    for _ in range(iterations):
        started = time.perf_counter()
        encoder.encode_many(items)
        sync()
        times.append(1000 * (time.perf_counter() - started))
    return Timing(size, users, statistics.median(times), preprocess_ms)


def positions_per_second(info, size: tuple[int, int]) -> float:
    """Thinker positions per second of camera video of ``size`` at the model's rate."""
    return info.tokens(*size) * info.fps / info.temporal_patch_size


def encode_table(timings: list[Timing], info) -> str:
    pairs_per_s = info.fps / info.temporal_patch_size
    lines = [
        "| frame (HxW) | video positions/s | users (pairs per call) | ms per call | ms per pair | pairs/s | "
        "GPU share per user | preprocess ms per pair (CPU) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for t in timings:
        lines.append(
            f"| {t.size[0]}x{t.size[1]} | {positions_per_second(info, t.size):.0f} | {t.users} | {t.call_ms:.2f} | "
            f"{t.pair_ms:.2f} | {1000 / t.pair_ms:.0f} | {100 * t.pair_ms / 1000 * pairs_per_s:.2f} % | "
            f"{t.preprocess_ms:.1f} |"
        )
    return "\n".join(lines)


# --- prefill ----------------------------------------------------------------------------------------------------------


def time_prefill(preset: str, device: torch.device, new: list[int], context: int, *, warmup: int, iterations: int):
    """{positions: median ms} of the thinker text model prefilling ``positions`` after ``context`` cached ones."""
    from transformers import DynamicCache
    from transformers.models.qwen2_5_omni.modeling_qwen2_5_omni import Qwen2_5OmniThinkerTextModel

    from pipeline.models.qwen2_5_omni.tiny import PRESETS, build_config

    spec = PRESETS[preset]()
    text_config = build_config(spec).thinker_config.text_config
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            model = Qwen2_5OmniThinkerTextModel._from_config(text_config).eval()
    finally:
        torch.set_default_dtype(previous)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    hidden = text_config.hidden_size
    out = {}
    # transformers renamed ``past_key_values`` to ``cache`` (5.2x); the GPU image may hold either
    cache_arg = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
    with torch.inference_mode():
        cache = DynamicCache(config=text_config)
        model(inputs_embeds=torch.randn(1, context, hidden, device=device, dtype=dtype), **{cache_arg: cache})
        for positions in new:
            embeds = torch.randn(1, positions, hidden, device=device, dtype=dtype)
            times = []
            for i in range(warmup + iterations):
                sync()
                started = time.perf_counter()
                model(inputs_embeds=embeds, **{cache_arg: cache})
                sync()
                cache.crop(-positions)  # back to the context
                if i >= warmup:
                    times.append(1000 * (time.perf_counter() - started))
            out[positions] = statistics.median(times)
    del model, cache
    return out


# --- a call's context -------------------------------------------------------------------------------------------------


def video_budget(stage_config: str | None) -> tuple[int | None, float, str]:
    """(history seconds, retention ratio, where they came from) of the stage config's thinker."""
    from pipeline.config import load_stage_config

    thinker = load_stage_config(stage_config).thinker
    seconds = getattr(thinker, "video_history_seconds", None)
    if seconds is None and not hasattr(thinker, "video_history_seconds"):
        return (*ASSUMED_BUDGET, "assumed: the stage config has no video budget on this branch")
    return seconds, thinker.video_retention_ratio, "the stage config's thinker settings"


def videos_to_remove(durations: list[float], history_seconds: int | None, retention: float) -> int:
    """The budget rule (``pipeline.video.budget.VideoBudget`` where this branch has it): none while the history's
    video totals at most ``history_seconds``; else the oldest, whole messages, down to ``retention`` of it."""
    try:
        from pipeline.video.budget import VideoBudget
    except ImportError:
        if history_seconds is None or sum(durations) <= history_seconds:
            return 0
        left, n = sum(durations), 0
        while n < len(durations) and left > retention * history_seconds:
            left -= durations[n]
            n += 1
        return n
    return VideoBudget(history_seconds, retention).videos_to_remove(durations)


def call_context(
    minutes: float, speech_s: float, reply_s: float, reply_tokens: int, video_rate: float, budget
) -> dict[str, int]:
    """Thinker positions in the context of the last turn of the call: without camera, with camera and no budget, with
    the budget (``budget``: (history seconds, retention ratio)); and the turns."""
    turns = max(1, math.floor(minutes * 60 / (speech_s + reply_s)))
    spoken = turns * (AUDIO_POSITIONS_PER_S * speech_s + reply_tokens)
    kept: list[float] = []  # video seconds of the history's messages that still hold video
    for _ in range(turns - 1):
        kept.append(speech_s)
        removed = videos_to_remove(kept, *budget)
        kept = kept[removed:]
    with_budget = spoken + video_rate * (sum(kept) + speech_s)
    return {
        "turns": turns,
        "no camera": round(spoken),
        "camera, no budget": round(spoken + video_rate * speech_s * turns),
        "camera, budget": round(with_budget),
    }


def context_lines(args: argparse.Namespace, info, sizes: list[tuple[int, int]], max_context: int) -> list[str]:
    seconds, retention, source = video_budget(args.stage_config)
    lines = [
        f"Context at the last turn of a {args.call_minutes:g}-minute call: turns of {args.speech_s:g} s of speech "
        f"(audio {AUDIO_POSITIONS_PER_S} positions/s, camera video while the user speaks) and {args.reply_s:g} s of "
        f"reply ({args.reply_tokens} text positions); video budget {seconds} s of history down to {retention:g} of "
        f"it ({source}); system prompt not counted; the model's context: {max_context} positions.",
        "",
        "| frame (HxW) | video positions/s | turns | no camera | camera, no budget | camera, budget |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for size in sizes:
        rate = positions_per_second(info, size)
        c = call_context(args.call_minutes, args.speech_s, args.reply_s, args.reply_tokens, rate, (seconds, retention))
        lines.append(
            f"| {size[0]}x{size[1]} | {rate:.0f} | {c['turns']} | {c['no camera']} | {c['camera, no budget']} | "
            f"{c['camera, budget']} |"
        )
    return lines


# --- command line -----------------------------------------------------------------------------------------------------


def _ints(text: str) -> list[int]:
    values = [int(v) for v in text.split(",") if v.strip()]
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"comma-separated positive integers, got {text!r}")
    return values


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="random:tiny", help="random:7b or random:tiny (default: random:tiny)")
    p.add_argument("--device", default="cpu", help="cuda, cuda:N or cpu (default: cpu)")
    p.add_argument(
        "--sizes", default="camera,448x448", help="comma-separated: camera and/or WxH (default: %(default)s)"
    )
    p.add_argument("--users", type=_ints, default=[1, 2, 4, 8, 16], help="pairs per call (default: 1,2,4,8,16)")
    p.add_argument("--warmup", type=int, default=3, help="untimed calls first (default: 3)")
    p.add_argument("--iterations", type=int, default=20, help="timed calls, median reported (default: 20)")
    p.add_argument("--prefill", action="store_true", help="also time the thinker's prefill of a second of video")
    p.add_argument("--prefill-context", type=int, default=4000, help="cached positions before it (default: 4000)")
    p.add_argument("--call-minutes", type=float, default=None, help="estimate the context of a call this long")
    p.add_argument("--speech-s", type=float, default=5.0, help="user speech per turn, seconds (default: 5)")
    p.add_argument("--reply-s", type=float, default=8.0, help="reply audio per turn, seconds (default: 8)")
    p.add_argument("--reply-tokens", type=int, default=30, help="reply text positions per turn (default: 30)")
    p.add_argument("--stage-config", default=None, help="stage config for the video budget (default: the packaged)")
    p.add_argument("--threads", type=int, default=1, help="CPU threads of torch (default: 1)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from pipeline.models.qwen2_5_omni.tiny import PRESETS, build_config
    from pipeline.models.qwen2_5_omni.vision_encoder import Qwen25OmniVisionEncoder

    preset = args.model.removeprefix("random:")
    if not args.model.startswith("random:") or preset not in PRESETS:
        print(f"error: --model must be one of {', '.join('random:' + p for p in PRESETS)}", file=sys.stderr)
        return 2
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    tower, preprocessor = build_tower(preset, device)
    info = preprocessor.info
    try:
        sizes = [frame_size(name.strip(), info) for name in args.sizes.split(",")]
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    encoder = Qwen25OmniVisionEncoder(tower, device=device, batch=True)
    gpu = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    print(
        f"{args.model} vision tower ({sum(p.numel() for p in tower.parameters()) / 1e6:.1f} M parameters, "
        f"{encoder.dtype}, attention {tower.config._attn_implementation}) on {gpu}; pairs of one call batched; "
        f"median of {args.iterations} after {args.warmup} warm-up; GPU share per user at {info.fps:g} fps "
        f"({info.fps / info.temporal_patch_size:g} pair/s).\n"
    )
    timings = [
        time_encode(encoder, preprocessor, size, users, warmup=args.warmup, iterations=args.iterations)
        for size in sizes
        for users in args.users
    ]
    print(encode_table(timings, info))
    del encoder, tower
    if args.prefill:
        rates = {size: round(positions_per_second(info, size)) for size in sizes}
        ms = time_prefill(
            preset, device, sorted(set(rates.values())), args.prefill_context, warmup=args.warmup, iterations=10
        )
        print(
            f"\nThinker prefill of one second of video after {args.prefill_context} cached positions (transformers' "
            "text model forward, batch 1; an estimate of the engine's):\n"
        )
        print("| frame (HxW) | positions | prefill ms | GPU share per user |\n|---|---:|---:|---:|")
        for size, positions in rates.items():
            print(f"| {size[0]}x{size[1]} | {positions} | {ms[positions]:.2f} | {ms[positions] / 10:.2f} % |")
    if args.call_minutes is not None:
        max_context = build_config(PRESETS[preset]()).thinker_config.text_config.max_position_embeddings
        print("\n" + "\n".join(context_lines(args, info, sizes, max_context)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
