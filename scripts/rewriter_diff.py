"""Which runs of a bench does a rewriter change touch? Rewrites every kernel the bench stored (each
run's initial kernel and the kernels its accepted rounds made) with the rewriters (diagnose/rewriters/, before 2026-12-01 diagnose/rewrite.py) as they were at
REV and as it is now, under every pattern of either and the contexts that steer the rewriters, and
lists the runs whose variants differ. Those runs would not repeat under the new code and must run
again. The others get the same variants from their stored kernels; whether they would repeat also
depends on the diagnosis and the timings, which this does not compare.

    python scripts/rewriter_diff.py REV build/bench-h200 [--json]

REV is a git revision of this repository (e.g. the commit the bench ran at).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import subprocess
import sys
import tempfile
from pathlib import Path
from types import ModuleType

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

# The contexts the loop passes that change what a rewriter does: `features` (whether num_stages is
# searched), `finding` (a shared-memory finding searches fewer stages), `fp32_rtol` (tf32 or tf32x3).
_CONTEXTS = ({}, {"features": "loop"}, {"finding": "resources.shared-memory-over-limit"}, {"fp32_rtol": 1e-3})


def _rewriter_at(rev: str) -> ModuleType:
    """The rewriters as they were at `rev`: the package diagnose/rewriters/ (from 2026-12-01), else the
    single module diagnose/rewrite.py before it, imported under a name of their own."""
    def git(*argv: str) -> str:
        return subprocess.run(["git", *argv], cwd=REPO, check=True, capture_output=True, text=True).stdout

    root = Path(tempfile.mkdtemp())
    files = git("ls-tree", "--name-only", f"{rev}:diagnose/rewriters").split() if \
        subprocess.run(["git", "cat-file", "-e", f"{rev}:diagnose/rewriters"], cwd=REPO,
                       capture_output=True).returncode == 0 else []
    if files:  # a package: its modules import each other by their absolute name, renamed here too
        (root / "rewriters_at_rev").mkdir()
        for name in files:
            text = git("show", f"{rev}:diagnose/rewriters/{name}").replace("diagnose.rewriters", "rewriters_at_rev")
            (root / "rewriters_at_rev" / name).write_text(text)
        sys.path.insert(0, str(root))
        return importlib.import_module("rewriters_at_rev")
    path = root / "rewrite_at_rev.py"
    path.write_text(git("show", f"{rev}:diagnose/rewrite.py"))
    spec = importlib.util.spec_from_file_location("rewrite_at_rev", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the class is built
    spec.loader.exec_module(module)
    return module


def _variants(rewriter: ModuleType, pattern: str, source: str, context: dict) -> list | str:
    """What one rewriter makes of one kernel; a failure is a result too (it differs from variants)."""
    try:
        return [(v.params, v.source) for v in rewriter.rewrite(pattern, source, dict(context))]
    except Exception as exc:  # noqa: BLE001 - compared, not raised
        return f"{type(exc).__name__}: {exc}"


def _stored_kernels(bench_dir: Path) -> dict[str, list[Path]]:
    """Run (condition/operator) -> its kernels: round-NNN.py, not the per-variant round-NNN.vK.py."""
    runs: dict[str, list[Path]] = {}
    for path in sorted(bench_dir.glob("runs/*/*/round-*.py")):
        if ".v" not in path.stem:
            runs.setdefault(f"{path.parent.parent.name}/{path.parent.name}", []).append(path)
    return runs


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("rev")
    parser.add_argument("bench_dir", type=Path)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    from diagnose import rewriters as now

    before = _rewriter_at(args.rev)
    runs = _stored_kernels(args.bench_dir)
    if not runs:
        print(f"no stored kernels under {args.bench_dir}/runs: is it a bench directory?", file=sys.stderr)
        return 2
    changed: dict[str, list[str]] = {}
    calls = 0
    patterns = sorted(set(now.REWRITERS) | set(before.REWRITERS))  # added or removed since REV count too
    from rich.console import Console
    from rich.progress import track

    # On a finished bench this is tens of thousands of rewriter calls: minutes, so show where it is.
    for run, kernels in track(runs.items(), description="runs", console=Console(stderr=True)):
        for kernel in kernels:
            source = kernel.read_text()
            for pattern in patterns:
                for context in _CONTEXTS:
                    calls += 1
                    if _variants(before, pattern, source, context) != _variants(now, pattern, source, context) \
                            and pattern not in changed.get(run, []):
                        changed.setdefault(run, []).append(pattern)
    result = {"rev": args.rev, "runs": len(runs), "rewriter_calls": calls, "changed": changed}
    if args.json:
        print(json.dumps(result, indent=1))
    else:
        print(f"{len(runs)} runs, {calls} rewriter calls; variants differ in {len(changed)} run(s)")
        for run, patterns in changed.items():
            print(f"  {run}: {', '.join(patterns)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
