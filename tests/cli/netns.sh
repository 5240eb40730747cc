#!/usr/bin/env bash
# Two hosts on one machine: two network namespaces joined by a veth pair,
# 192.0.2.1/24 (and 2001:db8::1/64) in one, 192.0.2.2/24 (2001:db8::2/64) in
# the other. `ect push-consumer` binds the wildcard (0.0.0.0, then ::) in the
# first; `ect push` runs in the second and reaches it only through the veth.
# The producer can write the items only if the consumer told it a routable
# data-plane address (the veth's, never 0.0.0.0), so items arriving
# checksum-equal is the check. With --data-port the data plane listens on the
# port given (the ready line says so, and the socket is there). SIGTERM stops
# the consumer with status 0 and its report.
# Needs root and `ip netns`: exits 77 (skipped) with a message where they are
# unavailable. The namespaces are named per run and always removed (trap).
. "$(dirname "$0")/lib.sh"

if ! command -v ip >/dev/null 2>&1; then
  echo "SKIP: the ip command (iproute2) is not installed"
  exit 77
fi
netns_pair a b v6

sent() { sed -n 's/^{"transfer_id":"\([^"]*\)","mm_hash":"[^"]*","nbytes":[0-9]*,"checksum":"\([0-9a-f]*\)","status":"ok","state":"done".*/\1 \2/p' "$1" | sort; }
received() { sed -n 's/^{"transfer_id":"\([^"]*\)","mm_hash":"[^"]*","nbytes":[0-9]*,"shape":\[[0-9,]*\],"dtype":"[a-z0-9_.]*","checksum":"\([0-9a-f]*\)","status":"ok"}$/\1 \2/p' "$1" | sort; }

# run TAG BIND TO [CONSUMER ARGS...]: a consumer in ns1 bound to BIND, a
# producer in ns2 pushing to TO; 4 items must arrive checksum-equal.
run() {
  local tag=$1 bind=$2 to=$3 n=4
  shift 3
  local out=$tmp/cons.$tag
  ip netns exec "$ns1" "$ect" push-consumer --host "$bind" --port 14579 --pool-size 32MiB "$@" \
    >"$out" 2>"$out.err" &
  cpid=$!
  pids+=("$cpid")
  wait_event "$out" ready "$cpid" || { cat "$out.err"; echo "$tag: consumer not ready"; exit 1; }
  in2 timeout 60 "$ect" push --to "$to" --count "$n" --shape 64x1024 --seed 7 \
    >"$tmp/push.$tag" 2>"$tmp/push.$tag.err" ||
    { cat "$tmp/push.$tag.err" "$out.err"; echo "$tag: push failed"; exit 1; }
  wait_items "$out" "$n"
  sent "$tmp/push.$tag" >"$tmp/want.$tag"
  received "$out" >"$tmp/got.$tag"
  [ "$(wc -l <"$tmp/want.$tag")" -eq "$n" ] || { cat "$tmp/push.$tag"; echo "$tag: push lines"; exit 1; }
  diff "$tmp/want.$tag" "$tmp/got.$tag" || { echo "$tag: checksums differ"; exit 1; }
  echo "$tag: $n items from the other namespace arrived checksum-equal"
}

# stop: SIGTERM; the consumer exits 0 with its report and nothing left behind.
stop() {
  stop_consumer "$1"
  grep -q 'ect push-consumer: [0-9]* items' "$1.err" || { cat "$1.err"; echo "no report"; exit 1; }
}

# 1. wildcard bind, no --advertise: the producer is told 192.0.2.1
run any 0.0.0.0 192.0.2.1:14579
stop "$tmp/cons.any"

# 2. --data-port: the data plane listens on exactly that port
run dport 0.0.0.0 192.0.2.1:14579 --data-port 15123
[ "$(event_field "$tmp/cons.dport" ready data_ports)" = 15123 ] ||
  { cat "$tmp/cons.dport"; echo "ready line does not name data port 15123"; exit 1; }
if command -v ss >/dev/null 2>&1; then
  in1 ss -ltnH | grep -q ':15123 ' || { in1 ss -ltn; echo "nothing listens on 15123"; exit 1; }
fi
stop "$tmp/cons.dport"

# 3. --advertise: the name told is the one given (here the veth address)
run adv 0.0.0.0 192.0.2.1:14579 --advertise 192.0.2.1
[ "$(event_field "$tmp/cons.adv" ready advertise)" = 192.0.2.1 ] || { echo "advertise"; exit 1; }
stop "$tmp/cons.adv"

# 4. IPv6: wildcard :: bind, producer to [2001:db8::1]
if [ "$have_v6" = 1 ]; then
  run v6 :: '[2001:db8::1]:14579' --data-port 15124
  stop "$tmp/cons.v6"
else
  echo "no IPv6 on the veth pair: IPv6 case not run"
fi

# 5. generation 1: `ect pull-producer` bound to 0.0.0.0 in ns1, `ect pull` in
# ns2 listening on 0.0.0.0 with a fixed data port: the producer is told
# 192.0.2.2 (the interface that routes to it) and writes there.
ip netns exec "$ns1" "$ect" pull-producer --host 0.0.0.0 --port 14600 --count 3 --size 200KiB \
  >"$tmp/prod" 2>"$tmp/prod.err" &
ppid=$!
pids+=("$ppid")
wait_event "$tmp/prod" ready "$ppid" || { cat "$tmp/prod.err"; echo "pull-producer not ready"; exit 1; }
in2 timeout 60 "$ect" pull --from 192.0.2.1:14600 --all --listen 0.0.0.0 --data-port 15200 \
  >"$tmp/pull" 2>"$tmp/pull.err" || { cat "$tmp/pull.err" "$tmp/prod.err"; echo "pull failed"; exit 1; }
expect() { sed -n 's/^{"mm_hash": \?"\([^"]*\)", \?"nbytes": \?[0-9]*, \?"checksum": \?"\([0-9a-f]*\)".*/\1 \2/p' "$1" | sort; }
got() { sed -n 's/^{"mm_hash": \?"\([^"]*\)", \?"nbytes": \?[0-9]*, \?"checksum": \?"\([0-9a-f]*\)", \?"status": \?"ok".*/\1 \2/p' "$1" | sort; }
expect "$tmp/prod" >"$tmp/want.pull"
got "$tmp/pull" >"$tmp/got.pull"
[ "$(wc -l <"$tmp/want.pull")" -eq 3 ] || { cat "$tmp/prod"; echo "producer lines"; exit 1; }
diff "$tmp/want.pull" "$tmp/got.pull" || { cat "$tmp/pull"; echo "pull: checksums differ"; exit 1; }
echo "pull: 3 items from the other namespace arrived checksum-equal"
kill -TERM "$ppid"
wait_exit "$ppid" 60
wait "$ppid" || { cat "$tmp/prod.err"; echo "pull-producer exited non-zero"; exit 1; }

# 6. the two-host benchmark: `ect bench xport --server` bound to 0.0.0.0 in
# ns1, `--client` in ns2; every row has a rate and the raw-TCP limit measured
# between the same two namespaces, and the session the client wrote to is the
# veth address (no figures are asserted: this is a 2-core shared machine).
ip netns exec "$ns1" "$ect" bench xport --server --host 0.0.0.0 --port 14590 --data-port 15300 \
  >"$tmp/bsrv" 2>"$tmp/bsrv.err" &
bpid=$!
pids+=("$bpid")
wait_event "$tmp/bsrv" ready "$bpid" || { cat "$tmp/bsrv.err"; echo "bench server not ready"; exit 1; }
in2 timeout 120 "$ect" bench xport --client 192.0.2.1:14590 --seconds 50ms --warmup 20ms --json \
  >"$tmp/bcli" 2>"$tmp/bcli.err" || { cat "$tmp/bcli.err" "$tmp/bsrv.err"; echo "bench client failed"; exit 1; }
/usr/bin/python3 - "$tmp/bcli" <<'EOF2'
import json, sys
rows = json.load(open(sys.argv[1]))
assert len(rows) == 5, rows
for r in rows:
    assert r["transport"] == "tcp" and r["limit"] == "raw-tcp", r
    assert r["gbps"] > 0 and r["limit_gbps"] > 0 and r["ratio"] > 0, r
    assert r["session"] == "192.0.2.1:15300", r["session"]
    assert r["rounds"] >= 3 and r["limit_rounds"] >= 3, r  # writes and raw TCP alternate
EOF2
in2 "$ect" bench xport --client 192.0.2.1:14590 --seconds 50ms --warmup 0 >"$tmp/btab" 2>&1 ||
  { cat "$tmp/btab"; echo "bench client (table) failed"; exit 1; }
grep -q '^xprt .*ratio$' "$tmp/btab"
[ "$(grep -c '^tcp .* raw-tcp ' "$tmp/btab")" -eq 5 ] || { cat "$tmp/btab"; echo "bench table rows"; exit 1; }
# a push client against the xport server: refused, naming what it needs
expect_exit 1 'no push server' in2 "$ect" bench push --client 192.0.2.1:14590 --seconds 50ms
kill -TERM "$bpid"
wait_exit "$bpid" 60
wait "$bpid" || { cat "$tmp/bsrv.err"; echo "bench server exited non-zero"; exit 1; }
grep -q 'connection(s) served' "$tmp/bsrv.err"
echo "bench: two-host xport rows with the raw-TCP limit between the namespaces"

# 7. the two-host push benchmark: `ect bench push --server` (a consumer shard
# and its scheduler, items released as they arrive) bound to 0.0.0.0 in ns1,
# `--client` in ns2 pushing the same steps; every row has a rate and the
# raw-TCP limit between the same two namespaces. The items reach the shard
# only if it told the producer a routable data-plane address.
ip netns exec "$ns1" "$ect" bench push --server --host 0.0.0.0 --port 14591 --data-port 15310 \
  --pool-size 128MiB >"$tmp/psrv" 2>"$tmp/psrv.err" &
bpid=$!
pids+=("$bpid")
wait_event "$tmp/psrv" ready "$bpid" || { cat "$tmp/psrv.err"; echo "push bench server not ready"; exit 1; }
[ "$(event_field "$tmp/psrv" ready bench)" = push ] || { cat "$tmp/psrv"; echo "ready: bench"; exit 1; }
in2 timeout 120 "$ect" bench push --client 192.0.2.1:14591 --sizes 64KiB,1MiB --steps 1,8 \
  --seconds 50ms --warmup 20ms --json >"$tmp/pcli" 2>"$tmp/pcli.err" ||
  { cat "$tmp/pcli.err" "$tmp/psrv.err"; echo "push bench client failed"; exit 1; }
[ "$(wc -l <"$tmp/pcli")" -eq 1 ] || { cat "$tmp/pcli"; echo "push bench --json: not one line"; exit 1; }
/usr/bin/python3 - "$tmp/pcli" <<'EOF2'
import json, sys
rows = json.load(open(sys.argv[1]))
assert [(r["size"], r["step"]) for r in rows] == [(65536, 1), (65536, 8), (1 << 20, 1), (1 << 20, 8)], rows
for r in rows:
    assert r["transport"] == "tcp" and r["limit"] == "raw-tcp" and r["server"] == "192.0.2.1", r
    assert r["items_per_s"] > 0 and r["gbps"] > 0 and r["raw_gbps"] > 0 and r["ratio"] > 0, r
    assert r["round_trips_per_step"] > 0, r
    assert r["rounds"] >= 3 and r["raw_rounds"] >= 3, r  # push and raw-TCP rounds alternate
EOF2
in2 "$ect" bench push --client 192.0.2.1:14591 --sizes 64KiB --steps 1,8 --inflight 1,2 \
  --seconds 50ms --warmup 0 >"$tmp/ptab" 2>&1 || { cat "$tmp/ptab"; echo "push bench (table) failed"; exit 1; }
grep -q '^xprt .*ratio$' "$tmp/ptab"
[ "$(grep -c '^tcp ' "$tmp/ptab")" -eq 4 ] || { cat "$tmp/ptab"; echo "push bench table rows"; exit 1; }
kill -TERM "$bpid"
wait_exit "$bpid" 60
wait "$bpid" || { cat "$tmp/psrv.err"; echo "push bench server exited non-zero"; exit 1; }
n=$(sed -n 's/^ect bench push: server: \([0-9]*\) items$/\1/p' "$tmp/psrv.err")
[ "${n:-0}" -gt 0 ] || { cat "$tmp/psrv.err"; echo "push bench server took no items"; exit 1; }
echo "bench: two-host push rows ($n items) with the raw-TCP limit between the namespaces"

# a wildcard --advertise is refused, naming the flag
expect_exit 2 '--advertise' "$ect" push-consumer --host 0.0.0.0 --port 14579 --advertise 0.0.0.0
expect_exit 2 '--data-port' "$ect" push-consumer --host 0.0.0.0 --port 14579 --data-port x
echo "netns: ok"
