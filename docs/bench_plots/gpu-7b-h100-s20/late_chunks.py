"""The late chunks of engine logs (BENCHMARKS.md §24.1): how many, which chunk of the reply, how many had their codes
late, and for the others the codes' lead, the wait for the worker and the job (median, 10th and 90th percentile).

    python late_chunks.py [abcd]/l-*.log
"""

import re
import statistics
import sys

LATE = re.compile(r"#(\d+) (\d+) ms late \(codes ([-+]\d+) ms from dry, queued (\d+), job (\d+)\)")


def main(paths: list[str]) -> None:
    rows = [tuple(int(x) for x in m.groups()) for path in paths for line in open(path)
            if "of a real-time player" in line for m in LATE.finditer(line)]
    by_index = {k: sum(r[0] == k for r in rows) for k in sorted({r[0] for r in rows})}
    print(len(rows), "late chunks; by chunk index", by_index)
    print("codes after the player ran dry:", sum(r[2] > 0 for r in rows))
    early = [r for r in rows if r[2] <= 0]
    for name, i in (("codes before dry (ms)", 2), ("queued (ms)", 3), ("job (ms)", 4)):
        v = sorted(r[i] for r in early)
        print(f"{name}: median {statistics.median(v)}, p10 {v[len(v) // 10]}, p90 {v[9 * len(v) // 10]}")


if __name__ == "__main__":
    main(sys.argv[1:])
