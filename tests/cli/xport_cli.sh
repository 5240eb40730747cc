#!/usr/bin/env bash
# ect info tries each compiled-in transport with a 1-byte loopback write;
# ect bench xport prints its rows (JSON keys checked) and rejects bad flags.
. "$(dirname "$0")/lib.sh"
info=$("$ect" info)
grep -Eq '^  tcp  works$' <<<"$info" || { echo "tcp does not work: $info"; exit 1; }
grep -Eq '^  shm  works$' <<<"$info" || { echo "shm does not work: $info"; exit 1; }
if grep -q 'compiled in: .*ucx' <<<"$info"; then
  grep -Eq '^  ucx  (works|fails: .+)$' <<<"$info" || { echo "no ucx line: $info"; exit 1; }
fi
"$ect" bench xport --help | grep -q '^usage: ect bench xport'
expect_exit 2 'not tcp, shm or ucx' "$ect" bench xport --transport carrier
expect_exit 2 '--seconds' "$ect" bench xport --seconds 0
out=$("$ect" bench xport --transport tcp,shm --seconds 0.05 --json)
# 5 sizes and one 32 x 64 KiB batch (beside one 2 MiB write) per transport
[ "$(grep -c '"transport": ' <<<"$out")" -eq 12 ] || { echo "expected 12 rows: $out"; exit 1; }
for k in transport size gbps limit_gbps ratio p50_us p99_us; do
  [ "$(grep -c "\"$k\": " <<<"$out")" -eq 12 ] || { echo "key $k missing: $out"; exit 1; }
done
[ "$(grep -c '"batch": 32, .*"limit": "1x2MiB"' <<<"$out")" -eq 2 ] || { echo "no batch rows: $out"; exit 1; }
grep -q '"size": 4718592' <<<"$out"
# Every throughput figure is a positive number.
if grep -Eq '"gbps": (null|0\.000|-)' <<<"$out"; then echo "bad gbps: $out"; exit 1; fi
echo "xport_cli: ok"
