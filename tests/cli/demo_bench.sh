#!/usr/bin/env bash
# `ect bench --json --quick`: every benchmark runs and contributes rows to ONE
# list, each row with a positive value and limit and the ratio between them,
# printed unrounded so the ratio is checked exactly (a check against rounded
# values failed on a slow machine: 0.011 / 0.062 is not 0.184); the table
# form has a header and the same rows; a bad flag exits 2 and says what is
# accepted.
. "$(dirname "$0")/lib.sh"
timeout 240 "$ect" bench --json --quick >"$tmp/rows.json" 2>"$tmp/err" || { cat "$tmp/err"; exit 1; }
python3 - "$tmp/rows.json" <<'PY'
import json, math, sys
rows = json.load(open(sys.argv[1]))
assert isinstance(rows, list) and rows, "no rows"
benches = {r["bench"] for r in rows}
assert benches == {"push", "pull", "xport", "alloc"}, benches
for r in rows:
    for k in ("bench", "case", "value", "unit", "limit", "limit_value", "ratio", "p50_ms"):
        assert k in r, (k, r)
    assert r["value"] > 0 and r["limit_value"] > 0, r
    # the ratio is value / limit as the benchmark measured them (unrounded:
    # the same division, so equal up to the last bit or two of a double)
    assert math.isclose(r["ratio"], r["value"] / r["limit_value"], rel_tol=1e-12), r
    assert (r["p50_ms"] is None) == (r["bench"] == "alloc"), r
print(len(rows), "rows from", sorted(benches))
PY
expect_exit 2 'accepted: --json, --quick' "$ect" bench --fast
expect_exit 2 'accepted: push, pull, xport, alloc' "$ect" bench nosuch
"$ect" bench --help | grep -q -- '--quick'
echo "bench: one list, every benchmark, ratios consistent"
