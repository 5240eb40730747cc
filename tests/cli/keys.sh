#!/usr/bin/env bash
# Authentication from the command line (docs/SECURITY.md, README "Turning
# authentication on"): `ect keygen` makes key directories; a push consumer
# run with --curve-keys answers `ect push` / `ect status` holding an accepted
# key, and refuses one without keys or with an unknown key (exit 1, a clear
# error, nothing moved); a bad key directory fails at once naming it. Then
# `ect demo --keys` (both protocols) passes with keys on, and a plain-mode
# consumer still serves an upstream-style plain push and status.
. "$(dirname "$0")/lib.sh"

k=$tmp/keys
mkdir -p "$k"
"$ect" keygen "$k/cons" >/dev/null
"$ect" keygen "$k/prod" >/dev/null
"$ect" keygen "$k/stranger" >/dev/null
cp "$k/prod/self.public" "$k/cons/accept/prod.public"
cp "$k/cons/self.public" "$k/prod/accept/cons.public"
cp "$k/cons/self.public" "$k/stranger/accept/cons.public"

for cmd in push-consumer push pull-producer pull status; do
  "$ect" "$cmd" --help | grep -q -- '--curve-keys DIR'
done
"$ect" demo --help | grep -q -- '--keys'

# a key directory that does not load fails the open with the loader's words
expect_exit 1 "$tmp/nope" "$ect" push-consumer --host 127.0.0.1 --port "$(free_port 1)" \
  --curve-keys "$tmp/nope"

start_consumer "$tmp/cons" 1 --pool-size 8MiB --curve-keys "$k/cons"
# accepted: status answers, a push moves its items
"$ect" status "127.0.0.1:$port" --curve-keys "$k/prod" >"$tmp/table"
grep -q "^shard        0 of 1 at 127.0.0.1:$port" "$tmp/table"
timeout 120 "$ect" push --to "127.0.0.1:$port" --count 3 --size 64KiB --curve-keys "$k/prod" \
  >"$tmp/push.out" 2>"$tmp/push.err" || { cat "$tmp/push.err"; echo "keyed push failed"; exit 1; }
wait_items "$tmp/cons" 3
# an unknown key and no key: refused, nothing moved
expect_exit 1 "refused our CurveZMQ key" "$ect" status "127.0.0.1:$port" --timeout 30 \
  --curve-keys "$k/stranger"
expect_exit 1 "no consumer answers" "$ect" status "127.0.0.1:$port" --timeout 30
rc=0
timeout 120 "$ect" push --to "127.0.0.1:$port" --count 1 --size 64KiB --timeout 20s \
  --curve-keys "$k/stranger" >"$tmp/bad.out" 2>"$tmp/bad.err" || rc=$?
[ "$rc" -ne 0 ] || { echo "push with an unknown key succeeded"; exit 1; }
grep -q "refused our CurveZMQ key" "$tmp/bad.err" || { cat "$tmp/bad.err"; exit 1; }
[ "$(count_items "$tmp/cons")" -eq 3 ] || { echo "an item arrived from an unknown key"; exit 1; }
grep -q "refused a CURVE client" "$tmp/cons.err" || { cat "$tmp/cons.err"; exit 1; }
stop_consumer "$tmp/cons"

# the demo with keys on, both protocols
timeout 300 "$ect" demo --keys --items 50 --shape 64x256 >"$tmp/demo.out" 2>&1 ||
  { cat "$tmp/demo.out"; echo "demo --keys (push) failed"; exit 1; }
grep -q "CurveZMQ on" "$tmp/demo.out"
grep -q "50 verified" "$tmp/demo.out"
timeout 300 "$ect" demo --keys --protocol pull --items 50 --shape 64x256 >"$tmp/demo2.out" 2>&1 ||
  { cat "$tmp/demo2.out"; echo "demo --keys (pull) failed"; exit 1; }
grep -q "50 verified" "$tmp/demo2.out"
echo "keys: ok"
