#!/usr/bin/env bash
# Generation 1 across processes: `ect pull-producer` serves synthetic items and
# files; several `ect pull` processes load them at once over tcp and shm and
# must print the checksums the producer printed. Also: an unknown hash fails
# with exit 1, a producer restart is seen, SIGINT/SIGTERM end the producer
# with exit 0. Every background process is killed on exit; waits are bounded (lib.sh).
. "$(dirname "$0")/lib.sh"

# start_producer OUTFILE ARGS...: starts a producer on an ephemeral port pair,
# waits for its ready event, sets $port and $ppid.
start_producer() {
  local out=$1
  shift
  "$ect" pull-producer --host 127.0.0.1 --port 0 --pool-size 64MiB "$@" >"$out" 2>"$out.err" &
  ppid=$!
  pids+=("$ppid")
  wait_event "$out" ready "$ppid" || { cat "$out.err"; echo "producer never served"; exit 1; }
  port=$(event_field "$out" ready port)
  [ -n "$port" ]
}

# stop_producer [SIGNAL]: SIGTERM (or SIGNAL); it must exit 0 within 60 s.
stop_producer() {
  kill -"${1:-TERM}" "$ppid"
  wait_exit "$ppid" 60
  wait "$ppid"
}

# expected checksums: "mm_hash checksum" lines from the producer's output
expect() { sed -n 's/^{"mm_hash":"\([^"]*\)","nbytes":[0-9]*,"checksum":"\([0-9a-f]*\)".*/\1 \2/p' "$1" | sort; }
got() { sed -n 's/^{"mm_hash":"\([^"]*\)","nbytes":[0-9]*,"checksum":"\([0-9a-f]*\)","status":"ok".*/\1 \2/p' "$1" | sort; }

head -c 300000 /dev/urandom >"$tmp/f1"
printf 'hello, encoder cache' >"$tmp/f2"

for transport in tcp shm; do
  start_producer "$tmp/prod.$transport" --transport "$transport" --count 5 --size 1.5MiB
  expect "$tmp/prod.$transport" >"$tmp/want.$transport"
  [ "$(wc -l <"$tmp/want.$transport")" -eq 5 ]
  # three consumers at once: two want everything, one a single item
  one=$(head -1 "$tmp/want.$transport" | cut -d' ' -f1)
  cpids=()
  for i in 1 2; do
    timeout 60 "$ect" pull --from "127.0.0.1:$port" --all --transport "$transport" \
      --pool-size 32MiB >"$tmp/got.$transport.$i" 2>"$tmp/got.$transport.$i.err" &
    cpids+=($!)
  done
  timeout 60 "$ect" pull --from "127.0.0.1:$port" --hash "$one" --transport "$transport" \
    --pool-size 8MiB >"$tmp/got.$transport.3" 2>&1 &
  cpids+=($!)
  for p in "${cpids[@]}"; do wait "$p" || { cat "$tmp"/got.$transport.*; echo "a consumer failed"; exit 1; }; done
  for i in 1 2; do
    diff <(got "$tmp/got.$transport.$i") "$tmp/want.$transport" || { echo "checksums differ ($transport, consumer $i)"; exit 1; }
  done
  diff <(got "$tmp/got.$transport.3") <(grep "^$one " "$tmp/want.$transport")
  # an unknown hash: exit 1, a status naming it
  set +e
  "$ect" pull --from "127.0.0.1:$port" --hash no-such-item --wait 500 --transport "$transport" \
    --pool-size 1MiB >"$tmp/unknown" 2>/dev/null
  rc=$?
  set -e
  [ $rc -eq 1 ] || { echo "unknown hash gave exit $rc"; exit 1; }
  grep -q '"status":"error: no-such-item is not available' "$tmp/unknown"
  stop_producer TERM
done

# files, then a restart on the same port with other items
start_producer "$tmp/prod.files" --file "$tmp/f1" --file "$tmp/f2"
expect "$tmp/prod.files" >"$tmp/want.files"
[ "$(wc -l <"$tmp/want.files")" -eq 2 ]
timeout 60 "$ect" pull --from "127.0.0.1:$port" --all --pool-size 8MiB >"$tmp/got.files"
diff <(got "$tmp/got.files") "$tmp/want.files"
# both files arrived whole: their sizes as the file system tells them
for f in f1 f2; do
  n=$(stat -c %s "$tmp/$f")
  grep -q "\"nbytes\":$n,.*\"status\":\"ok\"" "$tmp/got.files" || { echo "$f: no ok item of $n bytes"; exit 1; }
done
old_port=$port
stop_producer INT
"$ect" pull-producer --host 127.0.0.1 --port "$old_port" --count 1 --size 4KiB \
  >"$tmp/prod.again" 2>/dev/null &
ppid=$!
pids+=("$ppid")
wait_event "$tmp/prod.again" ready "$ppid" || { echo "the restarted producer never served"; exit 1; }
expect "$tmp/prod.again" >"$tmp/want.again"
timeout 60 "$ect" pull --from "127.0.0.1:$old_port" --all --pool-size 1MiB >"$tmp/got.again"
diff <(got "$tmp/got.again") "$tmp/want.again"
stop_producer TERM
echo "pull_e2e: ok"
