#!/usr/bin/env bash
# One device call: build the CUDA variant exactly as build.toml lists it (every arch), then
# benchmarks/compare.py with both peers installed, in two parts (inference rows, then
# training rows) so a call that runs out of time still returns the first JSON. Carry .whl.
set -uo pipefail
source tools/device/setup.sh
unset MAXSIM_CUDA_ARCHS
build_cuda build_all.log || exit 1
ITERS=${ITERS:-30}
INFER=SmallRerank,Rerank,HeavyRerank,LongDocStress,ColPaliRerank,SmallRerankPacked,RerankPacked,HeavyRerankPacked,LongDocStressPacked,ColPaliRerankPacked,ColBERTCorpus,ColPaliCorpus,RerankD256,RerankD512,RerankD768,RerankD1024,ContrastiveD256,ContrastiveD512,ContrastiveD768,ContrastiveD1024
python3 benchmarks/compare.py --device cuda --workloads "${INFER_WL:-$INFER}" --iters "$ITERS" --warmup 5 \
  --json "$OUT/bench_infer.json" > "$OUT/bench_infer.log" 2>&1; echo "inference part: rc=$?"
python3 benchmarks/compare.py --device cuda --workloads "${TRAIN_WL:-Contrastive,LongDocs,BigBatch,ColPali,BigColBERT,DocDoc}" \
  --iters "$ITERS" --warmup 5 --json "$OUT/bench_train.json" > "$OUT/bench_train.log" 2>&1; echo "training part: rc=$?"
grep -E "^  [A-Za-z]" "$OUT/bench_infer.log" "$OUT/bench_train.log" | cut -c1-170
