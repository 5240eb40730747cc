#!/usr/bin/env bash
# Generation 2 across processes: `ect push-consumer` with TP = 1, 2 and 4 (tcp)
# and TP = 2 (shm) receives what `ect push` sends; every item's checksum the
# consumer prints must equal the one the producer printed, a repeated push of
# the same content is answered from the resident copy, and after SIGTERM the
# consumer exits 0 reporting 0 live reservations and 0 bytes in use per rank.
# Every background process is killed on exit; waits are bounded (lib.sh).
. "$(dirname "$0")/lib.sh"

sent() { sed -n 's/^{"transfer_id":"\([^"]*\)","mm_hash":"[^"]*","nbytes":[0-9]*,"checksum":"\([0-9a-f]*\)","status":"ok","state":"done".*/\1 \2/p' "$1" | sort; }
received() { sed -n 's/^{"transfer_id":"\([^"]*\)","mm_hash":"[^"]*","nbytes":[0-9]*,"shape":\[[0-9,]*\],"dtype":"[a-z0-9_.]*","checksum":"\([0-9a-f]*\)","status":"ok"}$/\1 \2/p' "$1" | sort; }

run() {
  local tp=$1 transport=$2 sig=${3:-TERM} n=6
  local tag="tp$tp.$transport"
  start_consumer "$tmp/cons.$tag" "$tp" --pool-size 32MiB --transport "$transport"
  timeout 60 "$ect" push --to "127.0.0.1:$port" --count "$n" --shape 128x1024 --step 3 \
    --seed "$tp" >"$tmp/push.$tag" 2>"$tmp/push.$tag.err" || { cat "$tmp/push.$tag.err"; exit 1; }
  # the same content again under new transfer ids: answered from the resident copies
  timeout 60 "$ect" push --to "127.0.0.1:$port" --count 2 --shape 128x1024 --seed "$tp" \
    >>"$tmp/push.$tag" 2>>"$tmp/push.$tag.err" || { cat "$tmp/push.$tag.err"; exit 1; }
  wait_items "$tmp/cons.$tag" $((n + 2))
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
expect_exit 2 '--host is required' "$ect" push-consumer --port 14579
expect_exit 2 '--transport carrier-pigeon' \
  "$ect" push-consumer --host 127.0.0.1 --port 14579 --transport carrier-pigeon
expect_exit 2 'beyond 65535' "$ect" push-consumer --host 127.0.0.1 --port 65535 --tp 2

# --keep-resident: a push of content the consumer holds resident is answered
# `cached` (nothing written: transport ""); with --keep-resident 0 every
# resident copy is evicted once its item is printed, so the same content is
# written again. The consumer prints a round's lines after releasing and
# trimming, so once they are out the second push finds the cache as it is.
repeat_push() {
  local tag=$1
  shift
  start_consumer "$tmp/cons.$tag" 1 --pool-size 32MiB "$@"
  for round in 1 2; do
    timeout 60 "$ect" push --to "127.0.0.1:$port" --count 2 --shape 128x1024 --seed 9 \
      >"$tmp/push.$tag.$round" 2>"$tmp/push.$tag.err" || { cat "$tmp/push.$tag.err"; exit 1; }
    wait_items "$tmp/cons.$tag" $((2 * round))
  done
  stop_consumer "$tmp/cons.$tag"
}
repeat_push keep
[ "$(grep -c '"state":"done".*"transport":"",' "$tmp/push.keep.2")" -eq 2 ] ||
  { cat "$tmp/push.keep.2"; echo "the repeat was not answered cached"; exit 1; }
repeat_push nokeep --keep-resident 0
[ "$(grep -c '"state":"done".*"transport":"tcp",' "$tmp/push.nokeep.2")" -eq 2 ] ||
  { cat "$tmp/push.nokeep.2"; echo "--keep-resident 0 kept a resident copy"; exit 1; }
expect_exit 2 "--keep-resident" "$ect" push-consumer --host 127.0.0.1 --port 14579 --keep-resident x
echo "--keep-resident: cached with the default, written again with 0"

run 1 tcp
run 2 tcp
run 4 tcp INT
run 2 shm
if "$ect" info | grep -q '^  ucx  works'; then run 2 ucx; fi
