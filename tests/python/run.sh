#!/usr/bin/env bash
# run.sh [PYTEST ARGS...]: runs the Python tests (pytest) against a build tree.
# The interpreter: $ECT_PYTHON if set (e.g. the venv python3 with torch on a GPU
# machine; it must import pytest), else /usr/bin/python3 (Debian's torch, numpy and
# pytest live there), else the python3 on PATH, whichever first imports pytest. Exit
# 77 (ctest: skipped) when none does. The library: $ECT_LIBRARY, else $ECT_BUILD_DIR/libectransfer.so.
# ECT_PY_GPU=1 (the `gpu` label's gpu_python): the interpreter's torch must see a CUDA
# device, else exit 77, or 1 under ECT_REQUIRE_GPU=1 (make test-gpu: a GPU is required).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
src=${ECT_SOURCE_DIR:-$(cd "$here/../.." && pwd)}
build=${ECT_BUILD_DIR:-$src/build}
[ -d "$build" ] && build=$(cd "$build" && pwd)
py=""
if [ -n "${ECT_PYTHON:-}" ]; then
  # an explicit choice is the only one tried (a GPU machine's venv: no silent fallback
  # to an interpreter whose torch has no CUDA)
  if ! "$ECT_PYTHON" -c "import pytest" >/dev/null 2>&1; then
    echo "run.sh: ECT_PYTHON=$ECT_PYTHON cannot import pytest" >&2
    exit 1
  fi
  py=$ECT_PYTHON
fi
for cand in /usr/bin/python3 python3; do
  [ -n "$py" ] && break
  if command -v "$cand" >/dev/null 2>&1 && "$cand" -c "import pytest" >/dev/null 2>&1; then
    py=$cand
  fi
done
require=${ECT_REQUIRE_GPU:-0}
[ "${ECT_PY_GPU:-0}" = 1 ] || require=0
if [ -z "$py" ]; then
  if [ "$require" = 1 ]; then
    echo "run.sh: ECT_REQUIRE_GPU=1 and no Python interpreter with pytest (set ECT_PYTHON)" >&2
    exit 1
  fi
  echo "run.sh: no Python interpreter with pytest (set ECT_PYTHON); skipping" >&2
  exit 77
fi
if [ "${ECT_PY_GPU:-0}" = 1 ] &&
   ! "$py" -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)" >/dev/null 2>&1; then
  if [ "$require" = 1 ]; then
    echo "run.sh: ECT_REQUIRE_GPU=1 but $py has no torch that sees a CUDA device (set ECT_PYTHON)" >&2
    exit 1
  fi
  echo "run.sh: $py has no torch that sees a CUDA device; skipping" >&2
  exit 77
fi
export ECT_LIBRARY=${ECT_LIBRARY:-$build/libectransfer.so}
case $ECT_LIBRARY in /*) ;; */*) ECT_LIBRARY=$PWD/$ECT_LIBRARY ;; esac
export PYTHONPATH="$src/python${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONDONTWRITEBYTECODE=1
cd "$here"
exec "$py" -m pytest -q -p no:cacheprovider -rs "$@"
