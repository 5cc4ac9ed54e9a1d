#!/usr/bin/env bash
# Issue-5 figures on a GPU machine: measurements of the L2 gold tasks (with Nsight Compute), and the
# diagnosis gold set evaluated on the device itself (real launches specialize the kernels).
# Usage (from the repository root, on the GPU host): OUT=/some/dir scripts/device_diagnosis.sh
# Writes $OUT/device-diagnosis.tgz (one JSON per run, the eval report, a log).
set -u
FINAL=${OUT:-/tmp/kb-device}
OUT=$(mktemp -d)
BUDGET_S=${BUDGET_S:-500}
mkdir -p "$FINAL"
export KB_CACHE_DIR="$OUT/cache" PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
start=$(date +%s)
kb() { python3 -m cli "$@"; }
left() { [ $(( $(date +%s) - start )) -lt "$BUDGET_S" ]; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv > "$OUT/gpu.txt"
for t in ${TASKS:-tiny_add masked_add streaming_rowsum pipelined_rowsum}; do
  left || break
  t0=$(date +%s)
  kb run "corpora/diagnosis/nvidia/${t}_task.py" --backend cuda --profile --json > "$OUT/$t.json" 2>> "$OUT/log.txt"
  echo "$t rc=$? $(( $(date +%s) - t0 )) s" >> "$OUT/log.txt"
done
if left; then
  t0=$(date +%s)
  kb --home "$OUT/no-kb" eval diagnosis --json > "$OUT/eval-device.json" 2>> "$OUT/log.txt"
  echo "eval rc=$? $(( $(date +%s) - t0 )) s" >> "$OUT/log.txt"
fi
echo "done in $(( $(date +%s) - start )) s" >> "$OUT/log.txt"
tar czf "$FINAL/device-diagnosis.tgz" -C "$OUT" --exclude cache . && cp "$OUT/log.txt" "$FINAL/"
