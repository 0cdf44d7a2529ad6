"""CPU cost of one batched silero VAD call (realtime/vad_batch.py) by batch size: ms per call and per frame,
median of ``--calls`` calls after a warm-up, one torch thread (as the server runs it).

    python scripts/bench_vad.py --batches 1,8,64
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import numpy as np

from realtime.vad_batch import SileroBatchModel


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batches", default="1,8,64", help="comma-separated batch sizes (frames per call)")
    p.add_argument("--calls", type=int, default=200)
    args = p.parse_args(argv)
    model = SileroBatchModel()  # sets torch to one thread
    rng = np.random.default_rng(0)
    print("| frames per call | ms per call | ms per frame |\n|---:|---:|---:|")
    for batch in (int(b) for b in args.batches.split(",")):
        states = [model.new_state() for _ in range(batch)]
        frames = (0.1 * rng.standard_normal((batch, model.frame_samples))).astype(np.float32)
        times = []
        for _ in range(args.calls + 5):
            start = time.perf_counter()
            model.run(states, frames)
            times.append(1000 * (time.perf_counter() - start))
        ms = statistics.median(times[5:])
        print(f"| {batch} | {ms:.2f} | {ms / batch:.3f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
