#!/usr/bin/env bash
# Issue 26 on a GPU host: import TritonBench-T's first drafts (checked on the GPU), then bench them,
# resumable across calls of at most ten minutes: the state (import ledger, task folders, bench) is
# carried to the host and back.
#
# Here, once: the T half of a TritonBench clone as a tarball (4 MB; the G half is never packed):
#   git -C TRITONBENCH_CLONE archive --format=tar HEAD data/TritonBench_T_v1 performance_metrics/perf_T \
#     LLM_generated/Bench_T_general_purpose LLM_generated/Bench_T_coder_specific | gzip -9 > build/tritonbench-T.tgz
# Each call (repository root on the GPU host; carry build/device-wheels, build/tritonbench-T.tgz until the
# import is finished, $STATE, and a KB home with KB_HOME for L4):
#   OUT=/some/dir STATE=build/tb-h200 WHEELS=build/device-wheels scripts/device_tritonbench.sh
# then untar $OUT/state.tgz over build/ here. A call may carry 64 MiB in all (the tracked tree with it): once
# the state folder tips the sum over, carry its tarball instead (`tar czf build/tb-h200.tgz -C build tb-h200`,
# half a megabyte where the folder is 4.6 MB) and untar it first on the host:
#   tar xzf build/tb-h200.tgz -C build && OUT=... STATE=build/tb-h200 ... scripts/device_tritonbench.sh The import runs until it is done, then the bench starts
# (BENCH=0 stops after the import). STOP_AFTER: seconds after which no check, job or round starts;
# IMPORT_TIMEOUT: seconds one draft's check may take (default 90: a hung draft holds a worker that long,
# and STOP_AFTER + IMPORT_TIMEOUT must end inside the call's ten minutes).
set -u
FINAL=${OUT:-/tmp/kb-device}
STATE=${STATE:-build/tb-h200}
TARBALL=${TARBALL:-build/tritonbench-T.tgz}
STOP_AFTER=${STOP_AFTER:-430}
# IMPORT_OPS / BENCH_OPS: comma-separated operators the import / the bench take (default: all); a later
# call's BENCH_OPS adds the operators the bench does not have yet (a bench run session by session).
# BENCH_NAME: the bench's folder under $STATE (default bench): a second bench over the same tasks (the
# other strategies, once the first is done) lives beside it, e.g. BENCH_NAME=bench-others
# STRATEGIES=profile-only,always-deep; `kb bench-report A B` puts them side by side.
# RETIME: comma-separated finished operators whose end-of-run timing a resumed bench measures again.
BENCH_NAME=${BENCH_NAME:-bench}
mkdir -p "$FINAL" "$STATE"
. "$(dirname "$0")/device_env.sh"
start=$(date +%s)
left() { echo $(( STOP_AFTER - ($(date +%s) - start) )); }
# A finished import (its IMPORT.md and the bench under way) is run again only where the tarball is carried: it
# resumes, judging only the drafts left undecided (out of memory beside other checks, a lost folder), which
# costs seconds; without the tarball the call goes straight to the bench. A draft judged again that passes takes
# its operator's task folder, and the resumed bench sets that operator's runs aside (stale: docs/bench.md) and
# runs the draft the import chose.
if [ -f "$STATE/tasks/IMPORT.md" ] && ls "$STATE"/*/bench.json > /dev/null 2>&1 && [ ! -f "$TARBALL" ]; then
  echo "import finished earlier: $(head -1 "$STATE/tasks/IMPORT.md")" > "$FINAL/import.txt"
else
  mkdir -p /tmp/tritonbench && tar xzf "$TARBALL" -C /tmp/tritonbench
  python3 -m cli import tritonbench /tmp/tritonbench --out "$STATE/tasks" --workers "${IMPORT_WORKERS:-4}" \
    ${IMPORT_OPS:+--ops "$IMPORT_OPS"} \
    --timeout "${IMPORT_TIMEOUT:-90}" --stop-after "$(left)" > "$FINAL/import.txt" 2>> "$FINAL/log.txt"
  echo "import rc=$? after $(( $(date +%s) - start )) s" >> "$FINAL/log.txt"
fi
if [ "${BENCH:-1}" = 1 ] && ! grep -q "not finished" "$FINAL/import.txt" && [ "$(left)" -gt 60 ]; then
  windows=(--warmup-ms "${WARMUP_MS:-50}" --rep-ms "${REP_MS:-100}")
  if [ -f "$STATE/$BENCH_NAME/bench.json" ]; then
    python3 -m cli bench --resume "$STATE/$BENCH_NAME" ${BENCH_OPS:+--ops "$BENCH_OPS"} ${RETIME:+--retime "$RETIME"} "${windows[@]}" \
      --stop-after "$(left)" > "$FINAL/report.md" 2>> "$FINAL/log.txt"
  else
    python3 -m cli bench --suite "$STATE/tasks" --bench-dir "$STATE/$BENCH_NAME" --strategy "${STRATEGIES:-progressive}" \
      ${BENCH_OPS:+--ops "$BENCH_OPS"} \
      --rounds "${ROUNDS:-5}" --vs eager --vs compiled "${windows[@]}" --stop-after "$(left)" \
      > "$FINAL/report.md" 2>> "$FINAL/log.txt"
  fi
  echo "bench rc=$? after $(( $(date +%s) - start )) s" >> "$FINAL/log.txt"
fi
# The failed drafts' folders (.work) stay on the host: the ledger is what resumes, and they are many.
tar czf "$FINAL/state.tgz" --exclude .work --exclude compile-cache -C "$(dirname "$STATE")" "$(basename "$STATE")"
