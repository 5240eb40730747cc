#!/usr/bin/env bash
# Every `ect demo` variant — push over tcp and shm at TP 1, 2 and 4, pull over
# tcp and shm — with two CPU-burning processes beside it (started and stopped
# here): each must move and verify every item with 0 failed. 80 LLaVA-size
# items (4.5 MiB) are twice what the demo's consumer pool holds: when the load
# slows the consumer's engine enough, the producer waits for room (counted as
# retried) instead of failing. Labelled `soak`; part of `make test`.
. "$(dirname "$0")/lib.sh"
start_burners 2

n=80
run() { # NAME ARGS...
  local name=$1; shift
  if ! timeout 600 "$ect" demo --items $n "$@" >"$tmp/$name" 2>"$tmp/$name.err"; then
    cat "$tmp/$name" "$tmp/$name.err"; echo "demo $name failed under load"; exit 1
  fi
  grep -Eq "^  items       $n moved, $n verified \\(checksums equal end to end\\), [0-9]+ retried, 0 failed$" "$tmp/$name" ||
    { cat "$tmp/$name"; echo "$name: not every item moved and verified"; exit 1; }
  grep -q '^  failures    0$' "$tmp/$name" || { cat "$tmp/$name"; exit 1; }
  echo "$name: $(sed -n 's/^  items       //p' "$tmp/$name")"
}
for xp in tcp shm; do
  for tp in 1 2 4; do run "push_${xp}_tp$tp" --transport $xp --tp $tp; done
  run "pull_$xp" --protocol pull --transport $xp
done
for p in "${burners[@]}"; do kill -0 "$p" || { echo "a burner died: the load was not there"; exit 1; }; done
echo "demo_load: every variant passed beside two CPU burners"
