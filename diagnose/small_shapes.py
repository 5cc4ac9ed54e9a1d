"""A small-shape path for a round's variant that wins on large cases and loses on small ones.

The judge does not accept a variant that makes any timed case slower than its parent beyond the noise
(`judging.acceptable`), however large its geomean: TritonBench-T's sum lost a 3.59x variant (a grown
tile, 0.86x on 4096 elements) and a 1.61x one (a deeper pipeline, 0.95x there) that way, and the
loop kept a 1.16x. When the cases such a variant lost are exactly the smaller inputs (by the bytes the
judge handed the kernel), the round builds one more variant, the parent's code below a threshold and
the variant's above it (`rewriters.dispatch.size_dispatch`), and judges it like the others: checked on
every case, held-out ones included, and timed against the parent. Where another of the round's variants
beat the parent on every one of those small cases, its code is the small path instead of the parent's:
on the H200 the textbook matmul's small-shape path kept its initial 64x64 tile below 2 MB of inputs,
where the matmul measurement had a 64x128 tile faster at 256^3 (docs/device/2026-12-03-h200-matmul).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from diagnose.judging import Judged, verdict
from diagnose.loop_options import OptimizeOptions
from diagnose.rewriters.dispatch import size_dispatch
from harness.measurement import RunReport, geomean

__all__ = ["SizeSplit", "size_split", "small_shape_variant"]


@dataclass(frozen=True)
class SizeSplit:
    """Where a variant's timed cases split: those it lost all hold fewer input bytes than those it did not."""

    threshold: int  # inputs of at most this many bytes take the parent's path
    small: tuple[str, ...]  # the labels of the cases the variant lost
    predicted: float  # the geomean with the parent's figure (1.0) on those, the variant's on the rest


def size_split(report: RunReport, noise: float) -> SizeSplit | None:
    """The split of a candidate's timed cases by input size, or None when its losses are not the
    smallest inputs, when it lost none or all, or when a timed case's size is unknown."""
    cand = report.run("candidate")
    speedups = {label: s for label, s in report.speedups().items() if s > 0}
    if cand is None or not speedups:
        return None
    sizes = {c.label: c.input_bytes for c in cand.cases if c.label in speedups and c.input_bytes}
    if len(sizes) != len(speedups):
        return None
    lost = sorted(label for label, s in speedups.items() if s < 1 - noise)
    if not lost or len(lost) == len(speedups):
        return None
    below = max(sizes[label] for label in lost)
    above = min(size for label, size in sizes.items() if label not in lost)
    if below >= above:
        return None
    figures = [1.0 if label in lost else s for label, s in speedups.items()]
    return SizeSplit(threshold=int(math.sqrt(below * above)), small=tuple(lost),
                     predicted=geomean(figures) or 1.0)


def _small_path(judged: list[Judged], large: int, split: SizeSplit, options: OptimizeOptions
                ) -> tuple[Path, str, dict[str, float]] | None:
    """The round's variant (other than `large`) fastest on the split's small cases, with its params line and
    its figures there, where it beat the parent beyond its noise on every one of them; None where none did."""
    found: list[tuple[float, Path, str, dict[str, float]]] = []
    for j, (file, params, report, _) in enumerate(judged):
        if j == large:
            continue
        _, noise, _ = verdict(report, options)
        figures = {label: s for label, s in report.speedups().items() if label in split.small}
        if len(figures) == len(split.small) and all(s > 1 + noise for s in figures.values()):
            found.append((geomean(figures.values()) or 1.0, file, params, figures))
    if not found:
        return None
    _, file, params, figures = max(found, key=lambda x: x[0])
    return file, params, figures


def small_shape_variant(directory: Path, idx: int, parent_source: str, judged: list[Judged], entry: str,
                        options: OptimizeOptions) -> tuple[Path, str] | None:
    """Round `idx`'s most promising rejected variant with the parent's code on the small inputs it lost (or
    the round's variant that beat the parent on each of them), written beside the round's variants (its
    file and its params line); None when no rejected variant would beat the round's best accepted one (or
    1 + noise) that way, or the two cannot share a module. A round gets one: a resumed round that has it
    already gets none."""
    listing = directory / f"round-{idx:03d}.variants"
    if listing.is_file() and any(line.startswith("{'dispatch'") for line in listing.read_text().splitlines()):
        return None
    best = max((bar[0] for *_, bar in judged if bar[0] is not None), default=1.0)
    options_for: list[tuple[float, int, SizeSplit]] = []
    for i, (_, _, report, bar) in enumerate(judged):
        figure, noise, _ = verdict(report, options)
        if bar[0] is not None or figure is None:
            continue
        split = size_split(report, noise)
        if split is not None and split.predicted > max(best, 1 + noise):
            options_for.append((split.predicted, i, split))
    if not options_for:
        return None
    predicted, i, split = max(options_for, key=lambda x: x[0])
    file, params, report, _ = judged[i]
    small = _small_path(judged, i, split, options)
    large_figures = [s for label, s in report.speedups().items() if label not in split.small]
    small_figures = list(small[2].values()) if small else [1.0] * len(split.small)
    predicted = geomean([*large_figures, *small_figures]) or predicted
    small_source = small[0].read_text() if small else parent_source
    source = size_dispatch(small_source, file.read_text(), entry, split.threshold)
    if source is None and small is not None:  # the two variants cannot share a module: the parent's code, then
        small, predicted = None, split.predicted
        source = size_dispatch(parent_source, file.read_text(), entry, split.threshold)
    if source is None:
        return None
    path = directory / f"round-{idx:03d}.v{len(list(directory.glob(f'round-{idx:03d}.v*.py')))}.py"
    path.write_text(source)
    below = small[0].name if small else "the parent"
    # "over": the large inputs' variant; "under": the small inputs' where it is one of the round's, so that
    # the round credits the rewrites of both (diagnose/composition.py patterns_of).
    line = repr({"dispatch": f"{file.name} above {split.threshold} input bytes, {below} at or below",
                 "small": list(split.small), "predicted": round(predicted, 3), "over": params,
                 **({"under": small[1]} if small else {})})
    with listing.open("a") as out:
        out.write(line + "\n")
    return path, line
