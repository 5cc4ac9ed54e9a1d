"""Who in this process takes the device memory: run a Python module with a watcher thread that polls
nvidia-smi for this process's used memory and prints the main thread's stack whenever it grows by
more than --jump-mib since the last print, with any GPU framework that has been imported by then.

The 2026-12-01 bench found a bench job holding 107,916 MiB (a fixed ~75% of the H200) while its
judge's workers ran out of memory; per-process sampling named the process, not the code.

Usage (on a GPU host): python3 scripts/trace_gpu_memory.py [--jump-mib 2048] [--stop-after-jump]
                       -m MODULE [ARGS...]
"""

from __future__ import annotations

import argparse
import os
import runpy
import subprocess
import sys
import threading
import time
import traceback

_FRAMEWORKS = ("jax", "jaxlib", "tensorflow", "cupy", "numba.cuda", "onnxruntime", "torch_xla", "paddle", "mxnet")


def used_mib(pid: int) -> int:
    out = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
                         capture_output=True, text=True, check=False).stdout
    for line in out.splitlines():
        fields = [f.strip() for f in line.split(",")]
        if len(fields) == 2 and fields[0] == str(pid):
            return int(fields[1])
    return 0


def watch(main_ident: int, jump_mib: int, stop: bool, period_s: float) -> None:
    pid, last = os.getpid(), 0
    while True:
        time.sleep(period_s)
        now = used_mib(pid)
        if now - last < jump_mib:
            continue
        loaded = [m for m in _FRAMEWORKS if m in sys.modules]
        print(f"\n=== device memory of pid {pid}: {last} -> {now} MiB; GPU frameworks imported: {loaded or 'none'}",
              file=sys.stderr)
        for ident, frame in sys._current_frames().items():  # the main thread first; others may allocate too
            if ident != threading.get_ident():
                print(f"--- thread {ident}{' (main)' if ident == main_ident else ''}", file=sys.stderr)
                print("".join(traceback.format_stack(frame)), file=sys.stderr, flush=True)
        last = now
        if stop:
            os._exit(3)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jump-mib", type=int, default=2048)
    parser.add_argument("--period-s", type=float, default=0.2)
    parser.add_argument("--stop-after-jump", action="store_true", help="exit (3) after the first report")
    parser.add_argument("-m", dest="module", required=True)
    parser.add_argument("args", nargs=argparse.REMAINDER)
    options = parser.parse_args()
    threading.Thread(target=watch, args=(threading.main_thread().ident, options.jump_mib, options.stop_after_jump,
                                         options.period_s), daemon=True).start()
    sys.argv = [options.module, *options.args]
    runpy.run_module(options.module, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
