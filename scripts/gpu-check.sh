#!/usr/bin/env bash
# gpu-check — the whole GPU verification as ONE run on a GPU machine (device
# time is short: every step has its own timeout and the summary always prints).
#
#   bash scripts/gpu-check.sh [OUTDIR]      (default $OUT, else ./gpu-check-out)
#
# On a machine without a package registry, carry the packed Debian libraries
# (.devdeps, see /work/shared/tools/device-deps.sh); this script sources
# .devdeps/env.sh or ../.devdeps/env.sh when present. Steps:
#   env      nvidia-smi, the torch we can see (informational)
#   build    cmake -B build-gpu (RelWithDebInfo), only the targets the checks need
#   info     ect info (must say "cuda: available")
#   test-gpu the `gpu` label on the real driver, ECT_REQUIRE_GPU=1 (what `make
#            test-gpu` runs): gpu_e2e (C, bit-exact), gpu_cli, gpu_python if present
#   fake     (only with GPU_CHECK_FAKE=1) the stand-in driver's tests too, as CI runs them
#   bench    ect bench gpu (4.5 MiB and 64 MiB)
#   torch    torch's own pinned h2d and d2d copy figures for the same sizes (cross-check
#            of the bench's limits; skipped without torch)
# Logs: OUTDIR/<step>.log; OUTDIR/summary.txt. Exit status 0 only if every step passed.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${1:-${OUT:-$PWD/gpu-check-out}}
mkdir -p "$out"
summary=$out/summary.txt
: >"$summary"
for envf in .devdeps/env.sh ../.devdeps/env.sh; do
  if [ -f "$envf" ]; then
    # shellcheck disable=SC1090
    source "$envf"
    echo "using $envf" >>"$summary"
    break
  fi
done
bd=build-gpu
fail=0
step() { # step NAME TIMEOUT CMD...
  local name=$1 t=$2; shift 2
  local t0; t0=$(date +%s)
  timeout --kill-after=10 "$t" bash -c "$*" >"$out/$name.log" 2>&1
  local rc=$?
  local dt=$(( $(date +%s) - t0 ))
  local what=ok
  [ $rc -eq 0 ] || { what="FAILED (exit $rc$([ $rc -eq 124 ] && echo ', timed out'))"; fail=1; }
  printf '%-9s %-32s %4ss\n' "$name" "$what" "$dt" | tee -a "$summary"
  return $rc
}

step env 30 'nvidia-smi -L; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv; python3 -c "import torch; print(\"torch\", torch.__version__, torch.version.cuda, torch.cuda.is_available())" || true'
if step build 200 "cmake -S . -B $bd -DCMAKE_BUILD_TYPE=RelWithDebInfo -DECT_BUILD_TESTS=ON >/dev/null && cmake --build $bd -j\$(nproc) --target ect test_cuda_e2e test_cuda_mem test_cuda_nocuda fakecuda ectransfer"; then
  step info 30 "./$bd/ect info && ./$bd/ect info | grep -q '^cuda: available'"
  step test-gpu 120 "ECT_REQUIRE_GPU=1 ctest --test-dir $bd -L gpu --timeout 90 --output-on-failure"
  if [ -n "${GPU_CHECK_FAKE:-}" ]; then
    step fake 90 "ctest --test-dir $bd -R '^(test_cuda_|cli_gpu)' --timeout 60 --output-on-failure"
  fi
  step bench 60 "./$bd/ect bench gpu --seconds 0.5"
  step torch 40 'python3 - <<EOF
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
fi
echo "logs: $out" | tee -a "$summary"
exit $fail
