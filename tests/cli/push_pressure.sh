#!/usr/bin/env bash
# Under pressure nothing fails, and what does fail says why:
#  - a consumer pool of 64 MiB and 20 items of 4.5 MiB pushed in one step:
#    the pool is refused full on the way, yet all 20 are moved (some retried)
#    and the checksums the consumer prints equal the producer's;
#  - `ect push --tp 3` to a 2-shard consumer, and a required transport the
#    consumer does not offer: every item fails before anything is reserved
#    (the consumer's totals show no reservation and no refusal), naming why;
#  - a transfer_id used again within the TTL is refused on both sides with the
#    reason (already delivered);
#  - a transfer the producer abandons is reported on the consumer's stderr;
#  - dtype: reserved as torch.float32, reported as float32.
# Every background process is killed on exit; waits are bounded and generous (lib.sh).
. "$(dirname "$0")/lib.sh"
py=/usr/bin/python3 # Debian's, with python3-zmq (scripts/install-deps.sh)

sent() { sed -n 's/^{"transfer_id":"\([^"]*\)","mm_hash":"[^"]*","nbytes":[0-9]*,"checksum":"\([0-9a-f]*\)","status":"ok","state":"done".*/\1 \2/p' "$1" | sort; }
received() { sed -n 's/^{"transfer_id":"\([^"]*\)",.*"checksum":"\([0-9a-f]*\)","status":"ok"}$/\1 \2/p' "$1" | sort; }

# 1. a full pool: items wait and retry, none fails
start_consumer "$tmp/c1" 1 --pool-size 64MiB
"$ect" push --to "127.0.0.1:$port" --count 20 --size 4.5MiB --id-prefix full >"$tmp/p1" \
  2>"$tmp/p1.err" || { cat "$tmp/p1" "$tmp/p1.err"; echo "a full pool failed items"; exit 1; }
grep -Eq '^ect push: 20 moved, [1-9][0-9]* retried, 0 failed of 20 items$' "$tmp/p1.err" ||
  { cat "$tmp/p1.err"; echo "want 20 moved, some retried (the pool holds 14), 0 failed"; exit 1; }
grep -q '"retries":[1-9]' "$tmp/p1" || { cat "$tmp/p1"; echo "no item says it retried"; exit 1; }
wait_items "$tmp/c1" 20
[ "$(sent "$tmp/p1")" = "$(received "$tmp/c1")" ] ||
  { diff <(sent "$tmp/p1") <(received "$tmp/c1"); echo "checksums differ"; exit 1; }
# the consumer said what it refused (once a second at most, with a count)
grep -q 'refused [0-9]* reserve(s) in the last .* EC consumer buffer pool is full' "$tmp/c1.err" ||
  { cat "$tmp/c1.err"; echo "refusals not logged"; exit 1; }

# 2. the same ids again: refused on both sides, saying why
set +e
"$ect" push --to "127.0.0.1:$port" --count 1 --size 4KiB --id-prefix full >"$tmp/p2" 2>"$tmp/p2.err"
rc=$?
set -e
[ $rc -eq 1 ] || { cat "$tmp/p2"; echo "a reused transfer_id was accepted"; exit 1; }
grep -q "\"state\":\"cancelled\",\"error\":\"refused by shard 0: transfer_id 'full-0' was already delivered" "$tmp/p2" ||
  { cat "$tmp/p2"; echo "the producer does not say why"; exit 1; }
wait_grep "answered \`cancelled\`; latest: transfer_id 'full-0' was already delivered" "$tmp/c1.err"

# 3. dtype: reserved as torch.float32, reported as float32
"$ect" push --to "127.0.0.1:$port" --count 1 --size 64KiB --dtype torch.float32 >"$tmp/p3" 2>&1
wait_grep '"dtype":"float32"' "$tmp/c1"
stop_consumer "$tmp/c1"
grep -q 'totals 21 delivered' "$tmp/c1.err" || { cat "$tmp/c1.err"; exit 1; }
echo "full pool: 20 moved, $(sed -n 's/.* \([0-9]*\) retried.*/\1/p' "$tmp/p1.err") retried, 0 failed; reuse and dtype said"

# 4. wrong shard count, wrong transport: fail before anything is reserved
start_consumer "$tmp/c4" 2 --pool-size 16MiB
check_mismatch() { # WANT ARGS...: every item fails naming WANT, nothing reserved
  local want=$1 rc=0; shift
  "$ect" push --to "127.0.0.1:$port" --count 2 --size 4KiB "$@" >"$tmp/p4" 2>"$tmp/p4.err" || rc=$?
  [ $rc -eq 1 ] && [ "$(grep -c "\"state\":\"failed\".*$want.*nothing was reserved" "$tmp/p4")" -eq 2 ] ||
    { cat "$tmp/p4"; echo "$*: items not failed before reserving"; exit 1; }
}
check_mismatch 'has 2 shard(s) (TP ranks), this producer expects 3' --tp 3
check_mismatch "offers transport 'tcp', this producer requires 'shm'" --transport shm
# 5. an abandoned transfer is reported on the consumer's stderr
"$py" - "$port" <<'EOF'
import json, sys, zmq
port = int(sys.argv[1])
s = zmq.Context.instance().socket(zmq.REQ)
s.setsockopt(zmq.RCVTIMEO, 60000)
s.setsockopt(zmq.LINGER, 0)
s.connect("tcp://127.0.0.1:%d" % port)
def call(req):
    s.send_json(req)
    rep = s.recv_json()
    assert rep["ok"], rep
    return rep["result"]
r = call({"op": "reserve", "transfer_id": "gone", "mm_hash": "hg", "nbytes": 8,
          "shape": [4], "dtype": "bfloat16"})
assert r["write"], r
assert call({"op": "cancel", "transfer_id": "gone", "reservation_id": r["reservation_id"],
             "abandon": True})["cancelled"]
EOF
wait_grep 'ect push-consumer: rank 0: 1 transfer(s) abandoned by the producer' "$tmp/c4.err"
stop_consumer "$tmp/c4"
# nothing of the mismatched pushes reached a shard: one reservation (the abandoned one)
grep -q 'rank 0: peaks 1 reservations, .* 0 refused as full, 0 refused otherwise, 0 expired, 1 abandoned' "$tmp/c4.err" &&
  grep -q 'rank 1: peaks 0 reservations, 0 bytes held; totals 0 delivered, 0 refused as full, 0 refused otherwise' "$tmp/c4.err" ||
  { cat "$tmp/c4.err"; echo "a mismatched push cost the consumer something"; exit 1; }
echo "mismatches cost the consumer nothing; an abandoned transfer is reported"
echo "push_pressure: ok"
