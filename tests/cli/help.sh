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
echo "help: ok"
