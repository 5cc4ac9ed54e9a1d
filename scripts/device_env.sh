# Sourced by the resumable device scripts (device_bench.sh, device_split_half.sh): installs the
# carried wheels (WHEELS=dir; the GPU image lacks libcst) and points caches and PYTHONPATH at them.
# Needs FINAL (where log.txt goes) set by the caller.
if [ -n "${WHEELS:-}" ]; then
  python3 -m pip install -q --no-deps --target /tmp/kb-site "$WHEELS"/*.whl >> "$FINAL/log.txt" 2>&1
fi
export KB_CACHE_DIR=/tmp/kb-cache PYTHONPATH="/tmp/kb-site:$PWD${PYTHONPATH:+:$PYTHONPATH}"
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader >> "$FINAL/log.txt" 2>&1
