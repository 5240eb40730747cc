#!/usr/bin/env python3
"""bench-compare.py BEFORE AFTER [ROUNDS]: the same-run ratios of two `ect` binaries.

Runs `ect bench xport --transport tcp,shm` and `ect bench push` (64 KiB, 4.5 MiB and 16 MiB
items, steps of 1, 8 and 32) of each binary alternately, ROUNDS times (default 3), and prints per
row the median of the ratios each run measured against its own limit: a change that moves code
but not work should leave them within the machine's noise (docs/BENCHMARKS.md, issue 12).
"""
import json
import statistics
import subprocess
import sys

BENCHES = {
    "xport": ["bench", "xport", "--transport", "tcp,shm", "--seconds", "0.3", "--json"],
    "push": ["bench", "push", "--seconds", "0.3", "--sizes", "64KiB,4.5MiB,16MiB",
             "--steps", "1,8,32", "--json"],
}


def rows(binary, bench):
    out = subprocess.run([binary] + BENCHES[bench], capture_output=True, text=True, check=True)
    key = ("transport", "size", "step") if bench == "push" else ("transport", "size", "batch")
    return {tuple(r.get(k, 1) for k in key): r["ratio"] for r in json.loads(out.stdout)}


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    bins = {"before": sys.argv[1], "after": sys.argv[2]}
    rounds = int(sys.argv[3]) if len(sys.argv) > 3 else 3
    runs = {(name, bench): [] for name in bins for bench in BENCHES}
    for _ in range(rounds):
        for name, binary in bins.items():
            for bench in BENCHES:
                runs[(name, bench)].append(rows(binary, bench))
    for bench in BENCHES:
        print(f"{bench}: median ratio of {rounds} interleaved runs (before / after)")
        for k in sorted(runs[("before", bench)][0]):
            b = statistics.median(r[k] for r in runs[("before", bench)])
            a = statistics.median(r[k] for r in runs[("after", bench)])
            print("  %-28s %6.2f  %6.2f" % (" ".join(map(str, k)), b, a))


if __name__ == "__main__":
    main()
