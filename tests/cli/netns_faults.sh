#!/usr/bin/env bash
# The multi-host fault matrix (issue 15): `ect push-consumer` (TP 2) on one
# "host" (network namespace, 192.0.2.1), `ect push` on another (192.0.2.2),
# joined by a veth pair; for each fault every item must either arrive
# checksum-equal (the consumer prints it, and its checksum is the one its
# content-derived mm_hash names) or be reported failed with a cause; no item
# reported done that the consumer did not get right; no call past its bound
# (every wait here is generous; none is a timing assert); and both shards'
# pools back to zero bytes held (beyond the resident cache) once the TTL
# passed, read from `ect status --json` (polled state, not sleeps).
#
# Faults: link down for 2 s mid-write (ip link), packet loss (no netem in this
# kernel: tbf drops, with the measured drop rate), 50 ms delay (netem only:
# skipped where the kernel lacks it), kill -9 of the producer after reserve /
# during write / before complete (tests/fault/pause_fault.c stops it at that
# point and says so in a file), kill -9 of the consumer (its shards and
# scheduler: one process) during write and a restart on the same ports, and
# a clean consumer restart on the same ports mid-push.
#
# Prints the matrix: fault -> sent / moved / failed / corrupted / lost /
# leaked / seconds from the fault until every outcome was known and the pools
# were back to zero, with the causes of the failures. Asserts moved + failed
# (+ lost, only where the consumer itself was killed: items it had
# acknowledged as complete die with its process) = sent, corrupted = 0,
# leaked = 0. ECT_MATRIX_OUT=FILE also writes the table there.
# Needs root and `ip netns`: exits 77 (skipped) where they are unavailable.
. "$(dirname "$0")/lib.sh"

if ! command -v ip >/dev/null 2>&1 || ! command -v tc >/dev/null 2>&1; then
  echo "SKIP: ip / tc (iproute2) not installed"
  exit 77
fi
netns_pair fc fp

# The namespaces are this run's own: fixed ports cannot collide with anything.
PORT=14700 # control ports 14700, 14701
DPORT=15700 # data-plane ports 15700, 15701
TP=2
TTL=5 # seconds: reservation TTL and pending grace (longer than the 2 s cut)
CONS=192.0.2.1
table=$tmp/table
now() { date +%s.%N; }

# start_cons OUT: the consumer in ns1 (stdout OUT, stderr OUT.err), once ready.
start_cons() {
  rm -f "$1" "$1.err"
  # `ip netns exec` execs ect: $! is ect's own pid (a shell function here
  # would put a subshell between, and a kill would miss ect)
  ip netns exec "$ns1" "$ect" push-consumer --host "$CONS" --port $PORT --tp $TP --pool-size 64MiB --ttl $TTL \
    --data-port $DPORT >"$1" 2>"$1.err" &
  cpid=$!
  pids+=("$cpid")
  wait_event "$1" ready "$cpid" 120 || { cat "$1.err"; echo "consumer not ready"; exit 1; }
}

# held: bytes each shard holds beyond its resident cache, plus its
# reservations in a live state, summed ("0" = back to zero; "?" = no answer).
held() {
  local r out total=0
  for ((r = 0; r < TP; r++)); do
    out=$(in1 "$ect" status "$CONS:$((PORT + r))" --json --timeout 10 2>/dev/null) || { echo "?"; return; }
    total=$((total + $(python3 -c '
import json, sys
s = json.loads(sys.argv[1])
live = sum(s["reservations"][k] for k in ("WRITING", "READY", "CANCEL_PENDING", "EXPIRE_PENDING"))
print(s["pool"]["used"] - s["pool"]["resident"] + live)' "$out")))
  done
  echo "$total"
}

# wait_zero SECONDS: until held is 0 (returns 0), else 1 after SECONDS.
wait_zero() {
  local i h
  for ((i = 0; i < $1 * 5; i++)); do
    h=$(held)
    [ "$h" = 0 ] && return 0
    sleep 0.2
  done
  return 1
}

# push TAG N [ENV...]: `ect push` of N 1 MiB items in steps of 4 from ns2,
# in the background ($ppid); content seeded per row (no dedup across rows).
push() {
  local tag=$1 n=$2
  shift 2
  ip netns exec "$ns2" env "$@" "$ect" push --to "$CONS:$PORT" --count "$n" --size 1MiB --step 4 \
    --seed "$((RANDOM + 1))" --id-prefix "$tag" --timeout 60 --control-timeout 10 --push-wait 20 \
    >"$tmp/p.$tag" 2>"$tmp/p.$tag.err" &
  ppid=$!
  pids+=("$ppid")
}

# wait_push SECONDS: the producer exits within SECONDS (a generous bound far
# beyond its own timeouts: 60 s a step, 10 s a control exchange); its exit
# status in $prc.
wait_push() {
  local i
  for ((i = 0; i < $1 * 20; i++)); do
    if ! kill -0 "$ppid" 2>/dev/null; then
      prc=0
      wait "$ppid" || prc=$?
      return 0
    fi
    sleep 0.05
  done
  echo "ect push still running after $1 s: a call hung past its timeouts"
  exit 1
}

# delivered FILE...: items the consumer(s) printed
delivered() { cat "$@" 2>/dev/null | grep -c '"status":"ok"}$' || true; }

# row NAME TAG N KILLED_PRODUCER CONSUMER_KILLED T_FAULT CONSUMER_OUTS...:
# accounts one row, appends it to the table, asserts the invariants.
row() {
  local name=$1 tag=$2 n=$3 kp=$4 kc=$5 t0=$6
  shift 6
  local t1 leaked
  if wait_zero 120; then leaked=0; else leaked=$(held); fi
  t1=$(now)
  python3 - "$name" "$tag" "$n" "$kp" "$kc" "$t0" "$t1" "$leaked" "$tmp/p.$tag" "$@" >>"$table" <<'EOF' ||
import json, re, sys
name, tag, n, kp, kc, t0, t1, leaked, pfile = sys.argv[1:10]
n, kp, kc = int(n), kp == "1", kc == "1"
recv, corrupted = {}, 0
for f in sys.argv[10:]:
    for line in open(f):
        try:
            o = json.loads(line)
        except ValueError:
            continue
        if o.get("status") != "ok" or "transfer_id" not in o:
            continue
        m = re.match(r"xxh3-([0-9a-f]{16})-", o["mm_hash"])
        if not m or m.group(1) != o["checksum"]:
            corrupted += 1  # bytes other than the content the mm_hash names
            continue
        recv[o["transfer_id"]] = o["checksum"]
prod = {}
for line in open(pfile):
    try:
        o = json.loads(line)
    except ValueError:
        continue
    if "transfer_id" in o:
        prod[o["transfer_id"]] = o
moved = failed = lost = unaccounted = 0
causes = {}
for i in range(n):
    tid = f"{tag}-{i}"
    p = prod.get(tid)
    if tid in recv:
        if p and p["state"] == "done" and p["checksum"] != recv[tid]:
            corrupted += 1
        else:
            moved += 1
    elif p and p["state"] == "done":
        if kc:
            lost += 1  # acknowledged complete, then its consumer process was killed
        else:
            corrupted += 1  # reported done, never delivered right
    elif p and p.get("error"):
        failed += 1
        c = re.sub(r"[0-9a-f]{8,}|\d+(\.\d+)?", "#", p["error"])[:60]
        causes[c] = causes.get(c, 0) + 1
    elif kp:
        failed += 1
        causes["producer killed"] = causes.get("producer killed", 0) + 1
    else:
        unaccounted += 1
cause = "; ".join(f"{k} (x{v})" for k, v in sorted(causes.items(), key=lambda kv: -kv[1])[:2])
print(f"| {name} | {n} | {moved} | {failed} | {corrupted} | {lost} | {leaked} | "
      f"{float(t1) - float(t0):.1f} | {cause or '-'} |")
ok = (moved + failed + lost == n and corrupted == 0 and unaccounted == 0 and leaked == "0"
      and (kc or lost == 0))
if not ok:
    print(f"{name}: moved {moved} failed {failed} lost {lost} corrupted {corrupted} "
          f"unaccounted {unaccounted} leaked {leaked} of {n}", file=sys.stderr)
sys.exit(0 if ok else 1)
EOF
    { tail -n 1 "$table"; cat "$tmp/p.$tag.err"; echo "$name: invariant broken"; exit 1; }
  echo "$(tail -n 1 "$table")"
}

skip_row() { echo "| $1 | - | - | - | - | - | - | - | skipped: $2 |" >>"$table"; tail -n 1 "$table"; }

# tbf on the producer's egress: the writes take long enough for a fault to
# land mid-write (rate), or overflow the bucket (drops)
shape() { in2 tc qdisc replace dev "$veth2" root tbf "$@"; }
unshape() { in2 tc qdisc del dev "$veth2" root 2>/dev/null || true; }

echo "| fault | sent | moved | failed | corrupted | lost | leaked | detect s | causes of failure |" >"$table"
echo "|---|---|---|---|---|---|---|---|---|" >>"$table"

start_cons "$tmp/c0"
cfiles=("$tmp/c0")

# 0. no fault: the baseline every row is compared with
push base 16
t0=$(now)
wait_push 300
row "none (baseline)" base 16 0 0 "$t0" "${cfiles[@]}"

# 1. link down for 2 s mid-write (the writes paced at 200 Mbit/s so the cut
# lands inside them); TCP rides it out: nothing fails, nothing is lost
shape rate 200mbit burst 64kb latency 500ms
start=$(delivered "${cfiles[@]}")
push linkdown 24
until [ "$(delivered "${cfiles[@]}")" -ge $((start + 2)) ] || ! kill -0 "$ppid" 2>/dev/null; do sleep 0.05; done
t0=$(now)
in2 ip link set "$veth2" down
sleep 2 # the fault's length, not a wait for readiness
in2 ip link set "$veth2" up
wait_push 300
unshape
row "link down 2 s mid-write" linkdown 24 0 0 "$t0" "${cfiles[@]}"

# 2. loss: netem where the kernel has it, else tbf tail drops (a bucket too
# small for the burst TCP sends; the drop rate is measured, not chosen)
if in2 tc qdisc replace dev "$veth2" root netem loss 10% 2>/dev/null; then
  lname="10 % loss (netem)"
else
  shape rate 400mbit burst 64kb limit 128kb
  lname="loss (tbf drops)"
fi
t0=$(now)
push loss 24
wait_push 300
stats=$(in2 tc -s qdisc show dev "$veth2")
unshape
pk=$(echo "$stats" | sed -n 's/.*Sent [0-9]* bytes \([0-9]*\) pkt (dropped \([0-9]*\).*/\1 \2/p' | head -n 1)
read -r sent_pk drop_pk <<<"${pk:-0 0}"
if [ "${sent_pk:-0}" -gt 0 ]; then
  lname="$lname, $drop_pk of $((sent_pk + drop_pk)) packets dropped ($(python3 -c "print(f'{100*$drop_pk/($sent_pk+$drop_pk):.1f}')") %)"
fi
row "$lname" loss 24 0 0 "$t0" "${cfiles[@]}"

# 3. 50 ms delay: netem only
if in2 tc qdisc replace dev "$veth2" root netem delay 50ms 2>/dev/null; then
  t0=$(now)
  push delay 16
  wait_push 300
  unshape
  row "50 ms delay (netem)" delay 16 0 0 "$t0" "${cfiles[@]}"
else
  skip_row "50 ms delay" "this kernel has no netem qdisc (tc: unknown qdisc kind)"
fi

# 4-6. kill -9 of the producer at a point of the push: tests/fault/pause_fault.c
# stops it there and writes the point to a file; then the kill
if [ -z "${ECT_PAUSE_PRELOAD:-}" ]; then
  echo "ECT_PAUSE_PRELOAD (tests/fault/pause_fault.c) not set: run through ctest"
  exit 1
fi
for point in after_reserve during_write before_complete; do
  rm -f "$tmp/mark"
  push "kill-$point" 16 "LD_PRELOAD=$ECT_PAUSE_PRELOAD" ECT_FAULT_PAUSE=$point \
    "ECT_FAULT_MARK=$tmp/mark" ECT_FAULT_DATA_PORT=$DPORT ECT_FAULT_DATA_PORTS=$TP
  for ((i = 0; i < 2400; i++)); do
    [ -s "$tmp/mark" ] && break
    kill -0 "$ppid" 2>/dev/null || break
    sleep 0.05
  done
  [ "$(cat "$tmp/mark" 2>/dev/null)" = "$point" ] ||
    { cat "$tmp/p.kill-$point.err"; echo "the producer did not stop at $point"; exit 1; }
  t0=$(now)
  kill -KILL "$ppid"
  wait "$ppid" 2>/dev/null || true
  row "kill -9 producer $(echo $point | tr _ ' ')" "kill-$point" 16 1 0 "$t0" "${cfiles[@]}"
done

# 7. kill -9 of the consumer (both shards and the scheduler) during the
# writes, restarted on the same ports at once; the producer goes on
shape rate 200mbit burst 64kb latency 500ms
start=$(delivered "${cfiles[@]}")
push killcons 40
until [ "$(delivered "${cfiles[@]}")" -ge $((start + 4)) ] || ! kill -0 "$ppid" 2>/dev/null; do sleep 0.05; done
t0=$(now)
kill -KILL "$cpid"
wait "$cpid" 2>/dev/null || true
start_cons "$tmp/c1"
cfiles+=("$tmp/c1")
wait_push 300
unshape
row "kill -9 consumer mid-write, restart" killcons 40 0 1 "$t0" "${cfiles[@]}"
served_after() { # the restarted consumer serves a new push in full
  push "after-$1" 4
  wait_push 300
  [ "$prc" = 0 ] || { cat "$tmp/p.after-$1.err"; echo "$1: the restarted consumer does not serve"; exit 1; }
  echo "$1: a new push after the restart: 4 of 4 moved"
}
served_after killcons

# 8. the consumer stopped cleanly (SIGTERM) mid-push and restarted on the
# same ports
shape rate 200mbit burst 64kb latency 500ms
start=$(delivered "${cfiles[@]}")
push restart 40
until [ "$(delivered "${cfiles[@]}")" -ge $((start + 4)) ] || ! kill -0 "$ppid" 2>/dev/null; do sleep 0.05; done
t0=$(now)
kill -TERM "$cpid"
wait_exit "$cpid" 60
wait "$cpid" || { cat "$tmp/c1.err"; echo "consumer exited non-zero on SIGTERM"; exit 1; }
start_cons "$tmp/c2"
cfiles+=("$tmp/c2")
wait_push 300
unshape
row "consumer restart (same ports) mid-push" restart 40 0 1 "$t0" "${cfiles[@]}"
served_after restart

stop_consumer "$tmp/c2"

# ---- generation 1: `ect pull-producer` on the first host, `ect pull` on the
# second; the producer writes into the puller's pool across the veth pair.
PPORT=14800 # ROUTER; PUB on 14801
MPORT=14900 # the producer's metrics
LDPORT=15800 # the puller's data plane
NP=24

start_prod() {
  rm -f "$1" "$1.err"
  ip netns exec "$ns1" "$ect" pull-producer --host "$CONS" --port $PPORT --count $NP --size 1MiB \
    --pool-size 64MiB --metrics-port $MPORT >"$1" 2>"$1.err" &
  prpid=$!
  pids+=("$prpid")
  wait_event "$1" ready "$prpid" 120 || { cat "$1.err"; echo "pull-producer not ready"; exit 1; }
}

# metric NAME: the producer's gauge NAME now ("?" when it does not answer)
metric() {
  in1 python3 - "$CONS" $MPORT "$1" <<'EOF2' || echo "?"
import sys, urllib.request
host, port, name = sys.argv[1:4]
text = urllib.request.urlopen(f"http://{host}:{port}/metrics", timeout=10).read().decode()
for line in text.splitlines():
    if line.startswith(name + "{") or line.startswith(name + " "):
        print(int(float(line.rsplit(" ", 1)[1])))
        break
else:
    print("?")
EOF2
}

# wait_leases SECONDS: until the producer holds no lease (0), else 1
wait_leases() {
  local i
  for ((i = 0; i < $1 * 5; i++)); do
    [ "$(metric ectransfer_pool_leased_items)" = 0 ] && return 0
    sleep 0.2
  done
  return 1
}

pull() {
  ip netns exec "$ns2" "$ect" pull --from "$CONS:$PPORT" --all --listen 0.0.0.0 --data-port $LDPORT \
    --timeout 10s --pool-size 64MiB >"$tmp/l.$1" 2>"$tmp/l.$1.err" &
  ppid=$!
  pids+=("$ppid")
}
pulled() { grep -c '"status": \?"ok"' "$tmp/l.$1" 2>/dev/null || true; }

# prow NAME TAG KILLED(consumer|producer|-) T_FAULT PRODUCER_OUT
prow() {
  local name=$1 tag=$2 killed=$3 t0=$4 prod=$5 leaked
  if [ "$killed" = producer ]; then
    leaked="0 (killed)" # the producer's pool went with its process
  elif wait_leases 120; then
    leaked=0
  else
    leaked="$(metric ectransfer_pool_leased_items) leases"
  fi
  python3 - "$name" "$killed" "$t0" "$(now)" "$leaked" "$prod" "$tmp/l.$tag" "$NP" >>"$table" <<'EOF2' ||
import json, re, sys
name, killed, t0, t1, leaked, prod, pulls, n = sys.argv[1:9]
n = int(n)
want = {}
for line in open(prod):
    try:
        o = json.loads(line)
    except ValueError:
        continue
    if "mm_hash" in o and "checksum" in o:
        want[o["mm_hash"]] = o["checksum"]
moved = failed = corrupted = 0
causes = {}
seen = set()
for line in open(pulls):
    try:
        o = json.loads(line)
    except ValueError:
        continue
    h = o.get("mm_hash")
    if h not in want or h in seen:
        continue
    seen.add(h)
    if o.get("status") == "ok":
        if o.get("checksum") == want[h]:
            moved += 1
        else:
            corrupted += 1
    else:
        failed += 1
        c = re.sub(r"[0-9a-f]{8,}|\d+(\.\d+)?", "#", str(o.get("status")))[:60]
        causes[c] = causes.get(c, 0) + 1
unreported = len(want) - len(seen)
if killed == "consumer":  # the puller died: what it had not printed never arrived for it
    failed += unreported
    causes["consumer killed"] = unreported
    unreported = 0
cause = "; ".join(f"{k} (x{v})" for k, v in sorted(causes.items(), key=lambda kv: -kv[1])[:2])
print(f"| {name} | {len(want)} | {moved} | {failed} | {corrupted} | 0 | {leaked} | "
      f"{float(t1) - float(t0):.1f} | {cause or '-'} |")
ok = (len(want) == n and moved + failed == n and corrupted == 0 and unreported == 0
      and leaked.startswith("0"))
if not ok:
    print(f"{name}: moved {moved} failed {failed} corrupted {corrupted} unreported {unreported} "
          f"leaked {leaked} of {len(want)}", file=sys.stderr)
sys.exit(0 if ok else 1)
EOF2
    { tail -n 1 "$table"; cat "$tmp/l.$tag.err"; echo "$name: invariant broken"; exit 1; }
  tail -n 1 "$table"
}
pshape() { in1 tc qdisc replace dev "$veth1" root tbf "$@"; }
punshape() { in1 tc qdisc del dev "$veth1" root 2>/dev/null || true; }

start_prod "$tmp/pp0"
# P0. no fault
t0=$(now)
pull pbase
wait_push 300
prow "pull: none (baseline)" pbase - "$t0" "$tmp/pp0"

# P1. link down for 2 s mid-pull (the producer's writes paced at 200 Mbit/s)
pshape rate 200mbit burst 64kb latency 500ms
pull plink
until [ "$(pulled plink)" -ge 2 ] || ! kill -0 "$ppid" 2>/dev/null; do sleep 0.05; done
t0=$(now)
in1 ip link set "$veth1" down
sleep 2 # the fault's length
in1 ip link set "$veth1" up
wait_push 300
punshape
prow "pull: link down 2 s mid-pull" plink - "$t0" "$tmp/pp0"

# P2. kill -9 of the puller mid-pull: the producer's writes into it fail,
# every lease comes back
pshape rate 200mbit burst 64kb latency 500ms
pull pkillc
until [ "$(pulled pkillc)" -ge 2 ] || ! kill -0 "$ppid" 2>/dev/null; do sleep 0.05; done
t0=$(now)
kill -KILL "$ppid"
wait "$ppid" 2>/dev/null || true
punshape
prow "pull: kill -9 consumer mid-pull" pkillc consumer "$t0" "$tmp/pp0"

# P3. kill -9 of the producer mid-pull: the puller fails the rest at once,
# naming the cause, and exits
pshape rate 200mbit burst 64kb latency 500ms
pull pkillp
until [ "$(pulled pkillp)" -ge 2 ] || ! kill -0 "$ppid" 2>/dev/null; do sleep 0.05; done
t0=$(now)
kill -KILL "$prpid"
wait "$prpid" 2>/dev/null || true
wait_push 300
punshape
prow "pull: kill -9 producer mid-pull" pkillp producer "$t0" "$tmp/pp0"
echo
cat "$table"
if [ -n "${ECT_MATRIX_OUT:-}" ]; then cp "$table" "$ECT_MATRIX_OUT"; fi
echo "netns_faults: ok"
