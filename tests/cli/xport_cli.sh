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
[ "$(grep -c '"transport": ' <<<"$out")" -eq 10 ] || { echo "expected 10 rows: $out"; exit 1; }
for k in transport size gbps limit_gbps ratio p50_us p99_us; do
  [ "$(grep -c "\"$k\": " <<<"$out")" -eq 10 ] || { echo "key $k missing: $out"; exit 1; }
done
grep -q '"size": 4718592' <<<"$out"
# Every throughput figure is a positive number.
if grep -Eq '"gbps": (null|0\.000|-)' <<<"$out"; then echo "bad gbps: $out"; exit 1; fi
echo "xport_cli: ok"
