"""Pipeline benchmark: time to first audio chunk and real-time factor of the streaming engine next to
transformers' reference ``generate`` on the same input (not a test; prints a Markdown table).

    python scripts/bench_pipeline.py                       # tiny embedded model, CPU, 1 thread
    python scripts/bench_pipeline.py --model DIR --device cuda --text-tokens 40 --codec-tokens 500

Reply lengths are forced (stop tokens suppressed until the lengths are reached) so both sides do the
same work with random weights. Definitions:
- TTFA: from the call to the first audio chunk (the reference returns audio only at the end, so its
  TTFA is its whole run).
- RTF: wall time to produce all audio / audio duration (< 1 is faster than real time).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=None, help="checkpoint folder (default: the embedded tiny model)")
    p.add_argument("--device", default="cpu")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--text-tokens", type=int, default=20)
    p.add_argument("--codec-tokens", type=int, default=150, help="50 per second of audio")
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--audio-in", type=Path, default=Path("tests/fixtures/speech/capital_of_france.wav"))
    p.add_argument("--skip-reference", action="store_true")
    return p.parse_args(argv)


def stage_config(args):
    from pipeline.config import load_stage_config

    cfg = load_stage_config()
    fixed = {"min_tokens": args.text_tokens, "max_tokens": args.text_tokens}
    talker = {"min_tokens": args.codec_tokens, "max_tokens": args.codec_tokens}
    return replace(
        cfg,
        thinker=replace(cfg.thinker, device=args.device, **fixed),
        talker=replace(cfg.talker, device=args.device, **talker),
        token2wav=replace(cfg.token2wav, device=args.device),
    )


def load_wav_16k(path: Path) -> np.ndarray:
    import soundfile as sf
    import soxr

    pcm, rate = sf.read(path, dtype="float32", always_2d=True)
    return soxr.resample(pcm.mean(axis=1), rate, 16000).astype(np.float32)


async def run_streaming(engine, prompt) -> dict:
    from pipeline.outputs import AudioChunk, ResponseDone

    conv = engine.conversation()
    if isinstance(prompt, str):
        await conv.add_text("u", prompt)
    else:
        await conv.add_audio("u", prompt)
    if engine.cfg.thinker.torch_device().startswith("cuda"):
        torch.cuda.synchronize()
    start = time.perf_counter()
    first = None
    async for ev in conv.respond(item_id="a"):
        if isinstance(ev, AudioChunk) and first is None:
            first = time.perf_counter() - start
        if isinstance(ev, ResponseDone):
            total = time.perf_counter() - start
            done = ev
    await conv.close()
    audio_s = done.audio_samples / 24000
    return {"ttfa": first, "total": total, "audio_s": audio_s, "rtf": total / audio_s if audio_s else float("nan"),
            "text": done.usage.output_text_tokens, "codes": done.usage.output_audio_tokens}


def run_reference(model, ckpt, args, prompt) -> dict:
    """transformers' generate on the same prompt; returns its time (== its time to first audio)."""
    from pipeline.models.qwen2_5_omni.prompt import DEFAULT_SYSTEM_PROMPT

    tok, s = ckpt.tokenizer, ckpt.special
    kwargs = {}
    if isinstance(prompt, str):
        messages = [{"role": "system", "content": DEFAULT_SYSTEM_PROMPT}, {"role": "user", "content": prompt}]
        ids = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_tensors="pt")
        ids = ids if isinstance(ids, torch.Tensor) else ids["input_ids"]
    else:
        fe = ckpt.feature_extractor
        feats = fe(prompt, sampling_rate=16000, return_attention_mask=True, padding="max_length", return_tensors="pt")
        n = ckpt.audio_tokens_for_samples(len(prompt))
        enc = lambda t: tok.encode(t, add_special_tokens=False)  # noqa: E731
        ids = torch.tensor([[s.im_start, *enc(f"system\n{DEFAULT_SYSTEM_PROMPT}"), s.im_end, *enc("\n"), s.im_start,
                             *enc("user\n"), s.audio_start, *[s.audio_token] * n, s.audio_end, s.im_end, *enc("\n"),
                             s.im_start, *enc("assistant\n")]])
        kwargs = {"input_features": feats["input_features"].to(args.device),
                  "feature_attention_mask": feats["attention_mask"].to(args.device)}
    ids = ids.to(args.device)
    sync = torch.cuda.synchronize if args.device.startswith("cuda") else (lambda: None)
    sync()
    start = time.perf_counter()
    with torch.inference_mode():
        _, wav = model.generate(
            input_ids=ids, attention_mask=torch.ones_like(ids), speaker="Chelsie",
            thinker_max_new_tokens=args.text_tokens, thinker_min_new_tokens=args.text_tokens,
            talker_max_new_tokens=args.codec_tokens, talker_min_new_tokens=args.codec_tokens,
            talker_eos_token_id=list(s.codec_stop_ids()), **kwargs,
        )
    sync()
    total = time.perf_counter() - start
    audio_s = wav.numel() / 24000
    return {"ttfa": total, "total": total, "audio_s": audio_s, "rtf": total / audio_s if audio_s else float("nan")}


def summarize(rows: list[dict]) -> dict:
    return {k: statistics.median(r[k] for r in rows) for k in ("ttfa", "total", "audio_s", "rtf")}


def main(argv=None) -> None:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    from pipeline.embedded import resolve_model
    from pipeline.engine import OmniEngine

    path = resolve_model(args.model)
    engine = OmniEngine.from_pretrained(path, stage_config(args), seed=0)
    prompts = {"text": "Hello! Can you tell me a story?", "audio": load_wav_16k(args.audio_in)}
    results = {}
    for name, prompt in prompts.items():
        asyncio.run(run_streaming(engine, prompt))  # warm-up
        results[("streaming", name)] = summarize([asyncio.run(run_streaming(engine, prompt)) for _ in range(args.runs)])
    engine.close()
    if not args.skip_reference:
        from transformers import Qwen2_5OmniForConditionalGeneration

        dtype = torch.bfloat16 if args.device.startswith("cuda") else torch.float32
        model = Qwen2_5OmniForConditionalGeneration.from_pretrained(path, dtype=dtype).to(args.device).eval()
        model.token2wav.float()
        for name, prompt in prompts.items():
            run_reference(model, engine.ckpt, args, prompt)  # warm-up
            rows = [run_reference(model, engine.ckpt, args, prompt) for _ in range(args.runs)]
            results[("reference generate", name)] = summarize(rows)
    print(f"\nmodel: {path}\ndevice: {args.device}, torch threads: {args.threads}, runs: {args.runs} (median)")
    print(f"reply: {args.text_tokens} text tokens, {args.codec_tokens} codec tokens "
          f"({args.codec_tokens / 50:.1f} s of audio)\n")
    print("| pipeline | input | time to first audio (ms) | total (ms) | audio (s) | RTF |")
    print("|---|---|---:|---:|---:|---:|")
    for (kind, name), r in results.items():
        print(f"| {kind} | {name} | {r['ttfa'] * 1000:.0f} | {r['total'] * 1000:.0f} | {r['audio_s']:.2f} | {r['rtf']:.3f} |")


if __name__ == "__main__":
    main()
