#!/usr/bin/env bash
# `ect demo` end to end (small items so it stays quick on 2 cores): push over
# tcp with TP 2 and over shm, pull over tcp; every run must verify every item,
# show dedup hits and report 0 failures. A corrupted checksum (the fault
# library tests/fault/checksum_fault.c, preloaded: the shipped ect has no
# fault switch) must fail the run; SIGINT and a consumer
# killed mid-run must end the demo with exit 1 within bounds, leaving no child
# process behind. Bad flags exit 2 naming what is accepted. `ect push --wait-go`
# (the demo's go) moves its first step alone and waits for a go on stdin.
. "$(dirname "$0")/lib.sh"

# ok_run NAME ARGS...: the demo exits 0, moves and verifies N of N (some may
# have been retried: a full pool makes items wait, never fail), 0 failed,
# dedup > 0.
ok_run() {
  local name=$1; shift
  if ! timeout 120 "$ect" demo "$@" >"$tmp/$name" 2>"$tmp/$name.err"; then
    cat "$tmp/$name" "$tmp/$name.err"; echo "demo $name failed"; exit 1
  fi
  local n
  n=$(sed -n 's/.* \([0-9]*\) items of .*/\1/p' "$tmp/$name" | head -1)
  grep -Eq "^  items       $n moved, $n verified \(checksums equal end to end\), [0-9]+ retried, 0 failed$" "$tmp/$name" ||
    { cat "$tmp/$name"; echo "$name: not every item verified"; exit 1; }
  grep -q '^  failures    0$' "$tmp/$name" || { cat "$tmp/$name"; exit 1; }
  # every block of 32 new items brings 8 repeats (ect push --repeat 32:8 in push)
  local r=$((n % 40 > 32 ? n % 40 - 32 : 0))
  grep -q "^  dedup hits  $((n / 40 * 8 + r)) " "$tmp/$name" ||
    { cat "$tmp/$name"; echo "dedup hits: want $((n / 40 * 8 + r))"; exit 1; }
  grep -Eq '^  latency     p50 [0-9.]+ ms, p99 [0-9.]+ ms' "$tmp/$name" || { cat "$tmp/$name"; exit 1; }
  # the rate is over the transfer: push leaves out the first step (8 items, moved
  # alone before the go), pull nothing; the run in all is at least as long
  local span=$n
  case " $* " in *" --protocol pull "*) ;; *) span=$((n - 8)) ;; esac
  grep -Eq "^  throughput  [0-9.]+ GB/s \([0-9.]+ items/s\) over the transfer \($span items\)$" "$tmp/$name" ||
    { cat "$tmp/$name"; echo "$name: the rate is not over the $span items of the transfer"; exit 1; }
  sed -n 's/^  time        \([0-9.]*\) s transfer, \([0-9.]*\) s in all (.*)$/\1 \2/p' "$tmp/$name" |
    awk '{ exit !(NF == 2 && $1 + 0 <= $2 + 0) }' ||
    { cat "$tmp/$name"; echo "$name: no transfer and in-all times, or transfer > in all"; exit 1; }
  # not a terminal: plain progress lines, no carriage returns
  if grep -q $'\r' "$tmp/$name"; then echo "$name: \\r on a pipe"; exit 1; fi
  echo "$name: $(grep throughput "$tmp/$name")"
}

ok_run push_tcp_tp2 --items 45 --shape 64x1024 --tp 2
ok_run push_tcp_partial --items 75 --shape 16x1024
ok_run push_shm --items 45 --shape 64x1024 --transport shm
# --bench: `ect bench push` of the same size, step and steps in flight runs after
# the demo, which checks that the bench's row is that case and reports its items/s as
# a ratio to it (no bound: only that it is there, naming the case)
ok_run push_bench --items 45 --shape 64x1024 --inflight 2 --bench
grep -Eq '^  vs bench    [0-9]+\.[0-9]+ x `ect bench push` \([0-9.]+ items/s; like for like, as its row says: 128 KiB items, steps of 8, 2 in flight, tcp; measured right after\)$' \
  "$tmp/push_bench" || { cat "$tmp/push_bench"; echo "no vs bench line"; exit 1; }
# ... and the same ratio over the items whose bytes moved: the 37 of the
# transfer less its 8 dedup hits (items 32..39), i.e. 29/37 of the first
sed -n 's/^  vs bench    \([0-9.]*\) x .*/\1/p; s/^              \([0-9.]*\) x counting only the demo.s 29 items whose bytes moved (its 8 dedup hits moved none)$/\1/p' \
  "$tmp/push_bench" | paste -sd' ' | awk '{ d = $1 * 29 / 37 - $2; exit !(NF == 2 && d < 0.011 && d > -0.011) }' ||
  { cat "$tmp/push_bench"; echo "no moved-only ratio of 29/37 the first"; exit 1; }
ok_run pull_tcp --protocol pull --items 45 --shape 64x1024 --dtype float32

# a verification failure fails the run: the consumer's first checksum comes out
# different (ECT_FAULT_PRELOAD: the fault library, after a sanitizer's runtime)
if timeout 60 env ECT_FAULT=checksum LD_PRELOAD="${ECT_FAULT_PRELOAD:?the fault library}" \
  "$ect" demo --items 5 --shape 16x1024 >"$tmp/f" 2>"$tmp/f.err"; then
  cat "$tmp/f"; echo "a checksum mismatch did not fail the demo"; exit 1
fi
grep -q 'consumer checksum' "$tmp/f.err" || { cat "$tmp/f.err"; exit 1; }
grep -q '^  failures    1$' "$tmp/f" || { cat "$tmp/f"; exit 1; }
# moved never counts a failed item: the corrupted one is moved-but-failed
grep -Eq '^  items       4 moved, 4 verified .*, 1 failed$' "$tmp/f" || { cat "$tmp/f"; exit 1; }

# ect push --wait-go (what the demo times the transfer by): the first step goes
# alone, then the ready event with its item count; stdin ending instead of a go
# ends the run with exit 1 after exactly that step (nothing more was started);
# with the go every item moves, the ready event after the first step's lines.
start_consumer "$tmp/wg.cons" 1 --pool-size 64MiB
wg=(timeout 60 "$ect" push --to "127.0.0.1:$port" --count 12 --size 64KiB --step 4 --inflight 2
  --control-timeout 5 --wait-go)
rc=0
"${wg[@]}" --id-prefix nogo </dev/null >"$tmp/wg.nogo" 2>"$tmp/wg.nogo.err" || rc=$?
[ "$rc" -eq 1 ] || { cat "$tmp/wg.nogo" "$tmp/wg.nogo.err"; echo "--wait-go without go: exit $rc"; exit 1; }
grep -q 'before "go"' "$tmp/wg.nogo.err" || { cat "$tmp/wg.nogo.err"; exit 1; }
[ "$(tail -1 "$tmp/wg.nogo")" = '{"event":"ready","warmup_items":4}' ] &&
  [ "$(grep -c '"state":"done"' "$tmp/wg.nogo")" -eq 4 ] && [ "$(wc -l <"$tmp/wg.nogo")" -eq 5 ] ||
  { cat "$tmp/wg.nogo"; echo "--wait-go: not the first step alone, then ready"; exit 1; }
echo go | "${wg[@]}" --id-prefix go >"$tmp/wg.go" 2>"$tmp/wg.go.err" ||
  { cat "$tmp/wg.go" "$tmp/wg.go.err"; echo "--wait-go with go failed"; exit 1; }
[ "$(grep -c '"state":"done"' "$tmp/wg.go")" -eq 12 ] &&
  [ "$(sed -n 5p "$tmp/wg.go")" = '{"event":"ready","warmup_items":4}' ] ||
  { cat "$tmp/wg.go"; echo "--wait-go with go: not 4 lines, ready, 8 lines"; exit 1; }
wait_items "$tmp/wg.cons" 16 # the consumer took all 4 + 12 before it is stopped
stop_consumer "$tmp/wg.cons"
echo "push --wait-go: first step alone, ready, exit 1 without a go, every item with it"

# children of a running demo (their pids)
children() { pgrep -P "$1" || true; }

# interrupted: SIGINT ends the demo with 1 and stops its children
interrupted() {
  local what=$1 sig=$2 want=2; shift 2
  [ "${1:-}" = --protocol ] && want=1 # pull: the producer saves before ect pull starts
  "$ect" demo --items 100000 --shape 64x1024 "$@" >"$tmp/i" 2>"$tmp/i.err" &
  local bg=$!
  pids+=("$bg")
  local kids=""
  for _ in $(seq 1200); do
    kids=$(children "$bg")
    [ "$(echo "$kids" | wc -w)" -ge "$want" ] && break
    sleep 0.05
  done
  [ "$(echo "$kids" | wc -w)" -ge "$want" ] || { cat "$tmp/i.err"; echo "demo started no children"; exit 1; }
  sleep 0.5
  if [ "$what" = demo ]; then
    kill "-$sig" "$bg"
  else # kill the demo's first child (push: the consumer; pull: the producer)
    kill "-$sig" "$(echo "$kids" | head -1)"
  fi
  local rc=0
  for _ in $(seq 1200); do kill -0 "$bg" 2>/dev/null || break; sleep 0.05; done
  if kill -0 "$bg" 2>/dev/null; then echo "demo did not end after $what got SIG$sig"; exit 1; fi
  wait "$bg" || rc=$?
  [ "$rc" -eq 1 ] || { cat "$tmp/i.err"; echo "exit $rc after $what got SIG$sig, want 1"; exit 1; }
  for k in $kids; do
    if kill -0 "$k" 2>/dev/null; then echo "child $k outlived the demo"; exit 1; fi
  done
  echo "SIG$sig to $what: exit 1, children gone ($(tail -1 "$tmp/i.err"))"
}
interrupted demo INT
interrupted consumer KILL
interrupted consumer KILL --protocol pull --items 3000

# bad flags: exit 2 and say what is accepted
bad() { expect_exit 2 "$1" "$ect" demo "${@:2}"; }
bad 'accepted: push, pull' --protocol carrier-pigeon
bad 'accepted: tcp, shm, ucx' --transport rdma
bad 'positive sizes' --shape 576x0
bad 'torch dtype' --dtype bfloat17
bad 'no TP shards' --protocol pull --tp 2
bad 'integer in' --items 0
bad 'accepted: --protocol' --bogus
bad '--inflight' --inflight 0
bad 'compares with `ect bench push`' --bench --tp 2
bad 'compares with `ect bench push`' --bench --protocol pull
# ect push --repeat (what the demo's workload uses): REP <= NEW, not with --file
expect_exit 2 'REP must be at most NEW' "$ect" push --to 127.0.0.1:1 --repeat 3:4
echo x >"$tmp/item"
expect_exit 2 'does not apply to --file' "$ect" push --to 127.0.0.1:1 --repeat 8:2 --file "$tmp/item"
# ect info: version, every transport tried on this machine, the defaults
"$ect" info >"$tmp/info"
grep -q '^ectransfer [0-9]*\.[0-9]*\.[0-9]*$' "$tmp/info"
grep -q '^  tcp  works$' "$tmp/info" && grep -q '^  shm  works$' "$tmp/info" || { cat "$tmp/info"; exit 1; }
grep -q 'ec_port 14579' "$tmp/info" && grep -q 'staging 268435456 B' "$tmp/info" || { cat "$tmp/info"; exit 1; }
grep -q '^environment: ECT_LOG=debug' < <(ECT_LOG=debug "$ect" info 2>/dev/null) || { echo "info ignores ECT_LOG"; exit 1; }
echo "demo: all checks passed"
