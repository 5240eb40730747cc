#!/usr/bin/env bash
# Generation 2 across processes: `ect push-consumer` with TP = 1, 2 and 4 (tcp)
# and TP = 2 (shm) receives what `ect push` sends; every item's checksum the
# consumer prints must equal the one the producer printed, a repeated push of
# the same content is answered from the resident copy, and after SIGTERM the
# consumer exits 0 reporting 0 live reservations and 0 bytes in use per rank.
# Every background process is killed on exit; waits are bounded.
set -euo pipefail
ect=${ECT_BIN:?}
tmp=$(mktemp -d)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill -KILL "$p" 2>/dev/null || true; done
  rm -rf "$tmp"
}
trap cleanup EXIT

# start_consumer OUT TP ARGS...: starts a consumer instance on a random free
# port range (retrying when taken), waits 10 s at most until its scheduler
# reaches every shard; sets $port and $cpid.
start_consumer() {
  local out=$1 tp=$2; shift 2
  for _ in 1 2 3 4 5 6 7 8; do
    port=$((20000 + RANDOM % 30000))
    "$ect" push-consumer --host 127.0.0.1 --port "$port" --tp "$tp" --pool-size 32MiB "$@" \
      >"$out" 2>"$out.err" &
    cpid=$!
    pids+=("$cpid")
    for _ in $(seq 1200); do
      grep -q 'scheduler connected' "$out.err" 2>/dev/null && return 0
      kill -0 "$cpid" 2>/dev/null || break
      sleep 0.05
    done
    if grep -q 'address in use' "$out.err"; then continue; fi
    cat "$out.err"
    echo "consumer did not start"
    exit 1
  done
  echo "no free port range"
  exit 1
}

# stop_consumer OUT [SIGNAL]: SIGTERM (or SIGNAL), exit 0 within 10 s,
# nothing left on any rank.
stop_consumer() {
  kill -"${2:-TERM}" "$cpid"
  for _ in $(seq 1200); do kill -0 "$cpid" 2>/dev/null || break; sleep 0.05; done
  if kill -0 "$cpid" 2>/dev/null; then echo "consumer ignored SIGTERM"; exit 1; fi
  wait "$cpid"
  if grep 'live reservations' "$1.err" | grep -v ': 0 live reservations, 0 bytes in use'; then
    echo "consumer left reservations or memory behind"
    exit 1
  fi
}

# wait_lines FILE N: until FILE has N lines (30 s at most).
wait_lines() {
  for _ in $(seq 600); do
    [ "$(wc -l <"$1")" -ge "$2" ] && return 0
    sleep 0.05
  done
  echo "only $(wc -l <"$1") of $2 items arrived"
  cat "$1"
  exit 1
}

sent() { sed -n 's/^{"transfer_id":"\([^"]*\)","mm_hash":"[^"]*","nbytes":[0-9]*,"checksum":"\([0-9a-f]*\)","status":"done".*/\1 \2/p' "$1" | sort; }
received() { sed -n 's/^{"transfer_id":"\([^"]*\)","mm_hash":"[^"]*","nbytes":[0-9]*,"shape":\[[0-9,]*\],"dtype":"[a-z0-9_.]*","checksum":"\([0-9a-f]*\)"}$/\1 \2/p' "$1" | sort; }

run() {
  local tp=$1 transport=$2 sig=${3:-TERM} n=6
  local tag="tp$tp.$transport"
  start_consumer "$tmp/cons.$tag" "$tp" --transport "$transport"
  timeout 60 "$ect" push --to "127.0.0.1:$port" --count "$n" --shape 128x1024 --step 3 \
    --seed "$tp" >"$tmp/push.$tag" 2>"$tmp/push.$tag.err" || { cat "$tmp/push.$tag.err"; exit 1; }
  # the same content again under new transfer ids: answered from the resident copies
  timeout 60 "$ect" push --to "127.0.0.1:$port" --count 2 --shape 128x1024 --seed "$tp" \
    >>"$tmp/push.$tag" 2>>"$tmp/push.$tag.err" || { cat "$tmp/push.$tag.err"; exit 1; }
  wait_lines "$tmp/cons.$tag" $((n + 2))
  stop_consumer "$tmp/cons.$tag" "$sig"
  sent "$tmp/push.$tag" >"$tmp/want.$tag"
  received "$tmp/cons.$tag" >"$tmp/got.$tag"
  [ "$(wc -l <"$tmp/want.$tag")" -eq $((n + 2)) ] || { cat "$tmp/push.$tag"; echo "push lines"; exit 1; }
  if ! diff "$tmp/want.$tag" "$tmp/got.$tag"; then
    echo "checksums differ (tp $tp, $transport)"
    exit 1
  fi
  # the shape and dtype survive the trip
  grep -q '"shape":\[128,1024\],"dtype":"bfloat16"' "$tmp/cons.$tag"
  echo "tp $tp $transport: $((n + 2)) items, checksums equal"
}

# usage errors exit 2 and name the flag
set +e
"$ect" push-consumer --port 14579 2>"$tmp/usage"; rc1=$?
"$ect" push-consumer --host 127.0.0.1 --port 14579 --transport carrier-pigeon 2>>"$tmp/usage"; rc2=$?
"$ect" push-consumer --host 127.0.0.1 --port 65535 --tp 2 2>>"$tmp/usage"; rc3=$?
set -e
[ "$rc1" -eq 2 ] && [ "$rc2" -eq 2 ] && [ "$rc3" -eq 2 ] || { cat "$tmp/usage"; exit 1; }
grep -q -- '--host is required' "$tmp/usage"
grep -q -- '--transport carrier-pigeon' "$tmp/usage"
grep -q 'beyond 65535' "$tmp/usage"

run 1 tcp
run 2 tcp
run 4 tcp INT
run 2 shm
if "$ect" info | grep -q '^  ucx  works'; then run 2 ucx; fi
