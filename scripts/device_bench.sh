#!/usr/bin/env bash
# Issue-8 suite run on a GPU host: `kb bench` over corpora/operators under the three strategies,
# resumable across calls of at most ten minutes (the state is carried to the host and back).
# Usage (repository root, on the GPU host):
#   OUT=/some/dir STATE=build/bench-h200 WHEELS=build/device-opt scripts/device_bench.sh
# STATE holds the bench (bench.json, runs/, logs/); carry it in and untar $OUT/bench.tgz over it after
# each call. GPU_MEMLOG=1 samples per-process device memory (below). STOP_AFTER: seconds after which
# no job or round starts (450 leaves a 10-minute call time to finish rounds in flight). KB_HOME: a KB
# home carried along (pattern catalog, compiler index) so that diagnoses can reach L4 on the host.
# VS: the PyTorch stand-ins timed at the end of each run (default "eager compiled"); a bench times them
# in its first condition only. WARMUP_MS / REP_MS: do_bench windows of each timing (default 50 / 100,
# a third of the harness's: scripts/timing_noise.py on the first calls' runs showed the noise is drift
# between windows, not sampling; docs/benchmarks.md). The host lacks libcst and platformdirs: WHEELS
# holds their cp312 wheels. RETIME=op,op: finished runs that take their end-of-run measurement again
# (after their task's stand-in changed; once, in the first call that resumes).
set -u
FINAL=${OUT:-/tmp/kb-device}
STATE=${STATE:-build/bench-h200}
mkdir -p "$FINAL" "$(dirname "$STATE")"
. "$(dirname "$0")/device_env.sh"
start=$(date +%s)
# GPU_MEMLOG=1: every 3 s, each process holding device memory (pid, parent, MiB, command line) into
# $FINAL/gpu-memory.txt: the 2026-12-01 bench ran out of device memory in a way no log explained.
if [ "${GPU_MEMLOG:-0}" = 1 ]; then
  (while sleep 3; do
     echo "t $(date +%T)"
     nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader,nounits | while IFS=', ' read -r pid mib; do
       echo "$pid ppid=$(awk '/^PPid/{print $2}' /proc/"$pid"/status 2>/dev/null) mib=$mib $(tr '\0' ' ' < /proc/"$pid"/cmdline 2>/dev/null | cut -c1-160)"
     done
     ps -o pid=,ppid=,args= -C python3 | cut -c1-160 | sed 's/^/  proc /'  # who forked whom
   done) >> "$FINAL/gpu-memory.txt" 2>&1 &
  memlog=$!
fi
vs=(); for ref in ${VS:-eager compiled}; do vs+=(--vs "$ref"); done
windows=(--warmup-ms "${WARMUP_MS:-50}" --rep-ms "${REP_MS:-100}")
if [ -f "$STATE/bench.json" ]; then
  python3 -m cli bench --resume "$STATE" "${windows[@]}" ${RETIME:+--retime "$RETIME"} --workers "${WORKERS:-2}" --stop-after "${STOP_AFTER:-450}" \
    > "$FINAL/report.md" 2>> "$FINAL/log.txt"
else
  python3 -m cli bench --bench-dir "$STATE" --strategy "${STRATEGIES:-progressive,profile-only,always-deep}" \
    --rounds "${ROUNDS:-3}" "${vs[@]}" "${windows[@]}" --workers "${WORKERS:-2}" --stop-after "${STOP_AFTER:-450}" ${OPS:+--ops "$OPS"} \
    > "$FINAL/report.md" 2>> "$FINAL/log.txt"
fi
echo "bench call rc=$? in $(( $(date +%s) - start )) s" >> "$FINAL/log.txt"
[ -n "${memlog:-}" ] && kill "$memlog"
tar czf "$FINAL/bench.tgz" --exclude compile-cache -C "$(dirname "$STATE")" "$(basename "$STATE")"
