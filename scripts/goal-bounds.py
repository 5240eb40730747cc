#!/usr/bin/env python3
"""goal-bounds.py: issue 13's speed goals beside the ceilings this machine and this code set on
them, all measured in one run.

    python3 scripts/goal-bounds.py [--ect build/ect] [--seconds 1] [--pull-ms 400]
        [--cpus N] [--demo-items 10000] [--no-demo] [--json]

Standard library only (any python3). It runs the goals' benches with `--threads` (README
"Threads") and, per goal row, prints the ratio measured against the row's own limit and up to
three ceilings on that ratio, each from figures of the same row:

  round trips  a step at one in flight is serial: its round trips, then its write;
               ceiling = raw p50 / (raw p50 + round trips a step x control rtt)
  cpus         every thread of the process together cannot use more than the machine's CPUs;
               ceiling = (cpus / cpu us an item) / the limit's items a second
  one thread   no thread can use more than one CPU; the busiest thread's cpu an item
               (its share over the row's rounds / items a second) sets
               ceiling = (1 / that) / the limit's items a second

(the limit's items a second: its GB/s over the item's size; pull's batched limit for the pull
row). The lowest ceiling is the binding one; a ceiling the row's own ratio exceeds is printed
in brackets and left out (pull's GB/s is over the median round, its CPU the mean over its
rounds: a row whose rounds vary in CPU can beat its mean). A goal above the binding ceiling
cannot be met on this machine by running the same work faster or better overlapped: the round
trips, the CPU an item or the busiest thread's CPU an item must fall first. Each ceiling is an
estimate from one run: the CPU an item is what the row spent, and a row with the CPUs free might
spend less; read them over several runs (docs/BENCHMARKS.md). `--threads` costs a row some
speed, so ratios here read lower than in a run without it.

The demo's ceiling: `ect demo` is run twice (--demo-items and a tenth of it) and the CPU of all
its processes (RUSAGE_CHILDREN) differenced, which leaves out start-up: cpu an item of the
demo. Against the bench row the demo compares itself to (128 KiB items, steps of 8, four in
flight, tcp), ceiling = (cpus / demo cpu an item) / bench items a second.

Exit status: 0 when every bench ran, 1 when one failed, 2 for bad arguments.
"""
import argparse
import json
import os
import re
import resource
import subprocess
import sys

# issue 13's goals, ratio against the row's limit: push by (transport, size, step, inflight),
# pull (32 items, all in flight) by (transport, size)
PUSH_GOALS = {
    ("tcp", 65536, 32, 1): 0.8, ("shm", 65536, 32, 1): 0.5,
    ("tcp", 65536, 32, 4): 0.8, ("shm", 65536, 32, 4): 0.5,
    ("tcp", 4718592, 1, 1): 0.9, ("shm", 4718592, 1, 1): 0.9,
    ("tcp", 4718592, 32, 1): 0.9, ("shm", 4718592, 32, 1): 0.9,
}
PULL_GOALS = {("tcp", 65536): 0.8, ("shm", 65536): 0.8}
DEMO_GOAL = 0.8


def items_a_second(gbps, size):
    """A rate in GB/s (10^9 B/s) as items of size bytes a second."""
    return gbps * 1e9 / size


def busiest(threads, items_per_s):
    """(name, cpu us an item) of the thread with the most CPU, or (None, None)."""
    if not threads or not items_per_s:
        return None, None
    name = max(threads, key=threads.get)
    return name, threads[name] / items_per_s * 1e6


def ceilings(limit_items_per_s, cpus, cpu_us_item, threads, items_per_s, serial=None):
    """The row's ceilings on its ratio (dict name -> value, None where not measured) and the
    busiest thread's name. serial: (raw p50 ms, round trips a step, rtt ms) for a step at one in
    flight, else None."""
    out = {"round_trips": None, "cpus": None, "one_thread": None}
    if serial and all(v is not None for v in serial):
        raw_p50, rt, rtt = serial
        out["round_trips"] = raw_p50 / (raw_p50 + rt * rtt)
    if limit_items_per_s and cpu_us_item:
        out["cpus"] = cpus * 1e6 / cpu_us_item / limit_items_per_s
    name, us = busiest(threads, items_per_s)
    if limit_items_per_s and us:
        out["one_thread"] = 1e6 / us / limit_items_per_s
    return out, name


def binding(ceil, ratio):
    """(name, value) of the lowest ceiling measured that the row's own ratio does not exceed,
    or (None, None). A ceiling below the measured ratio is no ceiling: the row's CPU varied
    from round to round (a mean against a median), and it is left out."""
    got = {k: v for k, v in ceil.items() if v is not None and v >= ratio}
    if not got:
        return None, None
    k = min(got, key=got.get)
    return k, got[k]


def run_json(cmd):
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError("%s failed (exit %d): %s" % (" ".join(cmd), r.returncode,
                                                        r.stderr.strip()[-400:]))
    return json.loads(r.stdout)


def push_rows(ect, seconds, cpus):
    rows = []
    for extra in (["--sizes", "64KiB,4.5MiB", "--steps", "1,32"],
                  ["--sizes", "64KiB", "--steps", "32", "--inflight", "4"]):
        rows += run_json([ect, "bench", "push", "--json", "--threads", "--transport", "tcp,shm",
                          "--seconds", str(seconds)] + extra)
    out = []
    for r in rows:
        key = (r["transport"], r["size"], r["step"], r["inflight"])
        if key not in PUSH_GOALS:
            continue
        lim = items_a_second(r["raw_gbps"], r["size"])
        serial = (r["raw_p50_ms"], r["round_trips_per_step"], r.get("ctl_rtt_ms")) \
            if r["inflight"] == 1 else None
        ceil, name = ceilings(lim, cpus, r["cpu_us_per_item"], r.get("threads"),
                              r["items_per_s"], serial)
        out.append({"bench": "push", "transport": r["transport"], "size": r["size"],
                    "step": r["step"], "inflight": r["inflight"], "goal": PUSH_GOALS[key],
                    "ratio": r["ratio"], "ceilings": ceil, "busiest": name})
    return out


def pull_rows(ect, ms, cpus):
    out = []
    for r in run_json([ect, "bench", "pull", "--json", "--threads", "--inflight-only",
                       "--sizes", "64KiB", "--ms", str(ms)]):
        key = (r["transport"], r["size"])
        if key not in PULL_GOALS or r["items"] != 32 or not r.get("raw_batched_gbps"):
            continue
        lim = items_a_second(r["raw_batched_gbps"], r["size"])
        items_per_s = items_a_second(r["gbps"], r["size"])
        ceil, name = ceilings(lim, cpus, r["cpu_us_per_item"], r.get("threads"), items_per_s)
        out.append({"bench": "pull", "transport": r["transport"], "size": r["size"],
                    "step": r["items"], "inflight": r["inflight"], "goal": PULL_GOALS[key],
                    "ratio": r["ratio_batched"], "ceilings": ceil, "busiest": name})
    return out


def demo_cpu(ect, items):
    """CPU seconds of `ect demo --items N` and all its processes."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    r = subprocess.run([ect, "demo", "--items", str(items), "--shape", "16x4096"],
                       capture_output=True, text=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if r.returncode != 0:
        raise RuntimeError("ect demo --items %d failed (exit %d): %s" %
                           (items, r.returncode, r.stderr.strip()[-400:]))
    m = re.search(r"\(([\d.]+) items/s\) over the transfer", r.stdout)
    if not m:
        raise RuntimeError("ect demo printed no throughput line")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return cpu, float(m.group(1))


def demo_row(ect, items, seconds, cpus):
    small = max(items // 10, 100)
    c_small, _ = demo_cpu(ect, small)
    c_big, demo_ips = demo_cpu(ect, items)
    per_item = (c_big - c_small) / (items - small) * 1e6
    if per_item <= 0:  # start-up's CPU varied more than the extra items cost: no figure
        per_item = None
    b = run_json([ect, "bench", "push", "--json", "--threads", "--sizes", "128KiB", "--steps",
                  "8", "--inflight", "4", "--transport", "tcp", "--seconds", str(seconds)])[0]
    ceil, _ = ceilings(b["items_per_s"], cpus, per_item, None, None)  # the cpus ceiling alone
    return {"bench": "demo", "transport": "tcp", "size": 131072, "step": 8, "inflight": 4,
            "goal": DEMO_GOAL, "ratio": demo_ips / b["items_per_s"], "ceilings": ceil,
            "busiest": None, "demo_cpu_us_per_item": per_item,
            "bench_cpu_us_per_item": b["cpu_us_per_item"]}


def size_txt(n):
    return "%g MiB" % (n / 1048576.0) if n >= 1048576 else "%d KiB" % (n // 1024)


def fmt(v, ratio):
    """A ceiling; in brackets one the measured ratio exceeds (left out, see binding)."""
    if v is None:
        return "     -"
    return " %5.2f" % v if v >= ratio else "(%4.2f)" % v


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ect", default=os.path.join("build", "ect"), help="the ect binary")
    ap.add_argument("--seconds", type=float, default=1.0, help="bench push rows' seconds")
    ap.add_argument("--pull-ms", type=int, default=400, help="bench pull rows' milliseconds")
    ap.add_argument("--cpus", type=int, default=os.cpu_count(),
                    help="CPUs the cpus ceiling counts (default: this machine's)")
    ap.add_argument("--demo-items", type=int, default=10000, help="items of the larger demo")
    ap.add_argument("--no-demo", action="store_true", help="leave the demo out")
    ap.add_argument("--json", action="store_true", help="one JSON list of rows")
    a = ap.parse_args()
    if a.seconds <= 0 or a.pull_ms <= 0 or a.cpus < 1 or a.demo_items < 200:
        ap.error("--seconds and --pull-ms must be positive, --cpus at least 1, "
                 "--demo-items at least 200")
    if not os.access(a.ect, os.X_OK):
        ap.error("no ect binary at %s (build first, or --ect PATH)" % a.ect)
    try:
        rows = push_rows(a.ect, a.seconds, a.cpus) + pull_rows(a.ect, a.pull_ms, a.cpus)
        if not a.no_demo:
            rows.append(demo_row(a.ect, a.demo_items, a.seconds, a.cpus))
    except (RuntimeError, ValueError, KeyError) as e:
        print("goal-bounds.py: %s" % e, file=sys.stderr)
        return 1
    for r in rows:
        r["binding"], r["ceiling"] = binding(r["ceilings"], r["ratio"])
        r["goal_above_ceiling"] = r["ceiling"] is not None and r["goal"] > r["ceiling"]
    if a.json:
        print(json.dumps(rows, indent=1))
        return 0
    print("issue 13's goals against this run's ceilings (%d CPUs; ratios of --threads rows)" %
          a.cpus)
    print("%-5s %-4s %8s %3s %3s  %5s %5s  %6s %6s %6s  %-11s %s" %
          ("bench", "xprt", "size", "k", "fl", "goal", "ratio", "rt", "cpus", "1thr",
           "binding", "busiest thread"))
    for r in rows:
        c = r["ceilings"]
        print("%-5s %-4s %8s %3d %3d  %5.2f %5.2f  %s %s %s  %-11s %s%s" %
              (r["bench"], r["transport"], size_txt(r["size"]), r["step"], r["inflight"],
               r["goal"], r["ratio"], fmt(c["round_trips"], r["ratio"]),
               fmt(c["cpus"], r["ratio"]), fmt(c["one_thread"], r["ratio"]),
               r["binding"] or "-", r["busiest"] or "-",
               "  GOAL ABOVE CEILING" if r["goal_above_ceiling"] else ""))
        if r["bench"] == "demo":
            d = r["demo_cpu_us_per_item"]
            print("      the demo's processes: %s cpu us an item; the bench row's: %.1f" %
                  ("%.1f" % d if d else "no figure (start-up varied more)",
                   r["bench_cpu_us_per_item"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
