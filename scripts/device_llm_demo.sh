#!/usr/bin/env bash
# Issue 28's end-to-end demonstration on a GPU host: `kb optimize --llm openai` against a local
# OpenAI-compatible endpoint that replays answers we wrote (scripts/llm_demo/, not a model's): a good
# rewrite of corpora/operators/gemv, which must be accepted through the whole loop (diagnosis, prompt,
# sandboxed checks, timing, confirmation), and a cheating one, which the judge must reject with its
# reason. Usage (repository root on the GPU host; carry WHEELS with the openai and distro wheels, and
# a KB home for L4):
#   OUT=/some/dir WHEELS=build/device-wheels KB_HOME=build/device-home scripts/device_llm_demo.sh
set -u
FINAL=${OUT:-/tmp/kb-device}
mkdir -p "$FINAL"
. "$(dirname "$0")/device_env.sh"
demo() {  # name, the file whose text the endpoint replies with
  python3 tests/llm_server.py --reply "$2" --url-file "$FINAL/$1.url" >> "$FINAL/log.txt" 2>&1 &
  local server=$!
  for _ in $(seq 100); do [ -s "$FINAL/$1.url" ] && break; sleep 0.1; done
  KB_LLM_BASE_URL=$(cat "$FINAL/$1.url") KB_LLM_MODEL=scripted KB_LLM_RETRIES=0 \
    python3 -m cli optimize corpora/operators/gemv/task.py --llm openai --llm-first --candidates 1 --repairs 0 \
    --rounds 1 --vs eager --warmup-ms 50 --rep-ms 100 --run-dir "$FINAL/runs/$1" --json \
    > "$FINAL/$1.json" 2> "$FINAL/$1.log"
  echo "$1: kb optimize rc=$? at $(date -u +%T)" >> "$FINAL/log.txt"
  kill "$server"
}
echo "start $(date -u +%T)" >> "$FINAL/log.txt"
demo good scripts/llm_demo/gemv_good.py
demo cheat scripts/llm_demo/gemv_cheat.py
tar czf "$FINAL/runs.tgz" -C "$FINAL" runs && rm -rf "$FINAL/runs"
