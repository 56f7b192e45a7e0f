#!/usr/bin/env bash
# The final code on the device, in parts that each fit one call: build the CUDA variant
# (ARCHS empty = every arch build.toml lists; e.g. ARCHS=9.0a for a faster part), run the
# suite's PART (1: the CUDA-heavy files, 2: the rest, all: everything) with
# MAXSIM_TEST_AMPERE=1 (adds the sm_80+PTX variant), then, with SANITIZE=1, compute-sanitizer
# memcheck and racecheck on tools/device/sanitize_subset.py. Carry .whl. Logs in $OUT.
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site || exit 1
export PYTHONUNBUFFERED=1 MAXSIM_TEST_AMPERE=1 MAXSIM_CUDA_ARCHS=${ARCHS:-}
start=$(date +%s)
python3 tools/build.py --backend cuda > "$OUT/build.log" 2>&1 || { tail -n 40 "$OUT/build.log"; exit 1; }
echo "build (${ARCHS:-build.toml archs}): $(( $(date +%s) - start )) s"
part1="test_cuda.py test_hopper.py test_forward.py test_argmax.py"
ignore=""
for f in tests/test_*.py; do
  b=$(basename "$f")
  in1=0; [[ " $part1 " == *" $b "* ]] && in1=1
  case ${PART:-all} in
    1) [[ $in1 == 0 ]] && ignore+=" --ignore=$f" ;;
    2) [[ $in1 == 1 ]] && ignore+=" --ignore=$f" ;;
  esac
done
steps=test; [[ ${SANITIZE:-0} == 1 ]] && steps+=,sanitize
STEPS=$steps PYTEST_ARGS="$ignore" bash tools/device/gpu_suite.sh
