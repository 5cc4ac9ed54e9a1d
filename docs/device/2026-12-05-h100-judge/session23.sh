#!/usr/bin/env bash
# Session 23, one device call. Part 1 (PART=judge): the new judge (held-out call sizes, inputs x16, strided
# copies) on the GPU: the best kernels the last H100 session accepted, judged again; then kb optimize on the
# two wild kernels. Part 2: the own-suite bench own-d, resumed from build/own-d.tgz, for the time left.
set -u
export PYTHONUNBUFFERED=1 KB_HOME=$PWD/build/device-home
mkdir -p build; [ -f build/own-d.tgz ] && tar xzf build/own-d.tgz -C build
FINAL=$OUT WHEELS=build/device-wheels; . scripts/device_env.sh; s=$(date +%s)
card=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1); echo "$card" > $OUT/card.txt
D=docs/device/2026-12-05-h100-optimize
r() { n=$1; shift; t=$(date +%s); timeout 150 python3 -m cli run --backend cuda --json "$@" > $OUT/$n.json 2>> $OUT/log.txt; echo "$n rc=$? $(( $(date +%s)-t )) s" >> $OUT/log.txt; }
o() { n=$1; shift; t=$(date +%s); timeout 200 python3 -m cli optimize --backend cuda --rounds 3 --stop-after 100 --run-dir /tmp/opt/$n --json "$@" > $OUT/$n.json 2>> $OUT/log.txt; echo "$n rc=$? $(( $(date +%s)-t )) s" >> $OUT/log.txt; }
if [ "${PART:-}" = judge ]; then
  r rejudge_column_scan --kernel tests/fixtures/wild/column_scan.py --call "scan(torch.randn(4096, 1024))" --candidate $D/call1/column_scan.best.py
  r rejudge_column_gather --kernel tests/fixtures/wild/column_gather.py --call "col_sum(torch.randn(8192, 4096))" --reference "lambda x: x.sum(0)" --atol 1e-3 --rtol 1e-3 --candidate $D/call2/column_gather.best.py
  r rejudge_index_add corpora/operators/index_add/task.py --candidate $D/call1/index_add.best.py
  o column_scan --kernel tests/fixtures/wild/column_scan.py --call "scan(torch.randn(4096, 1024))"
  o column_gather --kernel tests/fixtures/wild/column_gather.py --call "col_sum(torch.randn(8192, 4096))" --reference "lambda x: x.sum(0)" --atol 1e-3 --rtol 1e-3
  tar czf $OUT/opt-runs.tgz --exclude compile-cache -C /tmp opt 2>/dev/null
  for n in column_scan column_gather; do cp /tmp/opt/$n/best.py $OUT/$n.best.py 2>/dev/null; done
fi
left=$(( ${BUDGET:-440} - ($(date +%s) - s) ))
if [ -f build/own-d/card.txt ] && [ "$(cat build/own-d/card.txt)" != "$card" ]; then
  echo "own-d began on $(cat build/own-d/card.txt), not resumed on $card" >> $OUT/log.txt; exit 0
fi
if [ $left -gt 60 ]; then
  OUT=$OUT STATE=build/own-d WHEELS= STOP_AFTER=$left WORKERS=1 VS=eager STRATEGIES=progressive ROUNDS=3 \
    OPS=index_add,cross_entropy,attention,batch_norm,row_sum,mean,embedding,causal_softmax,l2_norm,row_max,kl_div,cumprod,max_pool1d,permute_3d,softplus,clamp,huber_loss,leaky_relu,mse_loss,axpy \
    bash scripts/device_bench.sh
  mkdir -p build/own-d && echo "$card" > build/own-d/card.txt
  tar czf $OUT/bench.tgz --exclude compile-cache -C build own-d
fi
