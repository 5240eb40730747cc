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
"$ect" push --help | grep -q 'mm_hash     = xxh3-'

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
# both sides print the file's XXH3_64bits (seed 0), recomputed here from the spec
head -c 8192 /dev/urandom >"$tmp/item.bin"
start_consumer "$tmp/cons.out" 1 --pool-size 16MiB --count 2
timeout 60 "$ect" push --to "127.0.0.1:$port" --file "$tmp/item.bin" --count 2 --step 1 \
  --control-timeout 5 >"$tmp/prod.out" 2>"$tmp/prod.err"
wait_items "$tmp/cons.out" 2
items "$tmp/cons.out" >"$tmp/cons.items"
python3 - "$tmp/item.bin" "$tmp/prod.out" "$tmp/cons.items" <<'EOF'
import json, sys
M = 2**64 - 1
SECRET = bytes.fromhex(  # XXH3's default secret (kSecret, 192 bytes)
    "b8fe6c3923a44bbe7c01812cf721ad1cded46de9839097db7240a4a4b7b3671f"
    "cb79e64eccc0e578825ad07dccff7221b8084674f743248ee03590e6813a264c"
    "3c2852bb91c300cb88d0658b1b532ea371644897a20df94e3819ef46a9deacd8"
    "a8fa763fe39c343ff9dcbbc7c70b4f1d8a51e04bcdb45931c89f7ec9d9787364"
    "eac5ac8334d3ebc3c581a0fffa1363eb170ddd51b7f0da49d316552629d4689e"
    "2b16be587d47a1fc8ff8b8d17ad031ce45cb3a8f95160428afd7fbcabb4b407e")
def xxh3_long(b):  # XXH3_64bits, seed 0, default secret, len > 240 (the spec's long path)
    P32 = [0x9E3779B1, 0x85EBCA77, 0xC2B2AE3D]
    P64 = [0x9E3779B185EBCA87, 0xC2B2AE3D27D4EB4F, 0x165667B19E3779F9, 0x85EBCA77C2B2AE63, 0x27D4EB2F165667C5]
    r64 = lambda s, j: int.from_bytes(s[j:j + 8], "little")
    acc = [P32[2], P64[0], P64[1], P64[2], P64[3], P32[1], P64[4], P32[0]]
    def stripe(d, j, k):  # accumulate_512: input at d[j:], secret at SECRET[k:]
        for i in range(8):
            v = r64(d, j + 8 * i); x = v ^ r64(SECRET, k + 8 * i)
            acc[i ^ 1] = (acc[i ^ 1] + v) & M
            acc[i] = (acc[i] + (x & 0xFFFFFFFF) * (x >> 32)) & M
    n, per_block = len(b), (len(SECRET) - 64) // 8
    blocks = (n - 1) // (64 * per_block)
    for blk in range(blocks):
        for s in range(per_block):
            stripe(b, blk * 64 * per_block + 64 * s, 8 * s)
        for i in range(8):  # scramble
            a = acc[i]; a ^= a >> 47; a ^= r64(SECRET, len(SECRET) - 64 + 8 * i)
            acc[i] = a * P32[0] & M
    tail = blocks * 64 * per_block
    for s in range((n - 1 - tail) // 64):
        stripe(b, tail + 64 * s, 8 * s)
    stripe(b, n - 64, len(SECRET) - 64 - 7)
    h = n * P64[0] & M
    for i in range(4):  # merge: mul128_fold64 of each pair with the secret at 11
        p = (acc[2 * i] ^ r64(SECRET, 11 + 16 * i)) * (acc[2 * i + 1] ^ r64(SECRET, 19 + 16 * i))
        h = (h + ((p & M) ^ (p >> 64))) & M
    h ^= h >> 37; h = h * 0x165667919E3779F9 & M
    return h ^ (h >> 32)
# a known answer: libxxhash 0.8.1 (the reference implementation) gives this for 0..255 x 4
assert xxh3_long(bytes(range(256)) * 4) == 0xA870F92984398D22
data = open(sys.argv[1], "rb").read()
assert len(data) > 240  # the long path, the one implemented here
h = xxh3_long(data)
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
# a lone step: one ect_put into the spare the shard granted ahead; a step of 4: reserve + complete
assert rows[0]["round_trips_per_step"] == 1 and rows[1]["round_trips_per_step"] == 2, rows
# the latency limit beside one step in flight: a bare control round trip, p50 / (2 rtt + raw p50)
assert all(r["ctl_rtt_ms"] > 0 and r["p50_over_limit"] > 0 for r in rows), rows
# push rounds and raw rounds alternate: at least 3 of each kind per row
assert all(r["rounds"] >= 3 and r["raw_rounds"] >= 3 for r in rows), rows
assert all("threads" not in r for r in rows), rows  # only with --threads
EOF
# --threads: the CPU of each named thread over the push rounds (README "Threads")
timeout 60 "$ect" bench push --json --threads --seconds 0.05 --transport tcp --sizes 64KiB \
  --steps 4 >"$tmp/bench_thr.json"
python3 - "$tmp/bench_thr.json" <<'EOF'
import json, os, sys
rows = json.load(open(sys.argv[1]))
thr = rows[0]["threads"]
# the shard's control server answered the steps, its data-plane target took the bytes
assert thr["ect-ctl-server"] > 0 and thr["ect-tcp-target"] > 0, thr
# shares of one CPU: together at most the CPUs this process may run on (and a little slop)
assert all(v >= 0 for v in thr.values()), thr
assert sum(thr.values()) <= len(os.sched_getaffinity(0)) * 1.1, thr
EOF
timeout 60 "$ect" bench push --threads --seconds 0.05 --transport tcp --sizes 64KiB --steps 4 \
  >"$tmp/bench_thr.txt"
grep -q '^     threads, share of one CPU over the push rounds: all [0-9.]*: .*ect-ctl-server' \
  "$tmp/bench_thr.txt"
echo "push_cli: ok"
