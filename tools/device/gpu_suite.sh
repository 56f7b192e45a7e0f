#!/usr/bin/env bash
# One device call: build the CUDA variant, run the full suite (CUDA + CPU), the sanitizer
# subset, the host-overhead probe (STEPS=...,probe; PROBE_ARGS) and the side-by-side
# benchmark. Logs land in $OUT. Carry .whl (kernels, tomlkit, and the peers
# late-interaction-kernels + flash-maxsim).
set -uo pipefail
source tools/device/setup.sh
export MAXSIM_CUDA_ARCHS=${MAXSIM_CUDA_ARCHS-9.0a} MAXSIM_TEST_AMPERE=${MAXSIM_TEST_AMPERE:-1}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
steps=${STEPS:-test,sanitize,bench}
status=0
if [[ $steps == *test* ]]; then
  python3 tools/dev.py test -q -rs -p no:cacheprovider ${PYTEST_ARGS:-} 2>&1 | tee "$OUT/tests.log" | tail -n 25
  [[ ${PIPESTATUS[0]} == 0 ]] || status=1
fi
if [[ $steps == *sanitize* ]]; then
  for tool in memcheck racecheck; do
    compute-sanitizer --tool $tool --error-exitcode 9 python3 tools/device/sanitize_subset.py \
      > "$OUT/sanitize_$tool.log" 2>&1
    rc=$?; echo "compute-sanitizer $tool: rc=$rc"; tail -n 3 "$OUT/sanitize_$tool.log"
    [[ $rc == 0 ]] || status=1
  done
fi
if [[ $steps == *bench* || $steps == *probe* || $steps == *ncu* ]]; then
  build_cuda || exit 1
fi
if [[ $steps == *probe* ]]; then
  python3 tools/device/overhead.py ${PROBE_ARGS:-rerank train} 2>&1 | tee "$OUT/probe.log"
fi
if [[ $steps == *ncu* ]]; then
  # one training step of NCU_WORKLOAD: forward and both backward kernels, full sections
  ncu --set full -k regex:"maxsim_forward|grad_" --launch-skip 1 --launch-count 3 \
    python3 tools/device/overhead.py once ${NCU_WORKLOAD:-BigColBERT} > "$OUT/ncu.log" 2>&1
  echo "ncu: rc=$?"; grep -E "^  [a-z_]+.*\(|Duration|Compute \(SM\) Throughput|Memory Throughput|Registers Per|Achieved Occupancy|Issue Slots Busy|Executed Ipc A" "$OUT/ncu.log" | head -60
fi
if [[ $steps == *bench* ]]; then
  python3 benchmarks/compare.py --device cuda --json "$OUT/bench.json" ${BENCH_ARGS:-} \
    2>&1 | tee "$OUT/bench.log" | tail -n 60
fi
exit $status
