#!/usr/bin/env bash
# One device call: a host backtrace of the short-document_scales crash (cuda-gdb; there is no
# gdb there) and Nsight Compute sections of the HeavyRerank forward with int8 documents and
# with float16 documents on the mma.sync kernel. Logs in $OUT. Carry .whl.
set -uo pipefail
source tools/device/setup.sh
export MAXSIM_CUDA_ARCHS=${MAXSIM_CUDA_ARCHS-9.0a}
build_cuda || exit 1
python3 tools/device/compressed_diagnose.py short_scales; echo "short_scales rc=$?"
timeout 240 cuda-gdb -batch -ex run -ex bt -ex "info registers rip" \
  --args python3 tools/device/compressed_diagnose.py short_scales > "$OUT/gdb.log" 2>&1
grep -v "^\[New Thread\|^\[Thread\|^warning" "$OUT/gdb.log" | tail -n 45
sections="--section SpeedOfLight --section Occupancy --section SchedulerStats --section WarpStateStats --section LaunchStats --section MemoryWorkloadAnalysis --section InstructionStats"
for fmt in int8 fp16; do
  [[ $fmt == fp16 ]] && export MAXSIM_CUDA_FORCE_MMA_SYNC=1
  timeout 150 ncu --clock-control none $sections -k regex:maxsim_forward --launch-skip 2 --launch-count 1 \
    python3 tools/device/compressed_diagnose.py rerank $fmt > "$OUT/ncu_$fmt.log" 2>&1
  echo "== ncu $fmt rc=$?"
  grep -E "Duration|Memory Throughput|DRAM Throughput|Compute \(SM\)|Registers Per|Achieved Occupancy|Theoretical Occupancy|Issue Slots Busy|Issued Ipc|No Eligible|Active Warps Per|Eligible Warps|Warp Cycles Per Issued|Executed Instructions  |Block Limit" "$OUT/ncu_$fmt.log" | head -30
  grep -iE "stall|scoreboard|barrier|throttle" "$OUT/ncu_$fmt.log" | head -12
done
