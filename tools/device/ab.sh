#!/usr/bin/env bash
# One device call for an A/B: the working tree (candidate) against a copy of another tree
# in .base/ (carry it), both built for sm_90a; correctness subset on the candidate, then
# GPU time (graph replay) of the forward shapes and training pieces for both, then ncu
# per-instruction counters of the kernels named in HOT (as in hotspots.sh). Carry .whl.
set -uo pipefail
source tools/device/setup.sh
export MAXSIM_CUDA_ARCHS=${MAXSIM_CUDA_ARCHS:-9.0a}
build_cuda || exit 1
(cd .base && python3 tools/build.py --backend cuda > /tmp/build_base.log 2>&1) &
MAXSIM_TEST_NO_BUILD=1 python3 -m pytest -q -x -p no:cacheprovider ${AB_TESTS:-tests/test_forward.py tests/test_argmax.py tests/test_backward.py} -k cuda 2>&1 | tail -n 4
wait
echo "== candidate"; python3 tools/device/overhead.py ${PROBE:-kernels split} 2>&1 | tee "$OUT/probe_candidate.log"
echo "== base"; (cd .base && python3 tools/device/overhead.py ${PROBE:-kernels split}) 2>&1 | tee "$OUT/probe_base.log"
if [[ -n ${HOT:-} ]]; then PROBE="" bash tools/device/hotspots.sh 2>&1 | grep -v "^NVIDIA"; fi
