#!/usr/bin/env bash
# Generation 2 fault cases across processes:
#  - consumer killed mid-push (SIGKILL): `ect push` reports failed items and
#    exits non-zero within its timeouts instead of hanging;
#  - producer killed mid-push (SIGKILL, reservations outstanding): with a
#    1 s TTL the consumer's reaper expires them and, the writer being gone,
#    returns their memory: after SIGTERM every rank reports 0 live
#    reservations and 0 bytes in use;
#  - consumer pool too small: an item larger than the whole pool fails at
#    once with the spec's text (it could never fit, so it is not retried) and
#    the consumer keeps serving.
# Every background process is killed on exit; waits are bounded (lib.sh).
. "$(dirname "$0")/lib.sh"

# 1. consumer killed mid-push: 200 items in 25 steps with the default 30 s
# control timeout. A dead consumer fails fast (refused connect / closed
# connection, then held down), so the rest fail within seconds; one control
# timeout per step would take over 12 minutes.
start_consumer "$tmp/c1" 2 --pool-size 64MiB
t0=$(date +%s)
"$ect" push --to "127.0.0.1:$port" --count 200 --size 4MiB --step 8 >"$tmp/p1" 2>"$tmp/p1.err" &
ppid=$!
pids+=("$ppid")
wait_items "$tmp/c1" 1
kill -KILL "$cpid"
wait_exit "$ppid" 120 # generous; one control timeout per step would be 12.5 minutes
if wait "$ppid"; then echo "push succeeded although the consumer died"; exit 1; fi
[ "$(wc -l <"$tmp/p1")" -eq 200 ] || { cat "$tmp/p1.err"; echo "not every item reported"; exit 1; }
grep -q '"state":"failed".*unreachable.*127.0.0.1:' "$tmp/p1" ||
  { cat "$tmp/p1" "$tmp/p1.err"; echo "no failed item naming the unreachable consumer"; exit 1; }
echo "consumer killed mid-push: producer failed the rest in $(($(date +%s) - t0)) s and exited"

# 2. producer killed mid-push, between reserve and complete: the preloaded
# tests/fault/pause_fault.c stops `ect push` at its first data-plane connect
# (the first step's reserves answered, nothing written) and says so in a
# file; the kill follows that event, so reservations are surely left behind
# however slow the machine (a kill timed by the consumer's log lines could
# land between two steps)
[ -n "${ECT_PAUSE_PRELOAD:-}" ] || { echo "ECT_PAUSE_PRELOAD not set: run through ctest"; exit 1; }
dport=$(free_port 2)
start_consumer "$tmp/c2" 2 --pool-size 160MiB --ttl 1 --data-port "$dport"
LD_PRELOAD="$ECT_PAUSE_PRELOAD" ECT_FAULT_PAUSE=after_reserve ECT_FAULT_MARK="$tmp/mark2" \
  ECT_FAULT_DATA_PORT=$dport ECT_FAULT_DATA_PORTS=2 \
  "$ect" push --to "127.0.0.1:$port" --count 400 --size 8MiB --step 8 >"$tmp/p2" 2>"$tmp/p2.err" &
ppid=$!
pids+=("$ppid")
wait_grep after_reserve "$tmp/mark2"
kill -KILL "$ppid"
# TTL 1 s, then the pending grace (1 s), reaper every 1 s: wait for the first
# freed reservation, then two more reaper passes for any reserved a bit later
wait_grep 'silent past its grace' "$tmp/c2.err"
sleep 2.5
stop_consumer "$tmp/c2" # no reservation of the killed producer keeps memory
grep -q 'silent past its grace' "$tmp/c2.err" || { echo "no reservation was left to expire"; exit 1; }
# what --help promises: expired reservations are reported on stderr
grep -q 'ect push-consumer: rank [01]: [0-9]* reservation(s) expired' "$tmp/c2.err" ||
  { cat "$tmp/c2.err"; echo "expiries not reported"; exit 1; }
echo "producer killed mid-push: reservations expired, memory returned"

# 3. pool full
start_consumer "$tmp/c3" 1 --pool-size 1MiB
if "$ect" push --to "127.0.0.1:$port" --size 2MiB --timeout 10 >"$tmp/p3" 2>"$tmp/p3.err"; then
  echo "an item larger than the pool was accepted"
  exit 1
fi
grep -q 'EC consumer buffer pool is full: more than the whole pool (2097152 bytes wanted' "$tmp/p3" ||
  { cat "$tmp/p3"; echo "no pool-full text"; exit 1; }
grep -q '"retries":0' "$tmp/p3" || { cat "$tmp/p3"; echo "an item that can never fit was retried"; exit 1; }
"$ect" push --to "127.0.0.1:$port" --size 256KiB --timeout 10 >"$tmp/p3b" 2>&1
wait_items "$tmp/c3" 1
stop_consumer "$tmp/c3"
echo "pool full: refused with the spec's text, the consumer kept serving"
