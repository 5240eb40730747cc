#!/usr/bin/env bash
# gpu-check — the whole GPU verification (C and Python) as ONE run on a GPU machine.
# Device time is short: the run stays inside a total budget (GPU_CHECK_BUDGET, default
# 270 s), every step has its own timeout within it, and the summary always prints.
#
#   bash scripts/gpu-check.sh [OUTDIR]      (default $OUT, else ./gpu-check-out)
#
# It may run from a copy of the tree in a subfolder (cd .gpuX && bash
# scripts/gpu-check.sh $OUT). The packed Debian libraries (.devdeps, see
# /work/shared/tools/device-deps.sh) are sourced from .devdeps/env.sh or
# ../.devdeps/env.sh when present. The Python interpreter is $ECT_PYTHON, else the
# python3 first on PATH (a venv with torch + CUDA + pytest; /usr/bin/python3 may have
# no torch), resolved before the packed libraries change PATH.
#
# Steps (log file in brackets; at most 5 logs + summary.txt under OUTDIR):
#   env          [env]      nvidia-smi; the interpreter: torch, its CUDA, numpy, pytest
#   build        [build]    cmake -B build-gpu (RelWithDebInfo), only what the checks use
#   info         [env]      ect info says "cuda: available" (the library loads the driver)
#   test-gpu     [test-gpu] ECT_REQUIRE_GPU=1 ctest -L gpu (what `make test-gpu` runs):
#                           gpu_e2e (C, device pools and items, tcp + shm/IPC, bit-exact),
#                           gpu_cli (the CLI with --pool-device cuda), gpu_python
#                           (tests/python/test_cuda.py: CUDA tensors pushed from the device,
#                           GPU pools with zero-copy CUDA views, pull, the vLLM connector
#                           core loading straight into the encoder cache); a missing GPU or
#                           a torch without CUDA fails here, never skips
#   fake         [test-gpu] (only with GPU_CHECK_FAKE=1) the stand-in driver's C tests too
#   bench        [bench]    ect bench gpu (device pool over tcp and shm/IPC, 4.5 and 64 MiB,
#                           beside pinned h2d and d2d copies in the same run)
#   bench-python [bench]    scripts/bench-python.py: Python push of host tensors (tcp), of
#                           CUDA tensors (tcp, host pool) and of CUDA tensors into a GPU
#                           pool over shm, each beside the C producer in the same run
#   torch        [bench]    torch's own pinned h2d and d2d copy figures (cross-check)
#   python       [python]   the binding's suites on this interpreter's torch (push, pull,
#                           connector, binding, vLLM replay across processes); last, as the
#                           CPU suite in CI covers these paths already
# Exit status 0 only if every step passed.
set -uo pipefail
out=${1:-${OUT:-$PWD/gpu-check-out}}
mkdir -p "$out" && out=$(cd "$out" && pwd)
py=${ECT_PYTHON:-$(command -v python3 || echo python3)}
cd "$(dirname "$0")/.."
summary=$out/summary.txt
: >"$summary"
budget=${GPU_CHECK_BUDGET:-270}
start=$(date +%s)
note() { echo "$*" | tee -a "$summary"; }
note "gpu-check in $PWD, interpreter $py, budget ${budget}s"
for envf in .devdeps/env.sh ../.devdeps/env.sh; do
  if [ -f "$envf" ]; then
    # shellcheck disable=SC1090
    source "$envf"
    note "using $envf"
    break
  fi
done
bd=build-gpu
fail=0
step() { # step NAME LOG TIMEOUT CMD: runs CMD within min(TIMEOUT, what the budget has left)
  local name=$1 log=$out/$2.log t=$3; shift 3
  local left=$(( budget - ($(date +%s) - start) - 5 ))
  if [ "$left" -lt 10 ]; then
    printf '%-13s %-34s\n' "$name" "SKIPPED (budget spent)" | tee -a "$summary"
    fail=1
    return 1
  fi
  [ "$t" -le "$left" ] || t=$left
  local t0; t0=$(date +%s)
  echo "=== $name (timeout ${t}s)" >>"$log"
  timeout --kill-after=5 "$t" bash -c "$*" >>"$log" 2>&1
  local rc=$?
  local dt=$(( $(date +%s) - t0 ))
  local what=ok
  [ $rc -eq 0 ] || { what="FAILED (exit $rc$([ $rc -eq 124 ] && echo ", timed out at ${t}s"))"; fail=1; }
  printf '%-13s %-34s %4ss\n' "$name" "$what" "$dt" | tee -a "$summary"
  return $rc
}
# the last pytest / ctest tally of a log, into the summary
tally() { grep -E '(passed|failed|skipped|error)[^a-z]*(in [0-9.]+s)?|tests passed' "$out/$1.log" \
            | tail -n "${2:-1}" | sed 's/^/              /' | tee -a "$summary"; }

export ECT_PYTHON=$py
step env env 30 'nvidia-smi -L; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
"$ECT_PYTHON" - <<EOF || true
import sys
print("python", sys.version.split()[0], sys.executable)
for m in ("torch", "numpy", "pytest", "zmq"):
    try:
        mod = __import__(m)
        print(m, getattr(mod, "__version__", "?"))
    except ImportError:
        print(m, "MISSING")
try:
    import torch
    print("torch cuda", torch.version.cuda, "available", torch.cuda.is_available(),
          torch.cuda.get_device_name() if torch.cuda.is_available() else "")
except ImportError:
    pass
EOF'
if step build build 150 "cmake -S . -B $bd -DCMAKE_BUILD_TYPE=RelWithDebInfo -DECT_BUILD_TESTS=ON >/dev/null && cmake --build $bd -j\$(nproc) --target ect ectransfer test_cuda_e2e test_cuda_mem test_cuda_nocuda fakecuda push_items"; then
  step info env 20 "./$bd/ect info && ./$bd/ect info | grep -q '^cuda: available'"
  step test-gpu test-gpu 100 "ECT_REQUIRE_GPU=1 ctest --test-dir $bd -L gpu --timeout 100 --output-on-failure"
  tally test-gpu 1
  if [ -n "${GPU_CHECK_FAKE:-}" ]; then
    step fake test-gpu 60 "ctest --test-dir $bd -R '^(test_cuda_|cli_gpu)' --timeout 50 --output-on-failure"
  fi
  step bench bench 40 "./$bd/ect bench gpu --seconds 0.5"
  step bench-python bench 60 "for args in '--device cpu' '--device cuda' '--device cuda --pool-device cuda --transport shm'; do \"\$ECT_PYTHON\" scripts/bench-python.py --build $bd --count 160 --rounds 3 \$args || exit 1; done"
  step torch bench 20 '"$ECT_PYTHON" - <<EOF
import time
try:
    import torch
except ImportError:
    print("no torch: skipped"); raise SystemExit(0)
if not torch.cuda.is_available():
    print("torch sees no GPU: skipped"); raise SystemExit(0)
for n in (4718592, 67108864):
    h = torch.empty(n, dtype=torch.uint8).pin_memory()
    d = torch.empty(n, dtype=torch.uint8, device="cuda")
    d2 = torch.empty_like(d)
    for name, dst, src in (("pinned h2d", d, h), ("d2d", d2, d)):
        for _ in range(3): dst.copy_(src); torch.cuda.synchronize()
        k, t0 = 0, time.perf_counter()
        while time.perf_counter() - t0 < 0.3:
            dst.copy_(src); torch.cuda.synchronize(); k += 1
        dt = time.perf_counter() - t0
        print(f"torch {name:10s} {n/2**20:6.1f} MiB {n*k/dt/1e9:9.2f} GB/s")
EOF'
  # last: the CPU paths were verified by CI; this shows they hold with this torch
  step python python 80 "ECT_BUILD_DIR=$bd ECT_TEST_DEADLINE_S=60 tests/python/run.sh test_push.py test_pull.py test_connector.py test_binding.py test_vllm.py"
  tally python 1
fi
note "total $(( $(date +%s) - start ))s; logs: $out"
exit $fail
