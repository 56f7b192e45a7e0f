#!/usr/bin/env bash
# One device call for the compressed-document kernels: build the CUDA variant (sm_90a),
# run their tests and the Python API's compressed tests, time them against float16
# documents (tools/device/bench_compressed.py), then the mma.sync regression tests of the
# float paths (MAXSIM_TEST_AMPERE=1) in what time is left. Logs land in $OUT. Carry .whl.
set -uo pipefail
source tools/device/setup.sh
export MAXSIM_CUDA_ARCHS=${MAXSIM_CUDA_ARCHS-9.0a}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
status=0
build_cuda || exit 1
# the pre-sm_89 e4m3 widening, bit for bit against the hardware conversion
nvcc -std=c++17 -I. --expt-relaxed-constexpr -arch=sm_90a -o /tmp/check_e4m3 tools/device/check_e4m3_widen.cu \
  && /tmp/check_e4m3 || status=1
python3 -m pytest -q -rs -p no:cacheprovider ${COMPRESSED_TESTS:-tests/test_cuda_compressed.py tests/test_compressed.py} \
  2>&1 | tee "$OUT/tests_compressed.log" | tail -n 30
[[ ${PIPESTATUS[0]} == 0 ]] || status=1
python3 tools/device/bench_compressed.py 2>&1 | tee "$OUT/bench_compressed.log"
if [[ -n ${REGRESSION_TESTS:-} ]]; then
  MAXSIM_TEST_AMPERE=1 timeout ${REGRESSION_TIMEOUT:-200} python3 -m pytest -q -x -p no:cacheprovider $REGRESSION_TESTS \
    2>&1 | tee "$OUT/tests_regression.log" | tail -n 15
  [[ ${PIPESTATUS[0]} == 0 ]] || status=1
fi
exit $status
