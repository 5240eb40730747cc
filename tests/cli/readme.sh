#!/usr/bin/env bash
# Runs the README's opening commands exactly as written (each line of its first
# ```sh block: `make demo`, `make test`) in a fresh copy of the files git
# tracks (their working-tree contents), so what a newcomer types works.
#
# Recursion guard: the nested `make test` would run this test again, so it
# exports ECT_README_TEST=1 and this script skips itself (exit 0) when it sees
# it. Run time: the nested `make test` gets CTEST_ARGS (honoured by the
# Makefile) excluding this test, the unit test programs (test_*), the
# benchmark smoke tests (cli_demo_bench, py_goal_bounds) and the longer Python suites (py_binding
# stays: the package imports from the fresh copy) — the outer suite runs those — so the
# whole check is a full build, the full default demo and every other CLI test
# (a few minutes on 2 cores); set ECT_README_FULL=1 to run the nested suite
# unfiltered.
. "$(dirname "$0")/lib.sh"
if [ "${ECT_README_TEST:-}" = 1 ]; then
  echo "readme: nested inside the README's own make test: skipped"
  exit 0
fi
src=${ECT_SOURCE_DIR:?}
# The README's commands build and test the plain build (build/), whatever
# suite this is; under a sanitizer suite (make test-asan) that repeats the
# plain suite's run for minutes, so only the plain suite runs it.
if "$ect" info | grep -q 'sanitize='; then
  echo "readme: sanitizer build: skipped (the plain suite runs the README's commands)"
  exit 0
fi

# the first fenced block of the README, verbatim
awk '/^```/ { if (inb) exit; inb = 1; next } inb' "$src/README.md" >"$tmp/commands"
grep -qx 'make demo *#.*\|make demo' "$tmp/commands" || { cat "$tmp/commands"; echo "no make demo"; exit 1; }
grep -qx 'make test *#.*\|make test' "$tmp/commands" || { cat "$tmp/commands"; echo "no make test"; exit 1; }

mkdir "$tmp/src"
git -C "$src" ls-files -z | (cd "$src" && xargs -0 sh -c 'for f; do [ -e "$f" ] && printf "%s\0" "$f"; done' _) |
  tar -C "$src" --null -T - -cf - | tar -C "$tmp/src" -xf -
[ -f "$tmp/src/Makefile" ] || { echo "copy failed"; exit 1; }

export ECT_README_TEST=1
if [ "${ECT_README_FULL:-}" != 1 ]; then
  # make imports CTEST_ARGS as a recursively expanded variable: a lone `$)`
  # would be make's (empty) variable `)`, leaving an unbalanced regex that
  # excludes nothing, so the anchor is written `$$` for make.
  export CTEST_ARGS='-E '\''^(cli_readme|cli_demo_bench|test_|py_(push|pull|vllm|cuda|goal_bounds)$$)'\'
fi
n=0
while IFS= read -r line; do
  [ -z "${line// }" ] && continue
  n=$((n + 1))
  echo "readme: \$ $line"
  if ! (cd "$tmp/src" && bash -c "$line") >"$tmp/out.$n" 2>&1; then
    tail -50 "$tmp/out.$n"
    echo "readme: '$line' failed"
    exit 1
  fi
  tail -12 "$tmp/out.$n"
done <"$tmp/commands"
# make demo ran the real demo, and it verified everything
grep -q '^  failures    0$' "$tmp/out.1" || { cat "$tmp/out.1"; echo "make demo: no clean report"; exit 1; }
grep -q 'tests passed' "$tmp/out.2" || { echo "make test: no ctest summary"; exit 1; }
echo "readme: $n commands ran as written"
