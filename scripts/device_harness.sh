#!/usr/bin/env bash
# Issue-4 figures on a GPU machine: `kb run` on the benchmark operators (twice, for the spread
# between processes), the adversarial kernels on CUDA, and one Nsight Compute profile.
# Usage (from the repository root, on the GPU host): OUT=/some/dir scripts/device_harness.sh
# Writes $OUT/device-results.tgz (one JSON report per run, a log) and stops starting new runs
# after $BUDGET_S seconds.
set -u
FINAL=${OUT:-/tmp/kb-device}
OUT=$(mktemp -d)
BUDGET_S=${BUDGET_S:-480}
mkdir -p "$FINAL"
export KB_CACHE_DIR="$OUT/cache" PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
start=$(date +%s)
kb() { python3 -m cli "$@"; }
left() { [ $(( $(date +%s) - start )) -lt "$BUDGET_S" ]; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu --format=csv > "$OUT/gpu.txt"
for round in 1 2; do
  for op in vector_add softmax layer_norm row_sum matmul; do
    left || break
    t0=$(date +%s)
    kb run "corpora/operators/$op/task.py" --backend cuda --json > "$OUT/$op.$round.json" 2>> "$OUT/log.txt"
    echo "$op round $round rc=$? $(( $(date +%s) - t0 )) s" >> "$OUT/log.txt"
  done
done
for bad in side_stream crash mutating; do
  left || break
  kb run tests/fixtures/harness/task_add.py --candidate "tests/fixtures/harness/$bad.py" --backend cuda \
     --no-time --json > "$OUT/adversarial.$bad.json" 2>> "$OUT/log.txt"
  echo "adversarial $bad rc=$?" >> "$OUT/log.txt"
done
left && kb run corpora/operators/vector_add/task.py --backend cuda --cases 3 --profile --json \
  > "$OUT/vector_add.profile.json" 2>> "$OUT/log.txt"
echo "done in $(( $(date +%s) - start )) s" >> "$OUT/log.txt"
tar czf "$FINAL/device-results.tgz" -C "$OUT" . && cp "$OUT/log.txt" "$FINAL/"
