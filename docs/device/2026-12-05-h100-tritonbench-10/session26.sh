#!/usr/bin/env bash
# Session 26 on the GPU. MODE=import: TritonBench-T's 38 operators imported again (the bench state was lost),
# then eviction-hints variants timed against their kernels until BUDGET. MODE=bench: the T bench, created or resumed.
set -u
export PYTHONUNBUFFERED=1
FINAL=$OUT; s=$(date +%s); left() { echo $(( ${BUDGET:-540} - ($(date +%s) - s) )); }
OPS=sum,sigmoid_adaptive_avg_pool2d,fused_mv_sigmoid_sub,scaled_add_norm,scaled_add_dot,add,relu_sqrt,matmul,addmm,tensordot_rsqrt,cos_avg_pool1d,exp_mean,erfc_sqrt,div,cos_signbit,abs,bitwise_and,cos,erf,exp,exp_sqrt,leaky_relu,log1p,ones_like,rad2deg_sqrt,reciprocal,relu,sigmoid,sqrt,sqrt_exp,sub,trunc,fused_cholesky_solve,leaky_relu_conv2d,pixel_shuffle_conv2d,relu_conv2d,spectral_norm_eig
[ -f build/tb26.tgz ] && tar xzf build/tb26.tgz -C build
mkdir -p build/tb26
if [ "$MODE" = import ]; then
  WHEELS=build/device-wheels; . scripts/device_env.sh
  nvidia-smi --query-gpu=name --format=csv,noheader | head -1 > $OUT/card.txt
  mkdir -p /tmp/tritonbench && tar xzf build/tritonbench-T.tgz -C /tmp/tritonbench
  python3 -m cli import tritonbench /tmp/tritonbench --out build/tb26/tasks --workers 15 --ops "$OPS" \
    --timeout 60 --stop-after $(( $(left) - 80 )) > $OUT/import.txt 2>> $OUT/log.txt
  echo "import rc=$? after $(( $(date +%s) - s )) s" >> $OUT/log.txt
  for f in build/evict/*.py; do
    [ "$(left)" -lt 45 ] && { echo "$f: not timed" >> $OUT/log.txt; continue; }
    op=$(basename $f .py); op=${op%_ev*}
    timeout $(( $(left) - 10 )) python3 -m cli run corpora/operators/$op/task.py --candidate $f --backend cuda --seeds 1 --json \
      > $OUT/$(basename $f .py).json 2> $OUT/$(basename $f .py)-log.txt
    echo "$f rc=$?" >> $OUT/log.txt
  done
else
  export KB_HOME=$PWD/build/dh
  WHEELS=build/device-wheels-kb; . scripts/device_env.sh
  nvidia-smi --query-gpu=name --format=csv,noheader | head -1 > $OUT/card.txt
  w=(--warmup-ms 50 --rep-ms 100)
  if [ -f build/tb26/bench/bench.json ]; then
    python3 -m cli bench --resume build/tb26/bench "${w[@]}" --stop-after $(left) > $OUT/report.md 2>> $OUT/log.txt
  else
    python3 -m cli bench --suite build/tb26/tasks --bench-dir build/tb26/bench --strategy progressive --ops "$OPS" \
      --rounds 3 --vs eager --vs compiled "${w[@]}" --stop-after $(left) > $OUT/report.md 2>> $OUT/log.txt
  fi
  echo "bench rc=$? after $(( $(date +%s) - s )) s" >> $OUT/log.txt
fi
tar czf $OUT/tb26.tgz --exclude .work --exclude compile-cache -C build tb26
