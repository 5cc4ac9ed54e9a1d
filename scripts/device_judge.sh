#!/usr/bin/env bash
# Issue-23 figures on a GPU machine: the judge's process split, checked and costed.
#   PART=check   the adversarial suite on CUDA, and scripts/judge_cost.py (workers, hand-overs, a
#                candidate's requests by kind) on a few operators
#   PART=rounds  `kb optimize` before the split (OLD, a `git archive` of it) and after (this tree), one
#                operator at a time, old and new back to back, each from an empty Triton cache
# Usage (repository root, on the GPU host): OUT=/dir WHEELS=.whl PART=check scripts/device_judge.sh
#   OLD=build/old OPS="softmax rms_norm" ROUNDS=1 DEADLINE_S=480 PART=rounds ... (WHEELS: libcst)
set -u
FINAL=${OUT:-/tmp/kb-device}
mkdir -p "$FINAL"
source scripts/device_env.sh
SITE=/tmp/kb-site
export KB_CACHE_DIR=/tmp/kb-cache
start=$(date +%s)
python3 -c "from harness.roofline import ceilings; print(ceilings())" >> "$FINAL/log.txt" 2>&1  # neither side pays it
if [ "${PART:-check}" = check ]; then
  KB_TEST_BACKEND=cuda timeout 360 python3 -m pytest -q -p no:cacheprovider tests/test_adversarial.py \
    > "$FINAL/adversarial-cuda.txt" 2>&1
  echo "adversarial rc=$? $(( $(date +%s) - start )) s" >> "$FINAL/log.txt"
  timeout 200 python3 scripts/judge_cost.py --backend cuda --out "$FINAL" \
    corpora/operators/${OP1:-softmax}/task.py corpora/operators/${OP2:-vector_add}/task.py \
    > "$FINAL/judge-cost.txt" 2>&1
  echo "judge_cost rc=$? $(( $(date +%s) - start )) s" >> "$FINAL/log.txt"
else
  RUNS=/tmp/kb-rounds
  mkdir -p "$RUNS/old" "$RUNS/new"
  for op in ${RUN_OPS:-}; do  # the same kernel timed by `kb run` before and after: its medians should agree
    for side in old new; do
      root=$([ $side = old ] && echo "${OLD:-build/old}" || echo "$PWD")
      (cd "$root" && PYTHONPATH="$SITE:$root" python3 -m cli run "corpora/operators/$op/task.py" --backend cuda         --seeds 1 --json > "$RUNS/$side/run-$op.json" 2>> "$FINAL/log.txt")
      echo "$side kb run $op rc=$? $(( $(date +%s) - start )) s" >> "$FINAL/log.txt"
    done
  done
  for op in ${OPS:-softmax rms_norm}; do
    [ $(( $(date +%s) - start )) -lt "${DEADLINE_S:-480}" ] || break
    for side in old new; do
      root=$([ $side = old ] && echo "${OLD:-build/old}" || echo "$PWD")
      rm -rf ~/.triton/cache "$KB_CACHE_DIR/triton-kernels"
      mkdir -p "$RUNS/$side"
      t0=$(date +%s.%N)
      (cd "$root" && PYTHONPATH="$SITE:$root" python3 -m cli --home "$RUNS/home-$side" optimize \
        "corpora/operators/$op/task.py" --backend cuda --rounds "${ROUNDS:-1}" --run-dir "$RUNS/$side/$op" --json \
        > "$RUNS/$side/$op.json" 2>> "$FINAL/log.txt")
      rc=$?
      python3 -c "import time; print(time.time() - $t0)" > "$RUNS/$side/$op/wall_s.txt"
      echo "$side $op rc=$rc $(cat "$RUNS/$side/$op/wall_s.txt") s" >> "$FINAL/log.txt"
    done
  done
  python3 scripts/judge_cost.py --rounds "$RUNS/old" "$RUNS/new" --out "$FINAL" > "$FINAL/rounds.json" 2>&1
  tar czf "$FINAL/rounds.tgz" -C "$RUNS" --exclude 'compile-cache' --exclude 'home-*' . 2>/dev/null
fi
echo "done in $(( $(date +%s) - start )) s" >> "$FINAL/log.txt"
