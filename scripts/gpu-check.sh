#!/usr/bin/env bash
# gpu-check.sh: the Python side's checks that need a CUDA device, for a GPU machine.
# Builds the library and the bench driver, then: the CUDA tests (pytest when the
# interpreter has it, else tests/python/cuda_smoke.py), the push and vLLM-replay suites
# on that interpreter's torch, and bench-python.py with CUDA tensors and with host ones.
# ECT_PYTHON: the interpreter whose torch has CUDA (default: python3 on PATH).
# Output under $OUT when set (a results file per step), else on stdout.
set -euo pipefail
cd "$(dirname "$0")/.."
py=${ECT_PYTHON:-python3}
out=${OUT:-}
log() { if [ -n "$out" ]; then tee -a "$out/$1"; else cat; fi; }
cmake -S . -B build >/dev/null
cmake --build build -j"$(nproc)" --target ectransfer push_items >/dev/null
export ECT_LIBRARY=$PWD/build/libectransfer.so PYTHONPATH=$PWD/python
"$py" -c "import torch; assert torch.cuda.is_available(), 'torch sees no CUDA device'
print('torch', torch.__version__, torch.cuda.get_device_name())" 2>&1 | log gpu-env.txt
status=0
if "$py" -c "import pytest" >/dev/null 2>&1; then
  ECT_PYTHON=$py tests/python/run.sh test_cuda.py test_push.py test_pull.py test_connector.py \
    test_vllm.py 2>&1 | log gpu-tests.txt || status=1
else
  echo "gpu-check: $py has no pytest: running tests/python/cuda_smoke.py instead" | log gpu-tests.txt
  "$py" tests/python/cuda_smoke.py 2>&1 | log gpu-tests.txt || status=1
fi
for dev in cuda cpu; do
  "$py" scripts/bench-python.py --count 160 --rounds 5 --device $dev 2>&1 | log gpu-bench.txt ||
    status=1
done
exit $status
