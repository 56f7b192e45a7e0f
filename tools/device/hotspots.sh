#!/usr/bin/env bash
# One device call: build the CUDA variant for sm_90a, print the GPU time of each piece
# (overhead.py split + kernels), then profile the named kernels with ncu and export each
# one's per-SASS-instruction counters (executed instructions, stall samples) as CSV, so
# the hot instructions can be read here without ncu. Carry .whl. Logs and CSVs land in $OUT.
#   HOT="BigColBERT:once:maxsim_forward HeavyRerank-full:call:maxsim_forward" bash tools/device/hotspots.sh
set -uo pipefail
source tools/device/setup.sh
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader
export MAXSIM_CUDA_ARCHS=${MAXSIM_CUDA_ARCHS:-9.0a}
build_cuda || exit 1
[[ -n ${PROBE-split kernels} ]] && python3 tools/device/overhead.py ${PROBE-split kernels} 2>&1 | tee "$OUT/probe.log"
for spec in ${HOT:-}; do
  IFS=: read -r what mode kern <<< "$spec"
  name=${what%%-*}; layout=${what#*-}; [[ $layout == "$what" ]] && layout=full
  tag="${what}_${kern}"
  if [[ $mode == once ]]; then args=(once "$name"); else args=(call "$name" "$layout"); fi
  ncu --clock-control none --import-source no --section SourceCounters --section WarpStateStats \
    --section SpeedOfLight --section Occupancy --section LaunchStats --section InstructionStats \
    --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis \
    -k "regex:$kern" --launch-count 1 -f -o "/tmp/$tag" python3 tools/device/overhead.py "${args[@]}" \
    > "/tmp/$tag.ncu.log" 2>&1 || { echo "ncu $tag failed"; tail -n 5 "/tmp/$tag.ncu.log"; continue; }
  ncu -i "/tmp/$tag.ncu-rep" --page details > "$OUT/$tag.details.txt" 2>&1
  ncu -i "/tmp/$tag.ncu-rep" --page source --csv --print-source sass > "/tmp/$tag.sass.csv" 2>&1
  gzip -c "/tmp/$tag.sass.csv" > "$OUT/$tag.sass.csv.gz"
  echo "== $tag"; grep -E "Duration|Registers Per|Executed Ipc A|Issue Slots Busy|No Eligible|Compute \(SM\) Thr|Memory Thr|DRAM Thr|Executed Instructions  " "$OUT/$tag.details.txt" | head -12
done
