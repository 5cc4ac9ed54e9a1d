#!/usr/bin/env bash
# Session 27 on the GPU. The carried build/tb26.tgz is unpacked once (then removed, so a warm machine keeps its
# progress). MODE=import: the T import resumed (its out-of-memory verdicts judged again alone). MODE=bench: the
# T bench resumed until BUDGET. MODE=all: both, the import given IMPORT_S seconds. Always packs build/tb26 back into $OUT/tb26.tgz.
set -u
export PYTHONUNBUFFERED=1
FINAL=$OUT; s=$(date +%s); left() { echo $(( ${BUDGET:-450} - ($(date +%s) - s) )); }  # BUDGET: the call limit less 120 s (a compile-heavy round takes a minute to stop)
OPS=sum,sigmoid_adaptive_avg_pool2d,fused_mv_sigmoid_sub,scaled_add_norm,scaled_add_dot,add,relu_sqrt,matmul,addmm,tensordot_rsqrt,cos_avg_pool1d,exp_mean,erfc_sqrt,div,cos_signbit,abs,bitwise_and,cos,erf,exp,exp_sqrt,leaky_relu,log1p,ones_like,rad2deg_sqrt,reciprocal,relu,sigmoid,sqrt,sqrt_exp,sub,trunc,fused_cholesky_solve,leaky_relu_conv2d,pixel_shuffle_conv2d,relu_conv2d,spectral_norm_eig,digamma
if [ -f build/tb26.tgz ]; then rm -rf build/tb26 && tar xzf build/tb26.tgz -C build && rm -f build/tb26.tgz; fi
echo "state: $(ls build/tb26/bench/runs/progressive | wc -l) runs" >> $OUT/log.txt
if [ -d build/dwk ] && [ ! -f /tmp/kb-site/.done ]; then
  WHEELS=build/dwk; . scripts/device_env.sh; touch /tmp/kb-site/.done
else
  WHEELS=; . scripts/device_env.sh
fi
nvidia-smi --query-gpu=name --format=csv,noheader | head -1 > $OUT/card.txt
if [ "$MODE" = import ] || [ "$MODE" = all ]; then
  T=build/tritonbench-T38.tgz; [ -f $T ] || T=build/tritonbench-T.tgz
  mkdir -p /tmp/tritonbench && tar xzf $T -C /tmp/tritonbench
  python3 -m cli import tritonbench /tmp/tritonbench --out build/tb26/tasks --workers 15 --ops "$OPS" \
    --timeout 60 --stop-after ${IMPORT_S:-$(( $(left) - 60 ))} > $OUT/import.txt 2>> $OUT/log.txt
  echo "import rc=$? after $(( $(date +%s) - s )) s" >> $OUT/log.txt
fi
if [ "$MODE" = bench ] || [ "$MODE" = all ]; then
  export KB_HOME=$PWD/build/dh
  python3 -m cli bench --resume build/tb26/bench --warmup-ms 50 --rep-ms 100 --stop-after $(left) \
    > $OUT/report.md 2>> $OUT/log.txt
  echo "bench rc=$? after $(( $(date +%s) - s )) s" >> $OUT/log.txt
  cp build/tb26/bench/report.json $OUT/ 2>/dev/null
fi
tar czf $OUT/tb26.tgz --exclude .work --exclude compile-cache -C build tb26
