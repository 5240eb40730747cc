#!/usr/bin/env bash
# run-fuzz.sh DIR SECONDS: runs every libFuzzer target fuzz_* in DIR for
# SECONDS each, starting from fuzz/corpus/<name>/ (seeds are not modified;
# new inputs go to a scratch corpus). Any crash, leak or sanitizer report fails.
set -euo pipefail
# libucs (linked when UCX is found) installs its own SIGSEGV/SIGBUS/SIGILL/SIGFPE
# handlers on load; clear them so libFuzzer and the sanitizers see real crashes.
export UCX_ERROR_SIGNALS=
dir=$1
secs=${2:-60}
root=$(cd "$(dirname "$0")/.." && pwd)
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
status=0
for bin in "$dir"/fuzz_*; do
  [ -x "$bin" ] || continue
  name=$(basename "$bin")
  seeds="$root/fuzz/corpus/${name#fuzz_}"
  mkdir -p "$scratch/$name"
  echo "== $name for ${secs}s (seeds: ${seeds#$root/})"
  if ! "$bin" -max_total_time="$secs" -timeout=10 -rss_limit_mb=4096 -print_final_stats=1 \
        -artifact_prefix="$scratch/" "$scratch/$name" "$seeds" >"$scratch/$name.log" 2>&1; then
    tail -n 60 "$scratch/$name.log"
    for a in "$scratch"/crash-* "$scratch"/leak-* "$scratch"/timeout-* "$scratch"/oom-*; do
      [ -e "$a" ] && { echo "artifact: $a"; xxd "$a" | head -20; }
    done
    status=1
  else
    grep -E "^stat::number_of_executed_units|Done [0-9]+ runs" "$scratch/$name.log" | tail -n 2
  fi
done
exit $status
