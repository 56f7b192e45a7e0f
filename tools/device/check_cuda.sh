#!/usr/bin/env bash
# One device call: build the CUDA variant, then check and time every CUDA op.
#   bash tools/device/check_cuda.sh [extra args for check_cuda.py]
# Logs go to $OUT (the device tool's output folder) when set, else to build/device-logs.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-build/device-logs}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv 2>&1 | tee "$OUT/gpu.txt"
start=$(date +%s)
if ! grep -q "torch::kCPU" torch-ext/torch_binding.cpp && python3 tools/build.py --backend cuda --archs "${MAXSIM_CUDA_ARCHS:-9.0a}" 2>&1 | tee "$OUT/build.log"; then
  LIB=$(ls build/torch*-cu*-*/_maxsim_cuda_*.abi3.so | head -n 1)
else
  echo "== tools/build.py failed; fallback build (patched binding copy)" | tee -a "$OUT/build.log"
  python3 tools/device/build_fallback.py 2>&1 | tee -a "$OUT/build.log"
  [ -f build/fallback/_maxsim_cuda_fallback.so ] || { echo "fallback build failed"; exit 1; }
  LIB=$(ls build/fallback/*.so | head -n 1)
fi
echo "build took $(( $(date +%s) - start )) s; library $LIB"
python3 tools/device/check_cuda.py --lib "$LIB" "$@" 2>&1 | tee "$OUT/check.log"
