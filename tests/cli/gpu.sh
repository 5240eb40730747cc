#!/usr/bin/env bash
# GPU memory from the command line. Registered twice:
#   cli_gpu  against the STAND-IN driver (tests/fakecuda via ECT_CUDA_LIBRARY;
#            host memory, not a GPU), on every run of the suite; it also checks
#            the CUDA-absent behaviour (a driver library that does not exist);
#   gpu_cli  against the real driver (label gpu, `make test-gpu`): exit 77
#            (skipped) where CUDA is unavailable, unless ECT_REQUIRE_GPU=1.
# End to end: `ect push --device cuda` (and host items) into `ect push-consumer
# --pool-device cuda` over tcp (bounce ring) and shm (CUDA IPC, TP 2): every item
# arrives with the checksum the producer printed; then a short `ect bench gpu`.
. "$(dirname "$0")/lib.sh"

if [ -n "${ECT_TEST_REAL_GPU:-}" ]; then
  unset ECT_CUDA_LIBRARY
  if ! "$ect" info | grep -q '^cuda: available'; then
    "$ect" info | grep '^cuda:' || true
    if [ -n "${ECT_REQUIRE_GPU:-}" ]; then echo "CUDA is required and unavailable"; exit 1; fi
    echo "no CUDA here: skipped"; exit 77
  fi
else
  : "${ECT_CUDA_LIBRARY:?the stand-in driver}"
  # --- no driver: every GPU option fails with the reason; nothing else changes
  nocuda=/nonexistent/no-such-libcuda.so.1
  ECT_CUDA_LIBRARY=$nocuda "$ect" info >"$tmp/info"
  grep -q "^cuda: unavailable: cannot load the CUDA driver $nocuda" "$tmp/info"
  grep -q '^  tcp  works' "$tmp/info"
  expect_fail() { # expect_fail RC TEXT CMD...: with no driver at all
    ECT_CUDA_LIBRARY=$nocuda expect_exit "$1" "$2" timeout 60 "${@:3}"
  }
  expect_fail 1 'CUDA is unavailable: cannot load' \
    "$ect" push-consumer --host 127.0.0.1 --port 1 --pool-device cuda --count 1
  expect_fail 1 'CUDA is unavailable' "$ect" push --to 127.0.0.1:1 --device cuda --size 4KiB
  expect_fail 1 'CUDA is unavailable' "$ect" bench gpu --seconds 0.02 --sizes 1MiB
  expect_fail 2 'expected cpu, pinned, cuda or cuda:N' \
    "$ect" push-consumer --host 127.0.0.1 --port 1 --pool-device tpu
  expect_fail 2 'expected cpu, cuda or cuda:N' "$ect" push --to 127.0.0.1:1 --device pinned
  expect_fail 2 'pinned' "$ect" push-consumer --host 127.0.0.1 --port 1 --pool-device cuda:x
  "$ect" info | grep -q '^cuda: available: .*fakecuda'
fi
"$ect" push-consumer --help | grep -q -- '--pool-device D'
"$ect" push --help | grep -q -- '--device D'
"$ect" bench gpu --help | grep -q 'goal >= 0.9'

run_e2e() { # run_e2e TP TRANSPORT COUNT SIZE PRODUCER-DEVICE
  local tp=$1 xp=$2 count=$3 size=$4 dev=$5
  rm -f "$tmp/prod.out" "$tmp/prod.err"
  start_consumer "$tmp/cons.out" "$tp" --transport "$xp" --pool-size 64MiB --pool-device cuda \
    --count "$count"
  [ "$(event_field "$tmp/cons.out" ready pool_device)" = cuda ] || { cat "$tmp/cons.out"; exit 1; }
  timeout 120 "$ect" push --to "127.0.0.1:$port" --count "$count" --size "$size" --step 3 \
    --seed 11 --control-timeout 20 --tp "$tp" --transport "$xp" --device "$dev" \
    >"$tmp/prod.out" 2>"$tmp/prod.err" \
    || { echo "ect push failed (tp $tp $xp $dev)"; cat "$tmp/prod.out" "$tmp/prod.err" "$tmp/cons.out.err"; exit 1; }
  wait_exit "$cpid" 60 # --count: it ends by itself once every item arrived
  wait "$cpid" || { cat "$tmp/cons.out.err"; echo "push-consumer failed"; exit 1; }
  [ "$(grep -c '"status":"ok","state":"done"' "$tmp/prod.out")" -eq "$count" ]
  python3 - "$tmp/prod.out" "$tmp/cons.out" <<'EOF'
import json, sys
prod = {d["transfer_id"]: d["checksum"] for d in map(json.loads, open(sys.argv[1]))}
cons = {d["transfer_id"]: d["checksum"] for d in map(json.loads, open(sys.argv[2])) if "event" not in d}
assert prod == cons and len(prod) > 0, (prod, cons)
EOF
  grep -o '"checksum":"[0-9a-f]*"' "$tmp/prod.out" >"$tmp/sums.$tp.$xp.$dev"
}

run_e2e 1 tcp 5 4.5MiB cuda
run_e2e 1 tcp 5 4.5MiB cpu
run_e2e 2 shm 5 4.5MiB cuda
run_e2e 1 shm 3 4.5MiB cpu
# the same seed gives the same bytes wherever they lived
cmp "$tmp/sums.1.tcp.cuda" "$tmp/sums.2.shm.cuda"
cmp "$tmp/sums.1.tcp.cuda" "$tmp/sums.1.tcp.cpu"

# a short `ect bench gpu`: it runs, and prints its rows and goals
timeout 120 "$ect" bench gpu --seconds 0.02 --sizes 1MiB >"$tmp/bench"
grep -q '^tcp gpu pool .*goal >= 0.90' "$tmp/bench"
grep -q '^ipc d2d .*goal >= 0.50' "$tmp/bench"
timeout 120 "$ect" bench gpu --seconds 0.02 --sizes 64KiB --json | python3 -c '
import json, sys
rows = json.load(sys.stdin)
assert {r["case"] for r in rows} >= {"tcp gpu pool", "ipc d2d", "d2d copy"}, rows
'
echo "gpu cli: ok"
