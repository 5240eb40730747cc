#!/usr/bin/env bash
# layers.sh SRC "LAYER..." — the layering rule of src/, checked over the
# sources: a file of a layer includes (with quotes) only headers of its own
# layer and the layers listed before it, plus "ectransfer.h" and the
# generated "ect_config.h"; the command line (src/cli) includes only its own
# headers and "ectransfer.h" (it is a user of the public library). Any other
# quoted include, a "../" path among them, is a violation: each is printed as
# FILE:LINE: reason, and the exit status is 1.
#
# layers.sh --self-test SRC "LAYER...": the rule passes on SRC, and fails on
# scratch copies of it with one upward include planted (in the lowest layer,
# in a middle one, in the CLI, and as a "../" path), naming the file.
set -euo pipefail

check() { # check SRC "LAYER..."
  local src=$1 order=$2 bad=0 rank=0 layer f
  declare -A idx
  for layer in $order; do idx[$layer]=$rank; rank=$((rank + 1)); done
  idx[cli]=$rank
  for layer in $order cli; do
    [ -d "$src/$layer" ] || { echo "$src/$layer: no such layer folder"; bad=1; continue; }
    for f in "$src/$layer"/*.c "$src/$layer"/*.h "$src/$layer"/*.in; do
      [ -e "$f" ] || continue
      while IFS=: read -r line inc; do
        local why=""
        case "$inc" in
          ectransfer.h) ;;
          ect_config.h) [ "$layer" = cli ] && why="the CLI reads the build's settings through ect_build_info()" ;;
          */*)
            local top=${inc%%/*}
            if [ "$top" = .. ] || [ "$top" = . ]; then
              why="relative path"
            elif [ -z "${idx[$top]+x}" ]; then
              why="'$top' is not a layer"
            elif [ "$layer" = cli ] && [ "$top" != cli ]; then
              why="the CLI uses the public library only (ectransfer.h)"
            elif [ "${idx[$top]}" -gt "${idx[$layer]}" ]; then
              why="layer '$layer' includes a header of '$top', a layer above it"
            fi
            ;;
          *) why="not LAYER/header.h" ;;
        esac
        if [ -n "$why" ]; then
          echo "${f#"$src"/}:$line: #include \"$inc\": $why"
          bad=1
        fi
      done < <(grep -n '^[[:space:]]*#[[:space:]]*include[[:space:]]*"' "$f" |
               sed 's/^\([0-9]*\):[^"]*"\([^"]*\)".*/\1:\2/')
    done
  done
  return $bad
}

if [ "${1:-}" = --self-test ]; then
  src=$2 order=$3
  check "$src" "$order" || { echo "layers: the tree itself fails the rule"; exit 1; }
  set -- $order
  lowest=$1 top=${!#}
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  plant() { # plant FILE LINE WANT: a copy of SRC with LINE added to FILE must fail naming FILE
    rm -rf "$tmp/src"
    cp -r "$src" "$tmp/src"
    printf '%s\n' "$2" >>"$tmp/src/$1"
    local out rc=0
    out=$(check "$tmp/src" "$order") || rc=$?
    [ "$rc" -ne 0 ] || { echo "layers: '$2' in $1 was not caught"; exit 1; }
    grep -q "^$1:[0-9]*: .*$3" <<<"$out" || { echo "layers: '$2' in $1 reported as: $out"; exit 1; }
  }
  f=$(cd "$src/$lowest" && ls *.c | head -1)
  plant "$lowest/$f" "#include \"$top/x.h\"" "a layer above it"
  f=$(cd "$src/xport" && ls *.c | head -1)
  plant "xport/$f" '#include "push/producer.h"' "a layer above it"
  plant "xport/$f" '#include "../push/producer.h"' "relative path"
  f=$(cd "$src/cli" && ls *.c | head -1)
  plant "cli/$f" "#include \"$lowest/x.h\"" "public library only"
  plant "cli/$f" '#include "ect_config.h"' "ect_build_info"
  echo "layers: the rule holds over $src, and each planted violation is caught"
  exit 0
fi
check "$1" "$2"
