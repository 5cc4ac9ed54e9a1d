#!/usr/bin/env bash
# Issue-6 figures on a GPU machine: `kb optimize` on the benchmark operators, one run directory each.
# Usage (repository root, on the GPU host): OUT=/some/dir OPS="vector_add softmax" scripts/device_optimize.sh
# Needs libcst importable (the GPU image lacks it: carry its cp312 wheel and set WHEELS=dir).
# ROUND_BUDGET_S: seconds after which an operator starts no new round; DEADLINE_S: no new operator after.
set -u
FINAL=${OUT:-/tmp/kb-device}
OUT=$(mktemp -d)
mkdir -p "$FINAL"
if [ -n "${WHEELS:-}" ]; then
  python3 -m pip install -q --no-deps --target "$OUT/site" "$WHEELS"/*.whl >> "$OUT/log.txt" 2>&1
fi
export KB_CACHE_DIR="$OUT/cache" PYTHONPATH="$OUT/site:$PWD${PYTHONPATH:+:$PYTHONPATH}"
start=$(date +%s)
kb() { python3 -m cli "$@"; }
for op in ${OPS:-vector_add softmax layer_norm row_sum matmul}; do
  [ $(( $(date +%s) - start )) -lt "${DEADLINE_S:-420}" ] || break
  t0=$(date +%s)
  kb --home "$OUT/home" optimize "corpora/operators/$op/task.py" --backend cuda --rounds "${ROUNDS:-4}" \
     --time-budget "${ROUND_BUDGET_S:-60}" --run-dir "$OUT/runs/$op" --json > "$OUT/$op.json" 2>> "$OUT/log.txt"
  echo "$op rc=$? $(( $(date +%s) - t0 )) s" >> "$OUT/log.txt"
done
echo "done in $(( $(date +%s) - start )) s" >> "$OUT/log.txt"
tar czf "$FINAL/device-optimize.tgz" -C "$OUT" --exclude cache --exclude site --exclude home --exclude 'compile-cache' . \
  && cp "$OUT/log.txt" "$FINAL/"
