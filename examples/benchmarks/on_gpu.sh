#!/bin/bash
# polyc's CUDA target on a real GPU, in one go: the GPU benchmark, compute-sanitizer over
# an operator, the CUDA tests with every operator built by nvcc and run on the device
# (instead of the CPU emulation), and a CUDA fuzz slice on the device.
#   bash examples/benchmarks/on_gpu.sh [sm_90] [out-dir]
# Needs nvcc, a CUDA device and polyc's dependencies (pytest-xdist, cupy and torch are
# used when present). Each part is time-bounded (TESTS_S, FUZZ_S seconds).
set -u
ARCH=${1:-sm_90}
OUT=${2:-gpu-out}
mkdir -p "$OUT"
export POLYC_CACHE_DIR=${POLYC_CACHE_DIR:-/tmp/polyc-gpu-cache} PYTHONUNBUFFERED=1
nvidia-smi -L; nvcc --version | tail -1
# a missing dependency would fail tests one by one with ModuleNotFoundError: stop here
python3 -c "import islpy, cgen, pycparser, onnx, numpy, polyc" || {
  echo "on_gpu.sh: polyc's dependencies do not import (above); install or carry them"; exit 3; }
echo "== benchmark"
python3 examples/benchmarks/bench_gpu.py --arch "$ARCH" --sizes "${SIZES:-1024,2048,4096}" \
    --repeat 10 2>&1 | tee "$OUT/bench.log"
python3 examples/benchmarks/bench_gpu.py --arch "$ARCH" --report >"$OUT/report.log" 2>&1
echo "== compute-sanitizer (memcheck, racecheck) over a matmul and a softmax"
cat >"$OUT/sanitize_me.py" <<PY
import numpy as np, polyc
mm = polyc.define("def mm(float(M,K) A, float(K,N) B) -> (C) { C(m,n) +=! A(m,k) * B(k,n) }",
                  target="cuda", gpu_arch="$ARCH")
a = np.random.rand(67, 45).astype(np.float32); b = np.random.rand(45, 71).astype(np.float32)
print("matmul max err", float(np.abs(mm(a, b) - a @ b).max()))
sm = polyc.define("""def softmax(float(N,D) X) -> (Y, mx, s) {
    mx(n) max=! X(n,d)
    s(n) +=! exp(X(n,d) - mx(n))
    Y(n,d) = exp(X(n,d) - mx(n)) / s(n)
}""", target="cuda", gpu_arch="$ARCH")
x = np.random.rand(37, 300).astype(np.float32)
e = np.exp(x - x.max(1, keepdims=True))
print("softmax max err", float(np.abs(sm(x)[0] - e / e.sum(1, keepdims=True)).max()))
PY
for tool in memcheck racecheck; do
  compute-sanitizer --tool $tool --error-exitcode 9 python3 "$OUT/sanitize_me.py" 2>&1 | tail -4
  echo "compute-sanitizer $tool exit ${PIPESTATUS[0]}"
done
JOBS=$(python3 -c "import xdist" 2>/dev/null && echo "-n $(nproc)")
echo "== the CUDA tests on the device ($ARCH)"
# every test with "cuda" in its name: tests/test_cuda_*.py and the CUDA cases of the ONNX
# operator, dtype, fusion and scheduler tests (the tests compare against onnxruntime, which
# must read the models' IR version: an old one on the device fails those few)
POLYC_TEST_ON_GPU=$ARCH timeout "${TESTS_S:-300}" python3 -m pytest -q $JOBS \
    -p no:cacheprovider -m "not slow" -k cuda tests >"$OUT/tests.log" 2>&1
echo "tests exit $?"; grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/tests.log" | tail -25
echo "== CUDA fuzz slice on the device"
POLYC_TEST_ON_GPU=$ARCH timeout "${FUZZ_S:-100}" python3 tests/fuzz/campaign.py \
    -n "${FUZZ_N:-150}" -j "$(nproc)" --seed 7000 --target cuda --no-shrink \
    --out "$OUT/fuzz" >"$OUT/fuzz.log" 2>&1
echo "fuzz exit $?"; tail -8 "$OUT/fuzz.log"
