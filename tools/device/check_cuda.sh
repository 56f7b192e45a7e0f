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
python3 tools/build.py --backend cuda --archs "${MAXSIM_CUDA_ARCHS:-9.0a}" 2>&1 | tee "$OUT/build.log"
LIB=$(ls build/torch*-cu*-*/_maxsim_cuda_*.abi3.so | head -n 1)
[ -f "$LIB" ] || { echo "build failed"; exit 1; }
echo "build took $(( $(date +%s) - start )) s; library $LIB"
python3 tools/device/check_cuda.py --lib "$LIB" "$@" 2>&1 | tee "$OUT/check.log"
