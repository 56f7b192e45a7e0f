#!/usr/bin/env bash
# One device call for the final code: build every arch build.toml lists, run the whole suite
# on that build (MAXSIM_TEST_AMPERE=1 adds the sm_80+PTX variant), then compute-sanitizer
# memcheck and racecheck on tools/device/sanitize_subset.py. Carry .whl. Logs in $OUT.
# (gpu_suite.sh keeps MAXSIM_CUDA_ARCHS empty here: empty means the build.toml list.)
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site || exit 1
export PYTHONUNBUFFERED=1 MAXSIM_TEST_AMPERE=1; unset MAXSIM_CUDA_ARCHS
start=$(date +%s)
python3 tools/build.py --backend cuda > "$OUT/build_all.log" 2>&1 || { tail -n 40 "$OUT/build_all.log"; exit 1; }
echo "build.toml build: $(( $(date +%s) - start )) s"
STEPS=test,sanitize MAXSIM_CUDA_ARCHS="" bash tools/device/gpu_suite.sh
