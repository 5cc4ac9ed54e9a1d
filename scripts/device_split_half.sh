#!/usr/bin/env bash
# Issue-7 measurement on a GPU host: scripts/synthesis_split_half.py, resumable across calls.
# Usage (repository root, on the GPU host): OUT=/some/dir STATE=build/split-half scripts/device_split_half.sh
# STATE is carried to the host and back between calls (it holds the benches and the two homes);
# the host lacks libcst: carry its cp312 wheel and set WHEELS=dir. STOP_AFTER: seconds after which
# no job or round starts (a 10-minute call: 450 leaves time to finish the rounds in flight).
set -u
FINAL=${OUT:-/tmp/kb-device}
STATE=${STATE:-build/split-half}
mkdir -p "$FINAL" "$STATE"
. "$(dirname "$0")/device_env.sh"
start=$(date +%s)
python3 scripts/synthesis_split_half.py --out "$STATE" --rounds "${ROUNDS:-3}" --workers "${WORKERS:-2}" \
  --stop-after "${STOP_AFTER:-450}" >> "$FINAL/log.txt" 2>&1
echo "split-half call rc=$? in $(( $(date +%s) - start )) s" >> "$FINAL/log.txt"
tar czf "$FINAL/split-half.tgz" --exclude compile-cache -C "$(dirname "$STATE")" "$(basename "$STATE")"
