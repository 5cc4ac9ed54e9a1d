"""L1 on the launch the user makes: findings from the grid and the arguments' values, and the source
rules' suspicions checked against them. Compiles nothing but the cases that ask for L3."""

from __future__ import annotations

import pytest
from conftest import FIXTURES

from diagnose.bottleneck import classify
from diagnose.engine import diagnose
from diagnose.features import kernel_features
from diagnose.launch_triage import launch_triage
from diagnose.launch_values import trip_count
from diagnose.records import EvidenceLog
from diagnose.render import to_markdown
from diagnose.request import KernelInput, request_from
from diagnose.triage import triage
from diagnose.work import kernel_work
from harness.capture import intercept_call
from harness.launches import LaunchFacts, largest_power_of_two_divisor
from harness.measurement import CaseResult, KernelRun, Roofline, RunReport, Timing
from harness.profilers import NCU_SECTORS
from harness.roofline import place

WILD = FIXTURES / "wild"
GOLD = FIXTURES.parent.parent / "corpora" / "diagnosis" / "nvidia"


def l1(path, call):
    """L1's findings and notes for `call`: the source rules, then the launch's."""
    facts = intercept_call(path, call).facts()
    log, notes = EvidenceLog(), []
    feats = kernel_features(path)
    found = launch_triage(feats, facts, triage(feats, log), log, notes)
    return found, notes, log, facts


def test_launch_facts_hold_the_grid_the_values_and_the_options():
    (facts,) = intercept_call(WILD / "column_scan.py", "scan(torch.randn(512, 1000))").facts()
    assert facts.kernel == "_scan" and facts.grid == (8,) and facts.programs == 8
    assert facts.integers()["T"] == 512 and facts.integers()["D"] == 1000 and facts.integers()["BLOCK"] == 128
    assert facts.tensor("X")["dtype"] == "float32" and facts.element_size("X") == 4
    assert "X" in facts.divisible_16 and "D" not in facts.divisible_16  # 1000 is not a multiple of 16
    assert LaunchFacts.from_dict(facts.to_dict()) == facts


def test_a_grid_that_cannot_fill_the_device_outranks_what_each_program_does():
    found, _, log, _ = l1(WILD / "column_scan.py", "scan(torch.randn(4096, 1024))")
    idle = next(f for f in found if f.kind == "parallelism.grid-underfilled")
    assert idle.confidence >= 0.9 and idle.gain > 4
    assert "8 program(s) for 132 SMs" in idle.title
    claim = next(e.claim for e in log.items if e.id == idle.evidence[0])
    assert "grid 8" in claim and "132 SMs" in claim
    answer = diagnose(request_from(KernelInput(kernel=str(WILD / "column_scan.py"), call="scan(torch.randn(4096, 1024))")),
                      None, level_max="L1")
    assert answer.findings[0].kind == "parallelism.grid-underfilled"  # above pipelining.none
    text = to_markdown(answer)  # its pattern's preconditions are printed, as `kb diagnose` prints them
    assert "split-work-over-programs" in text and "the split work can be combined" in text


def test_the_wrappers_own_pytorch_work_is_seen_beside_its_launch():
    path = FIXTURES / "wrapper_work" / "scaled_add.py"
    n = 1 << 20
    found, _, log, facts = l1(path, f"add(torch.randn({n}), torch.randn({n}), 2.0)")
    # y * alpha before the launch: read 4 MB, write 4 MB; making the inputs is the call's, not the wrapper's.
    assert facts[0].wrapper_work == (("mul", 1, 8 * n),)
    work = next(f for f in found if f.kind == "host.torch-work")
    assert "aten.mul (8.4 MB)" in work.title and work.gain == pytest.approx((12 * n + 8 * n) / (12 * n), abs=0.01)
    assert "12.6 MB" in next(e.claim for e in log.items if e.id == work.evidence[0])
    answer = diagnose(request_from(KernelInput(kernel=str(path), call=f"add(torch.randn({n}), torch.randn({n}), 2.0)")),
                      None, level_max="L1")
    assert answer.findings[0].kind == "host.torch-work" and "fold-wrapper-work" in to_markdown(answer)
    # No IR stage shows the wrapper's work: a deeper diagnosis keeps it (L3 dropped it as a suspicion the
    # IR does not confirm, so the H200 bench's add never tried the fold).
    deep = diagnose(request_from(KernelInput(kernel=str(path), call=f"add(torch.randn({n}), torch.randn({n}), 2.0)")),
                    None, strategy="always-deep", level_max="L3")
    assert "L3" in deep.levels and any(f.kind == "host.torch-work" for f in deep.findings)
    # The same kernel launched by a wrapper that does nothing else: no finding.
    clean, _, _, facts = l1(path, f"add_clean(torch.randn({n}), torch.randn({n}))")
    assert facts[0].wrapper_work == () and not any(f.kind == "host.torch-work" for f in clean)


def test_few_programs_over_little_work_are_not_a_parallelism_problem():
    found, _, _, _ = l1(WILD / "column_scan.py", "scan(torch.randn(64, 1024))")  # 0.5 MB: launch-sized
    assert not any(f.kind.startswith("parallelism") for f in found)


def test_lanes_a_stride_apart_are_uncoalesced_and_unit_stride_lanes_are_not():
    found, _, log, _ = l1(WILD / "column_gather.py", "col_sum(torch.randn(4096, 3000))")
    (bad,) = [f for f in found if f.kind == "memory.uncoalesced"]
    assert bad.kernel_lines == [14] and bad.gain == 8.0  # 4 useful bytes per 32-byte sector
    assert "3000 elements (12000 bytes)" in next(e.claim for e in log.items if e.id == bad.evidence[0])
    found, _, _, _ = l1(WILD / "column_scan.py", "scan(torch.randn(512, 1000))")  # t * D + cols: lanes adjacent
    assert not any(f.kind == "memory.uncoalesced" for f in found)
    found, _, _, _ = l1(WILD / "column_gather.py", "col_sum(torch.randn(4096, 1))")  # stride 1: contiguous
    assert not any(f.kind == "memory.uncoalesced" for f in found)


def test_a_pointer_moved_in_place_keeps_its_terms_when_lanes_are_read():
    """attorch's linear kernel moves its weight pointer along the unit-stride axis before the loop
    (`W += stride * cols[None, :]`); reading the load as `W + stride_k * rows[:, None]` alone made a
    coalesced tile 'uncoalesced' (lanes 28,672 bytes apart) at 90% of the GEMM ceiling. A row pointer
    moved by a scalar (`X += row * stride`) still shows a strided column read."""
    moved = WILD / "moved_pointers.py"
    found, _, _, _ = l1(moved, "double(torch.randn(512, 1000))")
    assert not any(f.kind == "memory.uncoalesced" for f in found)
    found, _, log, _ = l1(moved, "row_sums(torch.randn(1000, 512).t())")  # columns 512 elements apart
    (bad,) = [f for f in found if f.kind == "memory.uncoalesced"]
    assert bad.kernel_lines == [34]
    assert "512 elements (2048 bytes)" in next(e.claim for e in log.items if e.id == bad.evidence[0])
    found, _, _, _ = l1(moved, "row_sums(torch.randn(512, 1000))")
    assert not any(f.kind == "memory.uncoalesced" for f in found)


def test_a_loop_that_runs_once_at_this_launch_is_no_pipelining_problem():
    found, notes, _, _ = l1(GOLD / "streaming_rowsum.py", "row_sum(torch.randn(64, 1024))")  # N == BLOCK
    assert not any(f.kind == "pipelining.none" for f in found)
    assert any("runs 1 time(s)" in n for n in notes)
    found, _, log, _ = l1(GOLD / "streaming_rowsum.py", "row_sum(torch.randn(64, 8192))")
    loop = next(f for f in found if f.kind == "pipelining.none")
    assert any("runs 8 iterations" in e.claim for e in log.items if e.id in loop.evidence)


def test_an_ieee_dot_on_half_operands_is_not_suspected_of_fma():
    found, notes, _, _ = l1(WILD / "half_ieee_dot.py", "matmul(torch.randn(256, 256).half(), torch.randn(256, 256).half())")
    assert not any(f.kind == "dot.fma" for f in found) and any("float16" in n for n in notes)
    found, _, _, _ = l1(GOLD / "fp32_dot_ieee.py", "matmul(torch.randn(256, 256), torch.randn(256, 256))")
    assert any(f.kind == "dot.fma" for f in found)


@pytest.mark.parametrize("bounds, values, trips", [
    ("0, N, BLOCK", {"N": 8192, "BLOCK": 1024}, 8), ("0, N, BLOCK", {"N": 8193, "BLOCK": 1024}, 9),
    ("T", {"T": 7}, 7), ("0, tl.cdiv(K, BK)", {"K": 100, "BK": 32}, 4), ("0, N, BLOCK", {"BLOCK": 4}, None),
    ("start, end, -1", {"start": 5, "end": 0}, 5),
])
def test_trip_counts_evaluate_the_bounds_with_the_launchs_integers(bounds, values, trips):
    assert trip_count(bounds, values) == trips


def test_hints_are_the_ones_true_at_this_launch():
    assert [largest_power_of_two_divisor(v) for v in (1000, 3000, 4096, 7, 0)] == [8, 8, 16, 1, 16]
    answer = diagnose(request_from(KernelInput(kernel=str(WILD / "wildpkg" / "ops" / "rms_norm.py"),
                                               call="RMSNormFunction.apply(torch.randn(64, 3000), torch.randn(3000))")),
                      None, strategy="always-deep", level_max="L3")
    scalar = next(f for f in answer.findings if f.kind == "vectorization.divisibility")
    assert "tl.multiple_of(stride, 8) holds, 16 would be false" in scalar.explanation


def _report(task: str) -> RunReport:
    """A measured run of a memory-bound kernel at 90% of the copy roofline."""
    timing = Timing(median_us=40.0, p20_us=39.0, p80_us=41.0, reps=100)
    roof = Roofline(bytes=2.1e6, flops=5.2e5, achieved_gbps=3600.0, achieved_tflops=0.05, bound="memory", fraction=0.9)
    case = CaseResult(case={}, label="default", seeds=1, timing=timing, roofline=roof)
    return RunReport(task=task, device="NVIDIA H200", backend="cuda", ceilings={"copy_gbps": 4000.0},
                     runs=[KernelRun(role="baseline", source=task, cases=[case])])


def test_measurements_at_hand_are_weighed_before_l1_stops_and_can_contradict_it():
    """Alone, L1 stops on the unpipelined loop (confident, low-risk pattern); with a run measured near the
    copy roofline, it goes on to L2, where the measurement contradicts the memory-side hypothesis."""
    kernel = KernelInput(kernel=str(GOLD / "streaming_rowsum.py"), call="row_sum(torch.randn(64, 8192))")
    alone = diagnose(request_from(kernel), None)
    assert alone.stopped_at == "L1" and alone.findings[0].kind == "pipelining.none"
    measured = diagnose(request_from(kernel, report=_report(str(GOLD / "streaming_rowsum.py"))), None, level_max="L2")
    steps = [(e.level, e.action) for e in measured.escalations]
    assert ("L1", "escalate") in steps and "measurements are at hand" in measured.escalations[0].reason
    assert "L2" in measured.levels
    assert not any(f.kind == "pipelining.none" and f.defect for f in measured.findings)  # near the roof: not the cause


def _run(cases: list[tuple[str, float, float | None, float | None]], profile: dict | None = None) -> RunReport:
    """A measured baseline: (label, median us, formula bytes, formula flops) per case."""
    ceilings = {"copy_gbps": 4000.0, "matmul_bf16_tflops": 700.0, "matmul_fp16_tflops": 700.0,
                "matmul_fp32_tflops": 50.0}
    results = []
    for label, us, nbytes, flops in cases:
        timing = Timing(median_us=us, p20_us=us, p80_us=us, reps=100)
        roof = place(nbytes, flops, us * 1e-6, ceilings, "fp16") if (nbytes or flops) else None
        results.append(CaseResult(case={}, label=label, seeds=1, timing=timing, roofline=roof, profile=profile))
    return RunReport(task="t", device="NVIDIA H200", backend="cuda", ceilings=ceilings,
                     runs=[KernelRun(role="baseline", source="t", cases=results)])


def _work(call: str):
    return kernel_work(intercept_call(WILD / "half_ieee_dot.py", call).facts())


GEMM = "matmul(torch.randn(2048, 2048).half(), torch.randn(2048, 2048).half())"


def test_the_kernels_own_work_is_its_dots_and_its_tensors():
    work = _work(GEMM)
    assert work.flops == 2 * 2048**3 and work.bytes == 3 * 2048 * 2048 * 2 and work.dtype == "fp16"


def test_dots_that_are_no_gemm_of_the_operands_take_their_flops_from_the_ir_tiles_and_loops():
    gram = intercept_call(WILD / "gram.py", "gram(torch.randn(256, 128).half())")
    assert not kernel_work(gram.facts()).complete  # X @ X[:64].T: no two of its tensors are A and B
    work = kernel_work(gram.facts(), gram.compile())
    # 4 programs x 4 trips of a 64x64x32 tile: 2 * 256 * 64 * 128
    assert work.complete and work.flops_from == "ir" and work.flops == 2 * 256 * 64 * 128
    causal = intercept_call(WILD / "gram.py", "causal_gram(torch.randn(256, 128).half())")
    assert not kernel_work(causal.facts(), causal.compile()).complete  # a loop bound on the program id
    # A dot in a @triton.jit helper: the kernel's loop around the call is not around the dot's line, so the
    # count would miss its trips (4x here); no figure rather than a wrong one.
    helper = intercept_call(WILD / "gram.py", "helper_gram(torch.randn(256, 128).half())")
    assert not kernel_work(helper.facts(), helper.compile()).complete


def test_a_gemm_whose_task_formula_is_off_is_placed_by_its_own_work_not_called_memory_bound():
    wrong = _run([("n=2048", 40.0, 5e7, 2 * 2048**3 / 100)])  # flops 100x too few: it looks memory-bound
    log = EvidenceLog()
    alone = classify(wrong, EvidenceLog())
    assert any(f.kind == "profile.memory-bound" for f in alone)  # what the formula alone concludes
    found = classify(wrong, log, _work(GEMM))
    assert not any(f.kind == "profile.memory-bound" for f in found)
    said = next(e.claim for e in log.items if "off the kernel's own work" in e.claim)
    assert "compute-bound" in said and "fp16 inputs" in said


def test_a_run_without_a_formula_is_placed_by_the_kernels_work():
    log = EvidenceLog()
    classify(_run([("default", 400.0, None, None)]), log, _work(GEMM))
    assert any("no bytes/flops formula" in e.claim and "compute-bound" in e.claim for e in log.items)


def test_time_that_does_not_follow_the_work_is_host_bound():
    flat = _run([("n=1k", 30.0, 1e6, None), ("n=16k", 31.0, 1.6e7, None), ("n=256k", 33.0, 2.56e8, None)])
    (host,) = [f for f in classify(flat, EvidenceLog()) if f.kind == "profile.host-bound"]
    assert "does not follow the work" in host.title
    busy = _run([("n=1k", 60.0, 1e6, None)], profile={"kernel": "k", "source": "ncu", "duration_us": 6.0})
    (host,) = [f for f in classify(busy, EvidenceLog()) if f.kind == "profile.host-bound"]
    assert host.gain == 7.5 and "10%" in host.title  # 60 us down to a launch (8 us) at best
    grows = _run([("n=1k", 10.0, 1e6, None), ("n=16k", 40.0, 1.6e7, None), ("n=256k", 300.0, 2.56e8, None)])
    assert not any(f.kind == "profile.host-bound" for f in classify(grows, EvidenceLog()))


def test_a_fixed_cost_at_the_small_sizes_is_host_bound_though_the_large_ones_follow_the_work():
    # A sync in the wrapper: ~150 us at every size up to 8M elements, then the bytes take over.
    sizes = [("n=4k", 156.5, 4.9e4), ("n=64k", 153.7, 7.9e5), ("n=1m", 159.4, 1.3e7), ("n=8m", 172.4, 1e8),
             ("n=128m", 634.8, 1.6e9)]
    log = EvidenceLog()
    (host,) = [f for f in classify(_run([(n, us, b, None) for n, us, b in sizes]), log) if f.kind == "profile.host-bound"]
    assert host.title.endswith("from case n=4k to n=8m")
    assert any("4 of the 5 timed cases (n=4k to n=8m)" in e.claim for e in log.items if e.id == host.evidence[0])
    # the run's geomean if the four flat cases fell to a launch (8 us) and the last stayed
    assert host.gain == round((156.5 * 153.7 * 159.4 * 172.4 / 8**4) ** (1 / 5), 2)
    # The same draft measured again, its smallest case slow by noise: the floor is still there.
    noisy = [(n, us, b) for (n, _, b), us in zip(sizes, (227.3, 115.9, 116.9, 145.1, 614.5), strict=True)]
    (host,) = [f for f in classify(_run([(n, us, b, None) for n, us, b in noisy]), EvidenceLog())
               if f.kind == "profile.host-bound"]
    assert host.title.endswith("from case n=64k to n=8m")
    # Two sizes alone, a flat pair whose work barely differs, or a floor the geomean would not feel: nothing.
    assert not any(f.kind == "profile.host-bound"
                   for f in classify(_run([(n, us, b, None) for n, us, b in sizes[:2]]), EvidenceLog()))
    near = [("a", 20.0, 1e6), ("b", 21.0, 2e6), ("c", 90.0, 6e7)]
    assert not any(f.kind == "profile.host-bound"
                   for f in classify(_run([(n, us, b, None) for n, us, b in near]), EvidenceLog()))
    launches = [("a", 8.5, 1e5), ("b", 9.0, 1.6e6), ("c", 30.0, 6e7), ("d", 300.0, 1e9)]
    assert not any(f.kind == "profile.host-bound"
                   for f in classify(_run([(n, us, b, None) for n, us, b in launches]), EvidenceLog()))


def test_ncu_sectors_per_request_show_uncoalesced_accesses():
    metrics = {NCU_SECTORS["load"][0]: 32e6, NCU_SECTORS["load"][1]: 1e6}
    report = _run([("default", 100.0, 1e8, None)], profile={"kernel": "k", "source": "ncu", "metrics": metrics})
    (bad,) = [f for f in classify(report, EvidenceLog()) if f.kind == "memory.uncoalesced"]
    assert bad.level == "L2" and bad.gain == 2.0  # 32 sectors where a coalesced 16-byte-lane warp moves 16
    metrics[NCU_SECTORS["load"][0]] = 4e6
    assert not any(f.kind == "memory.uncoalesced" for f in classify(report, EvidenceLog()))


def _profiled(us: float, **profile) -> RunReport:
    return _run([("default", us, None, None)], profile={"kernel": "k", "source": "ncu", **profile})


def test_ncu_grid_below_the_sm_count_with_the_device_idle_is_measured_parallelism():
    (idle,) = [f for f in classify(_profiled(600.0, block_dim=32, dram_throughput_pct=7.0, sm_throughput_pct=2.0,
                                             achieved_occupancy_pct=6.25), EvidenceLog())
               if f.kind == "parallelism.grid-underfilled"]
    assert idle.level == "L2" and idle.gain == 16.0  # idle warp slots (6.25% occupancy) bound it, not 132/32
    tiny = classify(_profiled(5.0, block_dim=8, dram_throughput_pct=0.5, sm_throughput_pct=0.1), EvidenceLog())
    assert not any(f.kind.startswith("parallelism") for f in tiny)  # a 5 us kernel cannot beat a launch


def test_a_device_busy_at_a_roof_is_ok_and_its_low_occupancy_is_no_defect():
    found = classify(_profiled(1600.0, dram_throughput_pct=18.0, sm_throughput_pct=77.0, achieved_occupancy_pct=12.0),
                     EvidenceLog())
    assert [f.kind for f in found] == ["profile.ok"]
    found = classify(_profiled(400.0, dram_throughput_pct=20.0, sm_throughput_pct=30.0, achieved_occupancy_pct=12.0),
                     EvidenceLog())
    assert [f.kind for f in found] == ["profile.latency-bound"]


def test_accesses_ncu_measured_coalesced_retire_the_sources_suspicion():
    metrics = {NCU_SECTORS["load"][0]: 16e6, NCU_SECTORS["load"][1]: 1e6}
    report = _run([("default", 300.0, None, None)], profile={"kernel": "_col_sum", "source": "ncu", "metrics": metrics})
    kernel = KernelInput(kernel=str(WILD / "column_gather.py"), call="col_sum(torch.randn(4096, 3000))")
    answer = diagnose(request_from(kernel, report=report), None, level_max="L2")
    suspected = next(f for f in answer.findings if f.kind == "memory.uncoalesced")
    assert suspected.confidence <= 0.3 and any("measured the accesses coalesced" in n for n in answer.notes)


def test_masks_that_leave_most_lanes_idle_are_a_finding_and_masks_never_false_are_not_suspected():
    found, _, log, _ = l1(WILD / "narrow_rows.py", "scale_rows(torch.randn(65536, 4))")
    (idle,) = [f for f in found if f.kind == "parallelism.masked-lanes"]
    assert idle.gain == 16.0 and "98% of the lanes" in idle.title  # 4 of 256 lanes; the gain is capped
    assert "1.6% of the lanes" in next(e.claim for e in log.items if e.id == idle.evidence[0])
    found, notes, _, _ = l1(WILD / "narrow_rows.py", "scale_rows(torch.randn(64, 256))")  # 256 of 256
    assert not any(f.kind in ("parallelism.masked-lanes", "vectorization.mask") for f in found)
    assert any("true for every lane" in n for n in notes)
    found, _, _, _ = l1(GOLD / "vector_add.py", "add(torch.randn(1000003), torch.randn(1000003))")  # tail only
    assert any(f.kind == "vectorization.mask" for f in found)
    assert not any(f.kind == "parallelism.masked-lanes" for f in found)


@pytest.mark.parametrize("mask, fraction", [
    ("cols < n", 4 / 256), ("pid * 256 + cols < n", 1000 / 1024), ("(cols < n) & (cols < 128)", 4 / 256),
    ("start + cols < n", None), ("pid * 128 + cols < n", None),
])
def test_the_true_fraction_of_a_mask(mask, fraction):
    import ast

    from diagnose.launch_triage import _true_fraction

    tree = ast.parse(mask.replace("cols", "tl.arange(0, 256)").replace("pid", "tl.program_id(0)"), mode="eval")
    got = _true_fraction(tree.body, {"n": 4 if "pid" not in mask else 1000}, (4,))
    assert got == (pytest.approx(fraction) if fraction is not None else None)


def test_bounds_on_two_tile_axes_multiply():
    import ast

    from diagnose.launch_triage import _true_fraction

    mask = ast.parse("(tl.arange(0, 16)[:, None] < m) & (tl.arange(0, 256)[None, :] < n)", mode="eval").body
    assert _true_fraction(mask, {"m": 8, "n": 4}, (1,)) == pytest.approx(0.5 * 4 / 256)


def test_why_reads_the_launch_as_diagnose_does():
    from diagnose.engine import why

    request = request_from(KernelInput(kernel=str(WILD / "column_scan.py"), call="scan(torch.randn(4096, 1024))"))
    answer = why("why is it slow?", request, None)
    assert answer.findings[0].kind == "parallelism.grid-underfilled"
