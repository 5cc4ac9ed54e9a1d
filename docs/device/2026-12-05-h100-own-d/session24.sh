#!/usr/bin/env bash
# Session 24, one device call: (1) attention's own kernel judged with the scaled case's atol grown with its
# outputs (f1fd64c): is its x16 case still set aside on the GPU? (2) the own-suite bench own-d resumed from
# build/own-d.tgz for the time left (H100 only: the ceilings are the H100's).
set -u
export PYTHONUNBUFFERED=1 KB_HOME=$PWD/build/device-home
mkdir -p build; [ -f build/own-d.tgz ] && tar xzf build/own-d.tgz -C build
FINAL=$OUT WHEELS=build/device-wheels; . scripts/device_env.sh; s=$(date +%s)
card=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1); echo "$card" > $OUT/card.txt
r() { n=$1; shift; t=$(date +%s); timeout 150 python3 -m cli run --backend cuda --json "$@" > $OUT/$n.json 2>> $OUT/log.txt; echo "$n rc=$? $(( $(date +%s)-t )) s" >> $OUT/log.txt; }
if [ "${PART:-}" = judge ]; then
  r attention_own corpora/operators/attention/task.py --no-time
fi
left=$(( ${BUDGET:-440} - ($(date +%s) - s) ))
if [ -f build/own-d/card.txt ] && [ "$(cat build/own-d/card.txt)" != "$card" ]; then
  echo "own-d began on $(cat build/own-d/card.txt), not resumed on $card" >> $OUT/log.txt; exit 0
fi
if [ $left -gt 60 ]; then
  OUT=$OUT STATE=build/own-d WHEELS= STOP_AFTER=$left WORKERS=1 bash scripts/device_bench.sh
  tar czf $OUT/bench.tgz --exclude compile-cache -C build own-d
fi
