#!/usr/bin/env bash
# The README's embedding examples (examples/*.c, one per role) compile against
# this build's header and library with -Wall -Wextra -Werror, and run end to
# end in pairs of processes: push_producer -> push_consumer (consumer shard +
# scheduler) and pull_producer -> pull_consumer; the checksum each consumer
# computed over the bytes it received must equal the producer's.
. "$(dirname "$0")/lib.sh"
: "${ECT_BUILD_DIR:?}" "${ECT_SOURCE_DIR:?}"
san=""
case "$("$ect" info | sed -n 's/.*sanitize=\([a-z]*\).*/\1/p')" in
  address) san="-fsanitize=address,undefined" ;;
  thread) san="-fsanitize=thread" ;;
esac
for f in "$ECT_SOURCE_DIR"/examples/*.c; do
  n=$(basename "$f" .c)
  cc -std=c11 -Wall -Wextra -Werror $san -I"$ECT_SOURCE_DIR/include" "$f" -o "$tmp/$n" \
    -L"$ECT_BUILD_DIR" -lectransfer -Wl,-rpath,"$ECT_BUILD_DIR"
done
for n in push_producer push_consumer pull_producer pull_consumer; do
  [ -x "$tmp/$n" ] || { echo "examples/$n.c missing"; exit 1; }
done

# push: consumer (shard + scheduler) on a free port, then the producer
for _ in 1 2 3 4 5; do
  port=$(free_port 1)
  "$tmp/push_consumer" "$port" 1 >"$tmp/pc.out" 2>"$tmp/pc.err" &
  pids+=($!)
  for _ in $(seq 1200); do
    grep -q ready "$tmp/pc.out" 2>/dev/null && break
    kill -0 "${pids[-1]}" 2>/dev/null || break
    sleep 0.05
  done
  grep -q ready "$tmp/pc.out" && break
done
grep -q ready "$tmp/pc.out" || { cat "$tmp/pc.err"; echo "push_consumer did not start"; exit 1; }
timeout 60 "$tmp/push_producer" "127.0.0.1:$port" >"$tmp/pp.out" || { cat "$tmp/pp.out"; exit 1; }
timeout 30 tail --pid="${pids[-1]}" -f /dev/null
wait "${pids[-1]}" || { cat "$tmp/pc.err"; echo "push_consumer failed"; exit 1; }
sent=$(sed -n 's/^example-req-1 done checksum \([0-9a-f]*\) .*/\1/p' "$tmp/pp.out")
got=$(sed -n 's/^example-req-1 4718592 bytes checksum \([0-9a-f]*\)$/\1/p' "$tmp/pc.out")
[ -n "$sent" ] && [ "$sent" = "$got" ] || { cat "$tmp/pp.out" "$tmp/pc.out"; echo "push checksums differ"; exit 1; }
echo "push example: 4.5 MiB, checksum $got on both sides"

# pull: the producer serves for 20 s at most; the consumer pulls its item
"$tmp/pull_producer" 20 >"$tmp/lp.out" 2>"$tmp/lp.err" &
pids+=($!)
for _ in $(seq 1200); do grep -q '^port' "$tmp/lp.out" && break; sleep 0.05; done
read -r _ p _ h _ sum <"$tmp/lp.out" || { cat "$tmp/lp.err"; echo "pull_producer did not start"; exit 1; }
timeout 60 "$tmp/pull_consumer" "127.0.0.1:$p" "$h" >"$tmp/lc.out" || { cat "$tmp/lc.out"; exit 1; }
grep -qx "$h 4718592 bytes bfloat16 checksum $sum" "$tmp/lc.out" || { cat "$tmp/lc.out"; echo "pull checksum differs from $sum"; exit 1; }
echo "pull example: 4.5 MiB, checksum $sum on both sides"
