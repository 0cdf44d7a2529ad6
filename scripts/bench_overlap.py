"""Do the thinker's and the talker's decode steps overlap on one GPU? (an experiment for issue 7)

    python scripts/bench_overlap.py --random-7b --device cuda --threads 4 --batches 1,16

The engine runs a step's thinker graph and then its talker graph on one stream, so a coupled step costs their sum.
The talker's step is bound by its ~220 small kernels, not by memory bandwidth (BENCHMARKS.md §7.1), so its kernels
might run beside the thinker's bandwidth-bound products at little cost. Per batch size this times, median of
``--steps`` (ms, host wall time around each arrangement with a device synchronisation at its end):

- ``thinker``, ``talker``: one graph replay alone;
- ``sequential``: thinker then talker on one stream (what the engine does);
- ``overlapped``: the talker on a second stream beside the thinker;
- ``overlapped, 2 talker``: two talker steps on the second stream beside one thinker step;
- with ``--priorities MAIN:SIDE,...``: ``overlapped`` again with the thinker and the talker on streams of those CUDA
  priorities (lower is more urgent; the engine's decode stream has -1), e.g. ``-1:-1,-2:-1``: does a talker stream
  below the thinker's let the thinker's products run as if alone?

With ``--kernels`` it also lists the kernels of one talker step and one thinker step at batch 1 (run eagerly under
``torch.profiler``, so only the kernels' own durations mean anything).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))


def median_ms(fn, steps: int) -> float:
    times = []
    for _ in range(steps + 3):
        torch.cuda.synchronize()
        start = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    kept = sorted(times[3:])
    return kept[len(kept) // 2] * 1000


@torch.inference_mode()
def main(argv=None) -> None:
    from bench_common import add_model_args

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_model_args(p)
    p.add_argument("--prompt", type=int, default=300)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--batches", default="1,16")
    p.add_argument("--kernels", action="store_true")
    p.add_argument("--priorities", default="", help="MAIN:SIDE stream priority pairs, comma-separated")
    p.add_argument("--json", default=None, help="also write the results here")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    from pipeline.models.qwen2_5_omni.parts import thinker_text_model
    from pipeline.models.qwen2_5_omni.tiny import RandomModelSpec, build_random_model
    from pipeline.runners.talker import TalkerRunner
    from pipeline.runners.thinker import ThinkerRunner

    batches = [int(b) for b in args.batches.split(",")]
    dev = torch.device(args.device)
    ckpt = build_random_model(RandomModelSpec.qwen2_5_omni_7b(), device=args.device, dtype=torch.bfloat16)
    hidden = thinker_text_model(ckpt.thinker).config.hidden_size
    kw = dict(device=dev, dtype=torch.bfloat16, kv_slots=max(batches), max_len=args.prompt + 8 * args.steps + 64,
              graph_batch_sizes=tuple(batches))
    thinker, talker = ThinkerRunner(ckpt.thinker, **kw), TalkerRunner(ckpt.talker, **kw)
    thinker.batched.capture()
    talker.batched.capture()
    for slot in range(max(batches)):
        thinker.prefill(torch.randn(args.prompt, hidden, device=dev, dtype=torch.bfloat16), slot, 0)
        talker.decoder.prefill(slot, talker.proj(torch.randn(args.prompt, hidden, device=dev, dtype=torch.bfloat16)), 0)
    main_stream, side = torch.cuda.current_stream(), torch.cuda.Stream(dev)
    pairs = [tuple(int(v) for v in pair.split(":")) for pair in args.priorities.split(",") if pair]
    prioritized = {pair: (torch.cuda.Stream(dev, priority=pair[0]), torch.cuda.Stream(dev, priority=pair[1]))
                   for pair in pairs}  # fmt: skip
    results: dict = {"device": torch.cuda.get_device_name(), "prompt": args.prompt, "steps": args.steps, "batches": {},
                     "priority_range": torch.cuda.Stream.priority_range()}  # fmt: skip
    print(f"device: {results['device']}; {args.prompt} positions per row, median of {args.steps}; stream priorities "
          f"(least, greatest): {results['priority_range']}; as created: "
          f"{ {pair: (a.priority, b.priority) for pair, (a, b) in prioritized.items()} }\n")
    columns = ["thinker", "talker", "sequential", "overlapped", "overlapped, 2 talker"]
    columns += [f"overlapped, priorities {a}:{b}" for a, b in pairs]
    print("| batch | " + " | ".join(columns) + " |")
    print("|---:|" + "---:|" * len(columns), flush=True)
    for b in batches:
        slots, pos = list(range(b)), [args.prompt] * b  # the same position every time: the cost, not the contents
        vectors = torch.randn(b, hidden, device=dev, dtype=torch.bfloat16)

        def think():
            return thinker.decode([7] * b, slots, pos).logits

        def talk():
            return talker.decode([3] * b, vectors, slots, pos)[0]

        def sequential():
            think()
            talk()

        def overlapped(talker_steps: int = 1, streams: tuple | None = None):
            first, second = streams if streams is not None else (main_stream, side)
            for stream in {first, second} - {main_stream}:
                stream.wait_stream(main_stream)
            with torch.cuda.stream(first):
                think()
            with torch.cuda.stream(second):
                for _ in range(talker_steps):
                    talk()
            for stream in {first, second} - {main_stream}:
                main_stream.wait_stream(stream)

        row = {"thinker": median_ms(think, args.steps), "talker": median_ms(talk, args.steps),
               "sequential": median_ms(sequential, args.steps), "overlapped": median_ms(overlapped, args.steps),
               "overlapped, 2 talker": median_ms(lambda: overlapped(2), args.steps)}
        for pair, streams in prioritized.items():
            row[f"overlapped, priorities {pair[0]}:{pair[1]}"] = median_ms(lambda s=streams: overlapped(1, s),
                                                                           args.steps)
        results["batches"][b] = row
        print(f"| {b} | " + " | ".join(f"{v:.2f}" for v in row.values()) + " |", flush=True)
    if args.kernels:
        b1 = [0], [args.prompt]
        x_think = torch.randn(1, hidden, device=dev, dtype=torch.bfloat16)
        x_talk = talker.proj(torch.randn(1, hidden, device=dev, dtype=torch.bfloat16))
        slots, positions = (torch.tensor(v, device=dev) for v in b1)
        from profile_token2wav import kernel_table  # the same profiler summary as token2wav's kernels

        steps = {"talker layers, batch 1": lambda: talker.decoder.decode(x_talk, slots, positions, graph_safe=True),
                 "thinker layers, batch 1": lambda: thinker.decoder.decode(x_think, slots, positions, graph_safe=True)}
        results["kernels"] = {label: kernel_table(fn, torch.cuda.synchronize, 14, cuda=True)
                              for label, fn in steps.items()}  # fmt: skip
        for label, table in results["kernels"].items():
            print(f"\n{label}: {table['kernels']} kernels, {table['total_us']:.1f} µs")
            for k in table["top"]:
                print(f"  {k['count']:4d} {k['us']:9.1f} µs  {k['name']}")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
