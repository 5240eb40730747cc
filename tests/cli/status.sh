#!/usr/bin/env bash
# `ect status HOST:PORT [--json]` against a live push consumer (tp 2: the
# table and the JSON name the pool, the reservations by state, both shards'
# ports; the counts move after a push), against a stopped one (exit 1, a
# clear error), and against an upstream-style consumer that does not know the
# op (a Python REP socket answering like vLLM's: exit 1, says so). Bad usage
# exits 2.
. "$(dirname "$0")/lib.sh"
py=/usr/bin/python3

"$ect" status --help | grep -q '^usage: ect status HOST:PORT'
expect_exit 2 "HOST:PORT is required" "$ect" status
expect_exit 2 "HOST:PORT" "$ect" status not-an-address

start_consumer "$tmp/cons" 2 --pool-size 8MiB
"$ect" status "127.0.0.1:$port" >"$tmp/table" 2>"$tmp/table.err" || { cat "$tmp/table.err"; exit 1; }
cat "$tmp/table"
grep -q "^shard        0 of 2 at 127.0.0.1:$port (tcp)" "$tmp/table"
grep -q "^pool         8 MiB capacity, 0 B used, 0 B resident" "$tmp/table"
grep -q "^reservations WRITING 0 READY 0 " "$tmp/table"
grep -q "^peers        $port $((port + 1))\$" "$tmp/table"
grep -q "^last errors  (none)" "$tmp/table"

timeout 60 "$ect" push --to "127.0.0.1:$port" --count 3 --size 64KiB >"$tmp/push.out" 2>"$tmp/push.err" ||
  { cat "$tmp/push.err"; echo "push failed"; exit 1; }
wait_items "$tmp/cons" 3
# the second shard, as JSON: every item went to every rank and was finished
# (a tombstone each, its bytes kept resident)
"$ect" status "127.0.0.1:$((port + 1))" --json >"$tmp/json"
"$py" - "$tmp/json" "$port" <<'EOF'
import json, sys
lines = open(sys.argv[1]).read().splitlines()
assert len(lines) == 1, lines
o = json.loads(lines[0])
port = int(sys.argv[2])
assert o["status"] == "ok", o
assert o["shard"] == 1 and o["tp_size"] == 2 and o["port"] == port + 1, o
assert o["peers"] == [port, port + 1], o
assert o["transport"] == "tcp", o
assert o["pool"]["capacity"] == 8 << 20, o
assert o["pool"]["used"] == o["pool"]["resident"] > 0, o
r = o["reservations"]
assert set(r) == {"WRITING", "READY", "CANCEL_PENDING", "EXPIRE_PENDING", "CANCELLED", "EXPIRED"}, r
assert r["WRITING"] == 0 and r["READY"] == 0, r
assert r["CANCELLED"] == 3, r
assert o["events"]["sent"] >= 3 and o["events"]["dropped"] == 0, o
assert o["refused"]["full"] == 0 and o["errors"] == [], o
EOF

# a stopped consumer: exit 1, a clear error (and the JSON says it too)
stop_consumer "$tmp/cons"
expect_exit 1 "no consumer answers at 127.0.0.1:$port" "$ect" status "127.0.0.1:$port"
rc=0
"$ect" status "127.0.0.1:$port" --json >"$tmp/json.down" 2>/dev/null || rc=$?
[ "$rc" -eq 1 ]
grep -q '^{"status":"no consumer answers at' "$tmp/json.down"

# an upstream consumer answers unknown ops with its usual error
fport=$(free_port 1)
"$py" - "$fport" >"$tmp/fake.out" 2>&1 <<'EOF' &
import json, sys, zmq
s = zmq.Context().socket(zmq.REP)
s.bind(f"tcp://127.0.0.1:{sys.argv[1]}")
print("listening", flush=True)
req = json.loads(s.recv())
s.send(json.dumps({"ok": False, "error": f"unknown control op: {req['op']!r}"}).encode())
EOF
fpid=$!
pids+=("$fpid")
wait_grep listening "$tmp/fake.out"
expect_exit 1 "does not know the ect_status op (an upstream consumer?)" "$ect" status "127.0.0.1:$fport"
grep -q "unknown control op: 'ect_status'" "$tmp/expect.err"
wait "$fpid"
echo "status: ok"
