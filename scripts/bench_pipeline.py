"""Pipeline benchmark: time to first audio chunk and real-time factor of the streaming engine next to
transformers' reference ``generate`` on the same input (not a test; prints a Markdown table).

    python scripts/bench_pipeline.py                       # tiny embedded model, CPU, 1 thread
    python scripts/bench_pipeline.py --random-7b --device cuda --text-tokens 40 --codec-tokens 500 --runs 3

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
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_common import (  # noqa: E402
    FIXTURES,
    add_model_args,
    build_engine,
    checkpoint_loader,
    load_wav_16k,
    reference_model,
    stage_config,
    sync,
    sync_engine,
)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_model_args(p)
    p.add_argument("--audio-in", type=Path, default=FIXTURES / "capital_of_france.wav")
    p.add_argument("--inputs", default="text,audio", help="comma-separated: text, audio")
    p.add_argument("--skip-reference", action="store_true")
    return p.parse_args(argv)


async def run_streaming(engine, prompt) -> dict:
    from pipeline.outputs import AudioChunk, ResponseDone

    conv = engine.conversation()
    if isinstance(prompt, str):
        await conv.add_text("u", prompt)
    else:
        await conv.add_audio("u", prompt)
    await engine.wait_idle()
    sync_engine(engine)
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
    t = done.timings
    return {"ttfa": first, "total": total, "audio_s": audio_s, "rtf": total / audio_s if audio_s else float("nan"),
            "prefill": t.prefill_done_ms, "talker_first_code": t.talker_first_code_ms,
            "talker_first_chunk": t.talker_first_chunk_ms, "first_chunk": t.token2wav_first_chunk_ms}


def reference_inputs(ckpt, args, prompt):
    from pipeline.models.qwen2_5_omni.prompt import DEFAULT_SYSTEM_PROMPT

    tok, s = ckpt.tokenizer, ckpt.special
    if isinstance(prompt, str):
        messages = [{"role": "system", "content": DEFAULT_SYSTEM_PROMPT}, {"role": "user", "content": prompt}]
        ids = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_tensors="pt")
        return (ids if isinstance(ids, torch.Tensor) else ids["input_ids"]), {}
    fe = ckpt.feature_extractor
    feats = fe(prompt, sampling_rate=16000, return_attention_mask=True, padding="max_length", return_tensors="pt")
    n = ckpt.audio_tokens_for_samples(len(prompt))
    enc = lambda t: tok.encode(t, add_special_tokens=False)  # noqa: E731
    ids = torch.tensor([[s.im_start, *enc(f"system\n{DEFAULT_SYSTEM_PROMPT}"), s.im_end, *enc("\n"), s.im_start,
                         *enc("user\n"), s.audio_start, *[s.audio_token] * n, s.audio_end, s.im_end, *enc("\n"),
                         s.im_start, *enc("assistant\n")]])
    return ids, {"input_features": feats["input_features"].to(args.device),
                 "feature_attention_mask": feats["attention_mask"].to(args.device)}


def run_reference(model, ckpt, args, prompt) -> dict:
    """transformers' generate on the same prompt; returns its time (== its time to first audio).
    Codec ids the DiT cannot embed are banned (random talkers emit them; the engine bans them too)."""
    ids, kwargs = reference_inputs(ckpt, args, prompt)
    dit_vocab = ckpt.config.token2wav_config.dit_config.num_embeds
    stops = set(ckpt.special.codec_stop_ids())
    banned = [[i] for i in range(dit_vocab, ckpt.config.talker_config.vocab_size) if i not in stops]
    if banned:
        kwargs["talker_bad_words_ids"] = banned
    ids = ids.to(args.device)
    sync(args.device)
    start = time.perf_counter()
    with torch.inference_mode():
        _, wav = model.generate(
            input_ids=ids, attention_mask=torch.ones_like(ids), speaker="Chelsie",
            thinker_max_new_tokens=args.text_tokens, thinker_min_new_tokens=args.text_tokens,
            talker_max_new_tokens=args.codec_tokens, talker_min_new_tokens=args.codec_tokens,
            talker_eos_token_id=list(ckpt.special.codec_stop_ids()), **kwargs,
        )
    sync(args.device)
    total = time.perf_counter() - start
    audio_s = wav.numel() / 24000
    return {"ttfa": total, "total": total, "audio_s": audio_s, "rtf": total / audio_s if audio_s else float("nan")}


def summarize(rows: list[dict]) -> dict:
    return {k: statistics.median(r[k] for r in rows) for k in rows[0] if all(r[k] is not None for r in rows)}


BREAKDOWN = """
Breakdown of the streaming engine's first audio (median ms from the engine taking the response; engine
milestones, so the client's TTFA above adds the event path):

| input | prefill tail + first token | + talker start (first code) | + thinker/talker steps to the first chunk's codes | + token2wav first chunk | = first chunk out |
|---|---:|---:|---:|---:|---:|"""


def breakdown_row(name: str, r: dict) -> str:
    p, c, k, f = r["prefill"], r["talker_first_code"], r["talker_first_chunk"], r["first_chunk"]
    return f"| {name} | {p:.1f} | {c - p:.1f} | {k - c:.1f} | {f - k:.1f} | {f:.1f} |"


def main(argv=None) -> None:
    args = parse_args(argv)
    cfg = stage_config(args)
    engine, label = build_engine(args, cfg)
    all_prompts = {"text": "Hello! Can you tell me a story?", "audio": load_wav_16k(args.audio_in)}
    prompts = {name: all_prompts[name] for name in args.inputs.split(",")}
    print(f"\nmodel: {label}\ndevice: {args.device}, torch threads: {args.threads}, runs: {args.runs} (median)")
    print(f"reply: {args.text_tokens} text tokens, {args.codec_tokens} codec tokens "
          f"({args.codec_tokens / 50:.1f} s of audio)\n")
    print("| pipeline | input | time to first audio (ms) | total (ms) | audio (s) | RTF |")
    print("|---|---|---:|---:|---:|---:|", flush=True)

    def report(kind: str, name: str, r: dict) -> None:
        print(f"| {kind} | {name} | {r['ttfa'] * 1000:.0f} | {r['total'] * 1000:.0f} | {r['audio_s']:.2f} "
              f"| {r['rtf']:.3f} |", flush=True)

    breakdown = []
    for name, prompt in prompts.items():
        asyncio.run(run_streaming(engine, prompt))  # warm-up
        rows = summarize([asyncio.run(run_streaming(engine, prompt)) for _ in range(args.runs)])
        report("streaming", name, rows)
        breakdown.append(breakdown_row(name, rows))
    engine.close()
    print("\n".join([BREAKDOWN, *breakdown, ""]), flush=True)
    if not args.skip_reference:
        # an engine core in a child process kept its weights there (freed by close): load them here
        ckpt = engine.ckpt if engine.ckpt is not None else checkpoint_loader(args)[0].load(cfg)
        model = reference_model(ckpt)
        for name, prompt in prompts.items():
            run_reference(model, ckpt, args, prompt)  # warm-up
            rows = [run_reference(model, ckpt, args, prompt) for _ in range(args.runs)]
            report("reference generate", name, summarize(rows))


if __name__ == "__main__":
    main()
