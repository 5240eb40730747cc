#!/usr/bin/env bash
# ect bench pull prints its rows (JSON keys checked), and with --threads the
# CPU of each named thread over the pull rounds; bad flags are refused.
. "$(dirname "$0")/lib.sh"
"$ect" bench pull --help | grep -q '^usage: ect bench pull'
expect_exit 2 "unrecognized option '--bogus'" "$ect" bench pull --bogus
expect_exit 2 "unexpected argument 'x'" "$ect" bench pull --threads x
expect_exit 2 '--sizes: each 1 B .. 16 MiB' "$ect" bench pull --sizes 32MiB

timeout 120 "$ect" bench pull --json --ms 5 --transport tcp --sizes 64KiB >"$tmp/rows.json"
timeout 120 "$ect" bench pull --json --threads --ms 5 --transport tcp --sizes 64KiB \
  --inflight-only >"$tmp/thr.json"
python3 - "$tmp/rows.json" "$tmp/thr.json" <<'EOF2'
import json, os, sys
rows = json.load(open(sys.argv[1]))
# 1 item, 32 one after the other, 32 in flight
assert [(r["items"], r["inflight"]) for r in rows] == [(1, 1), (32, 1), (32, 32)], rows
assert all(r["gbps"] > 0 and r["raw_gbps"] > 0 and r["cpu_us_per_item"] > 0 for r in rows), rows
assert rows[2]["raw_batched_gbps"] > 0 and rows[0]["raw_batched_gbps"] is None, rows
assert all("threads" not in r for r in rows), rows  # only with --threads
thr = json.load(open(sys.argv[2]))
assert [(r["items"], r["inflight"]) for r in thr] == [(32, 32)], thr  # --inflight-only
t = thr[0]["threads"]
# over tcp the producer's write lane wrote the pulls, the consumer's target took the bytes
assert t["ect-pull-lane"] > 0 and t["ect-tcp-target"] > 0, t
# shares of one CPU: together at most the CPUs this process may run on (and a little slop)
assert all(v >= 0 for v in t.values()), t
assert sum(t.values()) <= len(os.sched_getaffinity(0)) * 1.1, t
EOF2
timeout 120 "$ect" bench pull --threads --ms 5 --transport tcp --sizes 64KiB --inflight-only \
  >"$tmp/thr.txt"
grep -q '^     threads, share of one CPU over the pull rounds: all [0-9.]*: .*ect-pull-lane' \
  "$tmp/thr.txt" || { cat "$tmp/thr.txt"; echo "no threads line"; exit 1; }
echo "pull_cli: ok"
