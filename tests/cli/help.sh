#!/usr/bin/env bash
# Every command answers --help on stdout with exit 0; a bad command or flag
# gets exit 2 and a message on stderr saying what is accepted.
. "$(dirname "$0")/lib.sh"
out=$("$ect" --help); grep -q '^usage: ect COMMAND' <<<"$out"
cmds=$(awk '/^commands:/{f=1;next} f&&/^  [a-z]/{print $1}' <<<"$out")
[ -n "$cmds" ]
for c in $cmds; do
  "$ect" "$c" --help | grep -q "^usage: ect $c" || { echo "ect $c --help is wrong"; exit 1; }
done
# A bad flag to any command: exit 2, and the message says what is accepted.
for c in $cmds; do expect_exit 2 accepted "$ect" "$c" --definitely-bogus; done
expect_exit 2 "unknown command 'nosuchcommand'" "$ect" nosuchcommand
expect_exit 2 "try 'ect info --help'" "$ect" info --bogus
"$ect" info | grep -q '^ectransfer '
# ect info --json: one compact JSON object; each transport's status word is "ok" or why
"$ect" info --json >"$tmp/info.json"
[ "$(wc -l <"$tmp/info.json")" -eq 1 ]
/usr/bin/python3 - "$tmp/info.json" <<'EOF2'
import json, sys
text = open(sys.argv[1]).read().strip()
o = json.loads(text)
assert text == json.dumps(o, separators=(",", ":")), "not compact"
assert o["transports"]["tcp"] == "ok", o["transports"]
assert isinstance(o["cuda"]["status"], str) and o["cuda"]["status"]
assert o["defaults"]["push_consumer"]["ec_port"] == 14579
EOF2
# Durations take units; a bare number keeps the flag's unit; errors name command and flag
expect_exit 2 "ect push-consumer: --ttl: '5x' is not a duration" \
  "$ect" push-consumer --host 127.0.0.1 --port 14579 --ttl 5x
expect_exit 2 "bare number is seconds" "$ect" push-consumer --host 127.0.0.1 --port 14579 --ttl 5x
expect_exit 2 "ect pull: --timeout: '2h' is outside" "$ect" pull --from 127.0.0.1:9 --all --timeout 2h
expect_exit 2 "ect push: --timeout: 'soon' is not a duration" "$ect" push --to 127.0.0.1:9 --timeout soon
expect_exit 2 "ect demo: --timeout: '0' is outside" "$ect" demo --timeout 0
expect_exit 2 "ect bench xport: --seconds: '2m' is outside" "$ect" bench xport --seconds 2m
expect_exit 2 "ect bench alloc: --ms: 'x' is not a duration" "$ect" bench alloc --ms x
expect_exit 2 "ect push-consumer: --pool-size: 'lots' is not a size" \
  "$ect" push-consumer --host 127.0.0.1 --port 14579 --pool-size lots
expect_exit 2 "ect pull-producer: --count: 'x' is not an integer" "$ect" pull-producer --count x
expect_exit 2 "ect pull-producer: --max-lanes-per-peer: '0' is not an integer" \
  "$ect" pull-producer --max-lanes-per-peer 0
expect_exit 1 "connect_allow: 'bad.host' is not an IP address" \
  "$ect" pull-producer --port 0 --connect-allow bad.host
# every --help that takes a duration says what a bare number means
for c in push-consumer push pull demo; do
  "$ect" "$c" --help | grep -q 'bare: \(seconds\|milliseconds\)' || { echo "ect $c --help: bare unit"; exit 1; }
done
echo "help: ok"
