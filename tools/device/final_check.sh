#!/usr/bin/env bash
# The final code on the device, in parts that each fit one call: build the CUDA variant
# (ARCHS empty = every arch build.toml lists; e.g. ARCHS=9.0a for a faster part), run the
# suite's PART (1: the CUDA-heavy files, 2: the rest, all: everything) with
# MAXSIM_TEST_AMPERE=1 (adds the sm_80+PTX variant), then, with SANITIZE=1, compute-sanitizer
# memcheck and racecheck on tools/device/sanitize_subset.py. Carry .whl. Logs in $OUT.
set -uo pipefail
source tools/device/setup.sh
export MAXSIM_TEST_AMPERE=1 MAXSIM_CUDA_ARCHS=${ARCHS:-}
build_cuda || exit 1
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
