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
# keys: a directory that accepts itself, so both sides in one process match
keys=$(mktemp -d)
trap 'rm -rf "$keys"' EXIT
"$ect" keygen "$keys/k" >/dev/null
cp "$keys/k/self.public" "$keys/k/accept/self.public"
for flags in "" "--curve-keys $keys/k"; do
# shellcheck disable=SC2086
out=$("$ect" bench xport --transport tcp,shm --seconds 0.05 --json $flags)
# one compact line: 5 sizes, one 32 x 64 KiB batch (beside one 2 MiB write)
# and one write on a new connection (beside a cached one) per transport;
# every throughput figure a positive number
[ "$(wc -l <<<"$out")" -eq 1 ] || { echo "--json is not one line: $out"; exit 1; }
KEYS="$flags" /usr/bin/python3 -c '
import json, os, sys
text = sys.stdin.read().strip()
rows = json.loads(text)
assert "\": " not in text and ", \"" not in text, "not compact"
assert len(rows) == 14, rows
new = [r for r in rows if r.get("new_conn")]
assert len(new) == 2 and all(r["limit"] == "cached" for r in new), rows
assert all(r.get("keys", False) == bool(os.environ["KEYS"]) for r in new), rows
for r in rows:
    for k in ("transport", "size", "gbps", "limit_gbps", "ratio", "p50_us", "p99_us"):
        assert k in r, (k, r)
    assert r["gbps"] is not None and r["gbps"] > 0, r
batch = [r for r in rows if r.get("batch") == 32]
assert len(batch) == 2 and all(r["limit"] == "1x2MiB" for r in batch), rows
assert any(r["size"] == 4718592 for r in rows), rows
# every row and its limit measured in alternated rounds, at least 3 of each
assert all(r["rounds"] >= 3 and r["limit_rounds"] >= 3 for r in rows), rows
' <<<"$out" || { echo "xport --json $flags: $out"; exit 1; }
done
echo "xport_cli: ok"
