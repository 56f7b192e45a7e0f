#!/usr/bin/env bash
# One device call for the sm_90a contrastive kernel: build for sm_90a only, its targeted
# tests (each with a time limit, so a hung pipeline cannot eat the call), then the forward
# shapes and training pieces with the Hopper kernel and with MAXSIM_CUDA_FORCE_MMA_SYNC=1.
# Carry .whl. TESTS overrides the test selection; PROBE the overhead.py modes; BENCH_WL runs
# benchmarks/compare.py on those workloads (both peers) once per VARIANTS entry.
set -uo pipefail
source tools/device/setup.sh
export MAXSIM_CUDA_ARCHS=${MAXSIM_CUDA_ARCHS:-9.0a}
build_cuda || exit 1
grep -h "C75[0-9][0-9]" "$OUT/build.log" | sed 's/in the function.*//' | sort | uniq -c | head
# TESTS: files; TEST_K: a -k expression (only the CUDA variant is built here, so CPU
# parametrisations of the shared test files must be deselected, e.g. TEST_K="cuda or hopper")
MAXSIM_TEST_NO_BUILD=1 timeout ${TEST_LIMIT:-300} python3 -m pytest -q -x -p no:cacheprovider \
  ${TESTS:-tests/test_hopper.py} ${TEST_K:+-k "$TEST_K"} 2>&1 | tail -n 25
# VARIANTS: name=ENV=VALUE pairs run side by side (default: the Hopper kernel and mma.sync)
for mode in ${PROBE:-kernels split}; do
  for v in ${VARIANTS:-hopper mma.sync=MAXSIM_CUDA_FORCE_MMA_SYNC=1}; do
    name=${v%%=*}; envs=""; [[ $v == *=* ]] && envs=${v#*=}
    echo "== $name: $mode"
    env $envs timeout 180 python3 tools/device/overhead.py $mode 2>&1 | tee -a "$OUT/probe_$name.log"
  done
done
if [[ -n ${BENCH_WL:-} ]]; then
  for v in ${VARIANTS:-hopper mma.sync=MAXSIM_CUDA_FORCE_MMA_SYNC=1}; do
    name=${v%%=*}; envs=""; [[ $v == *=* ]] && envs=${v#*=}
    echo "== $name: compare.py"
    env $envs timeout ${BENCH_LIMIT:-240} python3 benchmarks/compare.py --device cuda --workloads "$BENCH_WL" \
      --iters ${ITERS:-30} --warmup 5 --json "$OUT/bench_$name.json" > "$OUT/bench_$name.log" 2>&1
    echo "rc=$?"; grep -E "^  [A-Za-z]" "$OUT/bench_$name.log" | cut -c1-170
  done
fi
