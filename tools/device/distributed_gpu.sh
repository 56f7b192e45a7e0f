#!/usr/bin/env bash
# One device call on a machine with 2 GPUs (issue 11): build the CUDA variant, run
# tests/test_distributed.py (gloo groups on CPU and NCCL groups on the GPUs), the two
# examples under torchrun on 2 GPUs, then the scaling figures of tools/device/distributed_bench.py
# on 1 and 2 GPUs, printed as one table. Logs land in $OUT. Carry .whl (kernels, tomlkit).
# STEPS=build,test,examples,bench (the default: all) runs a part, e.g. to split the work
# over two calls on a warm machine (build/ stays between calls).
set -uo pipefail
source tools/device/setup.sh
export MAXSIM_CUDA_ARCHS=${MAXSIM_CUDA_ARCHS:-9.0a}
export LOCAL_KERNELS="maxsim/maxsim=$PWD" HF_HUB_OFFLINE=1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
steps=${STEPS:-build,test,examples,bench}
status=0
if [[ $steps == *build* ]]; then
  for backend in cpu cuda; do
    python3 tools/build.py --backend $backend > "$OUT/build_$backend.log" 2>&1 \
      || { tail -n 20 "$OUT/build_$backend.log"; exit 1; }
  done
fi

if [[ $steps == *test* ]]; then
  MAXSIM_TEST_NO_BUILD=1 python3 -m pytest tests/test_distributed.py -q -rs -p no:cacheprovider 2>&1 \
    | tee "$OUT/tests_distributed.log" | tail -n 15
  [[ ${PIPESTATUS[0]} == 0 ]] || status=1
fi

[[ $steps == *examples* ]] && for example in examples/05_distributed_training.py examples/06_sharded_search.py; do
  python3 -m torch.distributed.run --standalone --nproc-per-node 2 "$example" > "$OUT/$(basename "$example" .py).log" 2>&1
  rc=$?; echo "torchrun --nproc-per-node 2 $example: rc=$rc"; tail -n 2 "$OUT/$(basename "$example" .py).log"
  [[ $rc == 0 ]] || status=1
done

[[ $steps == *bench* ]] || exit $status
# 1 GPU: one rank's shapes (units 1) and the 2-GPU global batch (units 2); 2 GPUs: units 2.
rm -f "$OUT/scaling.jsonl"
python3 -m torch.distributed.run --standalone --nproc-per-node 1 tools/device/distributed_bench.py --units 1 2 --json "$OUT/scaling.jsonl" \
  > "$OUT/bench_1gpu.log" 2>&1 || { status=1; tail -n 20 "$OUT/bench_1gpu.log"; }
python3 -m torch.distributed.run --standalone --nproc-per-node 2 tools/device/distributed_bench.py --units 2 --json "$OUT/scaling.jsonl" \
  > "$OUT/bench_2gpu.log" 2>&1 || { status=1; tail -n 20 "$OUT/bench_2gpu.log"; }
python3 tools/device/distributed_bench.py --report "$OUT/scaling.jsonl" | tee "$OUT/scaling.md"
exit $status
