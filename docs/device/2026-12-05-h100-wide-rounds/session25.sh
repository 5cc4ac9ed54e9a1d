#!/usr/bin/env bash
# Session 25: wide rounds (--breadth) through `kb optimize` on the GPU. Each job: NAME TASK BREADTH ROUNDS;
# runs live in build/s25/<name> (carried back and forth as $OUT/s25.tgz), a paused one is resumed.
set -u
export PYTHONUNBUFFERED=1 KB_HOME=$PWD/build/device-home
mkdir -p build/s25; [ -f build/s25.tgz ] && tar xzf build/s25.tgz -C build
FINAL=$OUT WHEELS=build/device-wheels; . scripts/device_env.sh; s=$(date +%s)
nvidia-smi --query-gpu=name --format=csv,noheader | head -1 > $OUT/card.txt
for job in ${JOBS}; do
  IFS=: read -r name task breadth rounds <<< "$job"
  left=$(( ${BUDGET:-500} - ($(date +%s) - s) ))
  [ $left -lt 60 ] && { echo "$name: not started, $left s left" >> $OUT/log.txt; continue; }
  dir=build/s25/$name; t=$(date +%s)
  if [ -f $dir/rounds.sqlite ]; then how=(--resume $dir); else how=(corpora/operators/$task/task.py --rounds $rounds --breadth $breadth --run-dir $dir); fi
  python3 -m cli optimize "${how[@]}" --backend cuda --stop-after $(( left - 40 )) --vs eager --json \
    > $OUT/$name.json 2> $OUT/$name-log.txt
  echo "$name rc=$? $(( $(date +%s)-t )) s" >> $OUT/log.txt
done
tar czf $OUT/s25.tgz --exclude compile-cache -C build s25
