set -u
export PYTHONUNBUFFERED=1 KB_HOME=$PWD/build/device-home
mkdir -p build $OUT/r; tar xzf build/own-d.tgz -C build
FINAL=$OUT WHEELS=build/device-wheels; . scripts/device_env.sh; s=$(date +%s)
D=docs/device/2026-12-05-h100-optimize
r() { n=$1; shift; timeout 100 python3 -m cli run --backend cuda --json "$@" > $OUT/r/$n.json 2>> $OUT/log.txt; echo "$n rc=$?" >> $OUT/log.txt; }
r rejudge_column_scan --kernel tests/fixtures/wild/column_scan.py --call "scan(torch.randn(4096, 1024))" --candidate $D/call1/column_scan.best.py
r rejudge_column_gather --kernel tests/fixtures/wild/column_gather.py --call "col_sum(torch.randn(8192, 4096))" --reference "lambda x: x.sum(0)" --atol 1e-3 --rtol 1e-3 --candidate $D/call2/column_gather.best.py
left=$(( ${BUDGET:-400} - ($(date +%s) - s) ))
OUT=$OUT/r STATE=build/own-d WHEELS= STOP_AFTER=$left WORKERS=1 bash scripts/device_bench.sh
cat $OUT/r/log.txt >> $OUT/log.txt
tar czf $OUT/bench.tgz --exclude compile-cache -C build own-d
tar czf $OUT/r.tgz -C $OUT r
