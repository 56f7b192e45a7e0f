#!/usr/bin/env bash
# Device call: full check (build + correctness + timings) with the default block shapes,
# then the previous padded/packed short-query shape (MAXSIM_CUDA_RERANK_CFG=0): its
# correctness and rerank timings, for a same-machine comparison.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-build/device-logs}
bash tools/device/check_cuda.sh "$@"
LIB=$(ls build/torch*-cu*-*/_maxsim_cuda_*.abi3.so build/fallback/*.so 2>/dev/null | tail -n 1)
MAXSIM_CUDA_RERANK_CFG=0 timeout 150 python3 tools/device/check_cuda.py --lib "$LIB" --surfaces padded,packed \
  --bench-set rerank 2>&1 | tee "$OUT/rerank_cfg0.log" | tail -22
