#!/usr/bin/env bash
# `ect push`: --help, bad flags (exit 2 naming the flag), a run with nothing
# listening (exit 1, the address in the error), and end to end against
# `ect push-consumer` with TP 1 (tcp), 2 (shm), 4 (tcp) and 2 (ucx, when it works
# here): every item the producer reports done arrives on the consumer with the
# same checksum, and a re-run with the same seed prints the same checksums
# (deterministic content); then --file, --transport / --tp mismatches and a
# short `ect bench push`.
. "$(dirname "$0")/lib.sh"

"$ect" push --help | grep -q '^usage: ect push --to HOST:PORT'
"$ect" push --help | grep -q 'mm_hash     = xxh64-'

expect_usage() { expect_exit 2 "$1" "$ect" push "${@:2}"; } # expect_usage TEXT ARGS...
expect_usage '--to HOST:PORT is required'
expect_usage 'try' --to 127.0.0.1:1 --bogus
expect_usage '--shape' --to 127.0.0.1:1 --shape 576xx4096
expect_usage '--count' --to 127.0.0.1:1 --count 0
expect_usage 'dtype' --to 127.0.0.1:1 --dtype complex1024
expect_usage 'not both' --to 127.0.0.1:1 --size 64KiB --shape 8x8
expect_usage 'multiple' --to 127.0.0.1:1 --size 3 --dtype bfloat16
expect_usage '--to' --to nohostport
expect_usage '--transport must be tcp, shm or ucx' --to 127.0.0.1:1 --transport rdma
expect_usage '--tp' --to 127.0.0.1:1 --tp 0

# Nothing listening: the refused connect fails at once, naming the address.
set +e
out=$(timeout 30 "$ect" push --to 127.0.0.1:1 --count 3 --size 4KiB --control-timeout 1 2>"$tmp/err")
rc=$?
set -e
[ $rc -eq 1 ] || { echo "unreachable consumer: exit $rc, want 1"; cat "$tmp/err"; exit 1; }
[ "$(grep -c '"state":"failed"' <<<"$out")" -eq 3 ]
grep -q 'consumer 127.0.0.1:1 unreachable: control 127.0.0.1:1: connection refused' <<<"$out"
grep -q '0 moved, 0 retried, 3 failed of 3 items' "$tmp/err"
# status is the error text (as in ect pull), state how the item ended
/usr/bin/python3 -c '
import json, sys
for r in map(json.loads, sys.stdin):
    assert r["state"] == "failed" and r["status"] == r["error"] and "unreachable" in r["status"], r
' <<<"$out"

run_e2e() { # run_e2e TP TRANSPORT COUNT SIZE
  local tp=$1 xp=$2 count=$3 size=$4
  rm -f "$tmp/prod.out" "$tmp/prod.err"
  start_consumer "$tmp/cons.out" "$tp" --transport "$xp" --pool-size 64MiB --count "$count"
  timeout 60 "$ect" push --to "127.0.0.1:$port" --count "$count" --size "$size" --step 4 \
    --seed 7 --control-timeout 5 --tp "$tp" --transport "$xp" >"$tmp/prod.out" 2>"$tmp/prod.err" \
    || { echo "ect push failed (tp $tp $xp)"; cat "$tmp/prod.out" "$tmp/prod.err"; exit 1; }
  wait_exit "$cpid" 60 # --count: it ends by itself once every item arrived
  wait "$cpid" || { cat "$tmp/cons.out.err"; echo "push-consumer failed"; exit 1; }
  [ "$(grep -c '"status":"ok","state":"done"' "$tmp/prod.out")" -eq "$count" ]
  [ "$(grep -c "\"shards\":$tp,\"transport\":\"$xp\"" "$tmp/prod.out")" -eq "$count" ]
  # the same (transfer_id, checksum) pairs on both sides
  python3 - "$tmp/prod.out" "$tmp/cons.out" <<'EOF'
import json, sys
prod = {d["transfer_id"]: d["checksum"] for d in map(json.loads, open(sys.argv[1]))}
cons = {d["transfer_id"]: d["checksum"] for d in map(json.loads, open(sys.argv[2])) if "event" not in d}
assert prod == cons, (prod, cons)
EOF
  grep -o '"checksum":"[0-9a-f]*"' "$tmp/prod.out" >"$tmp/sums.$tp.$xp"
}

run_e2e 1 tcp 6 64KiB
run_e2e 2 shm 6 64KiB
run_e2e 4 tcp 5 64KiB
if "$ect" info | grep -q '^  ucx  works'; then run_e2e 2 ucx 3 64KiB; fi
# deterministic content: the same seed gives the same checksums whatever the TP
cmp "$tmp/sums.1.tcp" "$tmp/sums.2.shm"
# --inflight: up to 4 steps of 4 move at once; every item is reported once, done, with
# the checksum the consumer computed, and (room enough: no retry round) the consumer
# receives them in push order. Then a pool of 8 items under 16 in flight: back-pressure
# makes items wait, none is lost, the run still exits 0.
run_inflight() { # run_inflight POOL COUNT ORDERED
  start_consumer "$tmp/cons.fl" 1 --pool-size "$1" --count "$2"
  timeout 120 "$ect" push --to "127.0.0.1:$port" --count "$2" --size 64KiB --step 4 --inflight 4 \
    --id-prefix fl --control-timeout 5 >"$tmp/prod.fl" 2>"$tmp/prod.fl.err" \
    || { echo "ect push --inflight failed"; cat "$tmp/prod.fl" "$tmp/prod.fl.err"; exit 1; }
  wait_exit "$cpid" 60
  wait "$cpid" || { cat "$tmp/cons.fl.err"; echo "push-consumer failed"; exit 1; }
  grep -q "^ect push: $2 moved, [0-9]* retried, 0 failed of $2 items$" "$tmp/prod.fl.err" \
    || { cat "$tmp/prod.fl.err"; exit 1; }
  python3 - "$tmp/prod.fl" "$tmp/cons.fl" "$2" "$3" <<'EOF2'
import json, sys
n, ordered = int(sys.argv[3]), sys.argv[4] == "1"
prod = [json.loads(l) for l in open(sys.argv[1])]
cons = [d for d in map(json.loads, open(sys.argv[2])) if "event" not in d]
want = ["fl-%d" % i for i in range(n)]
assert sorted(r["transfer_id"] for r in prod) == sorted(want), prod
assert all(r["state"] == "done" and r["status"] == "ok" for r in prod), prod
assert {r["transfer_id"]: r["checksum"] for r in prod} == {d["transfer_id"]: d["checksum"] for d in cons}
if ordered:
    assert [d["transfer_id"] for d in cons] == want, [d["transfer_id"] for d in cons]
EOF2
}
run_inflight 64MiB 40 1
run_inflight 512KiB 40 0
expect_usage '--inflight' --to 127.0.0.1:1 --inflight 0
# --file: the file's bytes, twice (the second is answered `cached` by the consumer);
# both sides print the file's XXH64 (seed 0), recomputed here from the spec
head -c 8192 /dev/urandom >"$tmp/item.bin"
start_consumer "$tmp/cons.out" 1 --pool-size 16MiB --count 2
timeout 60 "$ect" push --to "127.0.0.1:$port" --file "$tmp/item.bin" --count 2 --step 1 \
  --control-timeout 5 >"$tmp/prod.out" 2>"$tmp/prod.err"
wait_items "$tmp/cons.out" 2
items "$tmp/cons.out" >"$tmp/cons.items"
python3 - "$tmp/item.bin" "$tmp/prod.out" "$tmp/cons.items" <<'EOF'
import json, sys
M = 2**64 - 1
P1, P2, P3, P4, P5 = 0x9E3779B185EBCA87, 0xC2B2AE3D27D4EB4F, 0x165667B19E3779F9, 0x85EBCA77C2B2AE63, 0x27D4EB2F165667C5
rotl = lambda x, r: ((x << r) | (x >> (64 - r))) & M
rnd = lambda acc, lane: (rotl((acc + lane * P2) & M, 31) * P1) & M
def xxh64(b):  # seed 0, as the XXH64 spec says
    le = lambda j, k: int.from_bytes(b[j:j + k], "little")
    n, i = len(b), 0
    if n >= 32:
        v = [(P1 + P2) & M, P2, 0, (-P1) & M]
        while i + 32 <= n:
            v = [rnd(v[j], le(i + 8 * j, 8)) for j in range(4)]
            i += 32
        h = (rotl(v[0], 1) + rotl(v[1], 7) + rotl(v[2], 12) + rotl(v[3], 18)) & M
        for x in v:
            h = ((h ^ rnd(0, x)) * P1 + P4) & M
    else:
        h = P5
    h = (h + n) & M
    while i + 8 <= n:
        h = (rotl(h ^ rnd(0, le(i, 8)), 27) * P1 + P4) & M
        i += 8
    if i + 4 <= n:
        h = (rotl(h ^ (le(i, 4) * P1 & M), 23) * P2 + P3) & M
        i += 4
    while i < n:
        h = (rotl(h ^ (b[i] * P5 & M), 11) * P1) & M
        i += 1
    h ^= h >> 33; h = h * P2 & M; h ^= h >> 29; h = h * P3 & M; h ^= h >> 32
    return h
# the spec's known answers
assert xxh64(b"") == 0xEF46DB3751D8E999 and xxh64(b"abc") == 0x44BC2CF5AD770999
h = xxh64(open(sys.argv[1], "rb").read())
for f in sys.argv[2:]:
    rows = [json.loads(l) for l in open(f)]
    assert len(rows) == 2 and all(r["checksum"] == "%016x" % h for r in rows), (f, rows)
    assert rows[0]["mm_hash"] == rows[1]["mm_hash"], rows
EOF

# a consumer offering tcp to a producer that requires shm, and a wrong --tp:
# every item fails with the cause, exit 1
start_consumer "$tmp/cons.any" 1 --pool-size 16MiB
set +e
out=$(timeout 60 "$ect" push --to "127.0.0.1:$port" --count 2 --size 4KiB --transport shm \
  --control-timeout 5 2>/dev/null); rc=$?
set -e
[ $rc -eq 1 ] && [ "$(grep -c "offers transport 'tcp', this producer requires 'shm'; nothing was reserved" <<<"$out")" -eq 2 ]
set +e
out=$(timeout 60 "$ect" push --to "127.0.0.1:$port" --count 1 --size 4KiB --tp 2 \
  --control-timeout 5 2>/dev/null); rc=$?
set -e
[ $rc -eq 1 ] && grep -q 'has 1 shard(s) (TP ranks), this producer expects 2; nothing was reserved' <<<"$out"

# bench: a short run; a 4-item step costs the same round trips as a 1-item step
"$ect" bench push --help | grep -q '^usage: ect bench push'
timeout 60 "$ect" bench push --json --seconds 0.05 --transport tcp --sizes 64KiB --steps 1,4 \
  >"$tmp/bench.json"
python3 - "$tmp/bench.json" <<'EOF'
import json, sys
rows = json.load(open(sys.argv[1]))
assert [r["step"] for r in rows] == [1, 4], rows
assert all(r["gbps"] > 0 and r["raw_gbps"] > 0 for r in rows), rows
assert rows[0]["round_trips_per_step"] == rows[1]["round_trips_per_step"] == 2, rows
# the latency limit beside one step in flight: a bare control round trip, p50 / (2 rtt + raw p50)
assert all(r["ctl_rtt_ms"] > 0 and r["p50_over_limit"] > 0 for r in rows), rows
EOF
echo "push_cli: ok"
