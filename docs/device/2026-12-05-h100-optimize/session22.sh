# Session 22, call 1: three kb optimize runs the CPU work since 25913d4 changed, then the own-c bench
# resumed for the time left, only where the card is the H200 the bench began on.
export PYTHONUNBUFFERED=1 KB_HOME=$PWD/build/device-home
mkdir -p build; tar xzf build/own-c.tgz -C build
FINAL=$OUT WHEELS=build/device-wheels; . scripts/device_env.sh; s=$(date +%s)
git log --oneline -1 >> $OUT/log.txt 2>&1 || true
o() { n=$1; shift; t=$(date +%s); timeout 200 python3 -m cli optimize --backend cuda --rounds 3 --stop-after 100 --run-dir /tmp/opt/$n --json "$@" > $OUT/$n.json 2>> $OUT/log.txt; echo "$n rc=$? $(( $(date +%s)-t )) s" >> $OUT/log.txt; }
for job in ${JOBS:-index_add column_scan}; do
  case $job in
    index_add) o index_add corpora/operators/index_add/task.py ;;
    column_scan) o column_scan --kernel tests/fixtures/wild/column_scan.py --call "scan(torch.randn(4096, 1024))" ;;
    column_gather) o column_gather --kernel tests/fixtures/wild/column_gather.py --call "col_sum(torch.randn(8192, 4096))" --reference "lambda x: x.sum(0)" --atol 1e-3 --rtol 1e-3 ;;
  esac
done
tar czf $OUT/opt-runs.tgz --exclude compile-cache -C /tmp opt 2>/dev/null
left=$(( ${BUDGET:-440} - ($(date +%s) - s) ))
if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200 && [ $left -gt 60 ]; then
  OUT=$OUT STATE=build/own-c WHEELS= STOP_AFTER=$left WORKERS=1 bash scripts/device_bench.sh
else
  echo "own-c not resumed: $(nvidia-smi --query-gpu=name --format=csv,noheader), $left s left" >> $OUT/log.txt
fi
