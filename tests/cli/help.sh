#!/usr/bin/env bash
# Every command answers --help on stdout with exit 0; a bad command or flag
# gets exit 2 and a message on stderr saying what is accepted.
set -euo pipefail
ect=${ECT_BIN:?}
out=$("$ect" --help); grep -q '^usage: ect COMMAND' <<<"$out"
cmds=$(awk '/^commands:/{f=1;next} f&&/^  [a-z]/{print $1}' <<<"$out")
[ -n "$cmds" ]
for c in $cmds; do
  "$ect" "$c" --help | grep -q "^usage: ect $c" || { echo "ect $c --help is wrong"; exit 1; }
done
# A bad flag to any command: exit 2, and the message says what is accepted.
for c in $cmds; do
  set +e
  err=$("$ect" "$c" --definitely-bogus 2>&1 >/dev/null); rc=$?
  set -e
  [ $rc -eq 2 ] || { echo "ect $c --definitely-bogus exited $rc, not 2"; exit 1; }
  grep -q "accepted" <<<"$err" || { echo "ect $c: bad-flag message lists nothing accepted: $err"; exit 1; }
done
set +e
err=$("$ect" nosuchcommand 2>&1 >/dev/null); rc=$?
set -e
[ $rc -eq 2 ] && grep -q "unknown command 'nosuchcommand'" <<<"$err"
set +e
err=$("$ect" info --bogus 2>&1 >/dev/null); rc=$?
set -e
[ $rc -eq 2 ] && grep -q "try 'ect info --help'" <<<"$err"
"$ect" info | grep -q '^ectransfer '
echo "help: ok"
