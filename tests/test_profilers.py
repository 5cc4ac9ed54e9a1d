"""Profiler outputs (Nsight Compute, msprof op, torch_npu) parse into the same KernelProfile record.

Fixtures under tests/fixtures/profiles/ are small hand-written files in each tool's documented format:

* ncu_raw.csv: `ncu --csv --page raw --print-units base` output (Nsight Compute CLI user guide, "Output
  Pages"), shaped like real ncu 2025.3.1 output of harness.profilers.ncu_command on an H200: the profiled
  program's stdout and ==WARNING==/==PROF== lines, the header row, the units row, one row per launch;
  durations with thousands separators (older releases' "nsecond" unit; 2025.3 prints "ns"), an "n/a" L2
  hit rate, the WarpStateStats stall family `smsp__average_warps_issue_stalled_<reason>_per_issue_active.ratio`.
* ncu_details.csv: `ncu --csv` details page (one "Metric Name"/"Metric Unit"/"Metric Value" row per metric),
  per-row units (usecond, msecond) and the PC-sampling stall family `smsp__pcsamp_warps_issue_stalled_*`.
* msprof_single/OPPROF_20261129_ABC/: one operator under `msprof op` (CANN 8.0/8.5 msprof op docs):
  OpBasicInfo.csv, and per-core PipeUtilization.csv, Memory.csv, L2Cache.csv of a vector kernel on 2 blocks.
* msprof_multi/OPPROF_20261130_DEF/: several operators (`--launch-count`/`--kernel-name`), laid out as
  device0/<OpName>/<launch>/<Kind>_<timestamp>.csv, with a mixed cube+vector PipeUtilization.
* demo_ascend_pt/ASCEND_PROFILER_OUTPUT/kernel_details.csv: torch_npu profiler with a schedule (Step Id) and
  aic_metrics=PipeUtilization (op_summary pipe columns aic_mac_ratio, aiv_vec_ratio, ...; fractions).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from harness import ncu
from harness.errors import UserFacingError
from harness.profilers import (
    NCU_METRICS,
    KernelProfile,
    find_ncu,
    ncu_command,
    parse_msprof_op,
    parse_ncu_csv,
    parse_torch_npu_profile,
    summarize,
)

PROFILES = Path(__file__).resolve().parent / "fixtures" / "profiles"
NCU_RAW = PROFILES / "ncu_raw.csv"
MSPROF_SINGLE = PROFILES / "msprof_single" / "OPPROF_20261129_ABC"
MSPROF_MULTI = PROFILES / "msprof_multi" / "OPPROF_20261130_DEF"
ASCEND_PT = PROFILES / "demo_ascend_pt"


def _by_kernel(profiles: list[KernelProfile]) -> dict[str, list[KernelProfile]]:
    grouped: dict[str, list[KernelProfile]] = {}
    for profile in profiles:
        grouped.setdefault(profile.kernel, []).append(profile)
    return grouped


# --------------------------------------------------------------------------------------------------
# Nsight Compute
# --------------------------------------------------------------------------------------------------


def test_ncu_metrics_cover_every_field_and_stall_reason() -> None:
    for metric in (
        "gpu__time_duration.sum",
        "dram__throughput.avg.pct_of_peak_sustained_elapsed",
        "sm__throughput.avg.pct_of_peak_sustained_elapsed",
        "sm__warps_active.avg.pct_of_peak_sustained_active",
        "lts__t_sector_hit_rate.pct",
        "launch__grid_size",
        "smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio",
        "smsp__average_warps_issue_stalled_math_pipe_throttle_per_issue_active.ratio",
        "smsp__average_warps_issue_stalled_imc_miss_per_issue_active.ratio",
    ):
        assert metric in NCU_METRICS
    stalls = [m for m in NCU_METRICS if m.startswith("smsp__average_warps_issue_stalled_")]
    assert len(stalls) == 17
    assert len(set(NCU_METRICS)) == len(NCU_METRICS)


def test_ncu_command_profiles_argv_with_csv_raw_page_and_filters() -> None:
    argv = ["/usr/bin/python3", "-m", "harness.worker_main", "--task", "t.json"]
    command = ncu_command(argv, kernel_regex="add_kernel|matmul", ncu="/opt/ncu", launch_count=3)
    assert command[0] == "/opt/ncu"
    assert command[-len(argv) :] == argv
    options = command[: -len(argv)]
    assert "--csv" in options
    assert options[options.index("--page") + 1] == "raw"
    assert options[options.index("--print-units") + 1] == "base"
    assert options[options.index("--metrics") + 1].split(",") == list(NCU_METRICS)
    assert options[options.index("--target-processes") + 1] == "all"
    assert options[options.index("--kernel-name") + 1] == "regex:add_kernel|matmul"
    assert options[options.index("--launch-count") + 1] == "3"


def test_ncu_command_without_filters_and_bad_arguments() -> None:
    command = ncu_command(["./bench"])
    assert command[0] == "ncu" and command[-1] == "./bench"
    assert "--kernel-name" not in command and "--launch-count" not in command
    with pytest.raises(UserFacingError, match="empty"):
        ncu_command([])
    with pytest.raises(UserFacingError, match="launch count 0"):
        ncu_command(["./bench"], launch_count=0)
    with pytest.raises(UserFacingError, match="invalid"):
        ncu_command(["./bench"], kernel_regex="add_(")


def test_parse_ncu_raw_skips_preamble_and_reads_every_launch() -> None:
    profiles = parse_ncu_csv(NCU_RAW.read_text())
    assert [p.kernel for p in profiles] == ["add_kernel", "add_kernel", "matmul_kernel"]
    assert {p.source for p in profiles} == {"ncu"}
    first, second, matmul = profiles
    # "12,345" nsecond -> 12.345 us: thousands separator and unit conversion.
    assert first.duration_us == pytest.approx(12.345)
    assert second.duration_us == pytest.approx(11.0)
    assert matmul.duration_us == pytest.approx(20.0)
    assert first.dram_throughput_pct == pytest.approx(85.5)
    assert first.sm_throughput_pct == pytest.approx(20.25)
    assert first.achieved_occupancy_pct == pytest.approx(78.1)
    assert first.l2_hit_rate_pct is None  # "n/a"
    assert matmul.l2_hit_rate_pct == pytest.approx(65.25)
    assert first.block_dim == 4096  # launch__grid_size "4,096"
    assert matmul.block_dim == 128


def test_parse_ncu_raw_keeps_numeric_metrics_by_original_name() -> None:
    first = parse_ncu_csv(NCU_RAW.read_text())[0]
    assert first.metrics["launch__registers_per_thread"] == 32
    assert first.metrics["gpu__time_duration.sum"] == 12345  # raw, in the unit ncu printed
    assert "launch__func_cache_config" not in first.metrics  # text
    assert "lts__t_sector_hit_rate.pct" not in first.metrics  # n/a
    assert "Grid Size" not in first.metrics and "CC" not in first.metrics  # launch identity, not a metric


def test_ncu_stalls_are_shares_of_all_stalls_top_five_descending() -> None:
    first, _, matmul = parse_ncu_csv(NCU_RAW.read_text())
    # long_scoreboard 6, wait 1, not_selected .5, short_scoreboard .3, lg_throttle .2 (selected is no stall)
    assert first.top_stalls == [
        ("long_scoreboard", pytest.approx(75.0)),
        ("wait", pytest.approx(12.5)),
        ("not_selected", pytest.approx(6.25)),
        ("short_scoreboard", pytest.approx(3.75)),
        ("lg_throttle", pytest.approx(2.5)),
    ]
    assert sum(share for _, share in first.top_stalls) == pytest.approx(100.0)
    # Seven reasons stall the matmul: the five largest are kept, so they sum to less than 100.
    reasons = [reason for reason, _ in matmul.top_stalls]
    shares = [share for _, share in matmul.top_stalls]
    assert reasons == ["math_pipe_throttle", "mio_throttle", "short_scoreboard", "barrier", "long_scoreboard"]
    assert shares == sorted(shares, reverse=True)
    assert shares[0] == pytest.approx(40.0)
    assert sum(shares) == pytest.approx(93.0)


def test_parse_ncu_details_page_converts_per_row_units_and_pcsamp_stalls() -> None:
    softmax, layernorm = parse_ncu_csv((PROFILES / "ncu_details.csv").read_text())
    assert softmax.kernel == "softmax_kernel"
    assert softmax.duration_us == pytest.approx(1.5)  # usecond
    assert layernorm.duration_us == pytest.approx(2500.0)  # msecond
    assert softmax.dram_throughput_pct == pytest.approx(61.2)
    assert layernorm.dram_throughput_pct is None
    assert softmax.block_dim == 32 and layernorm.block_dim == 32  # "(8, 4, 1)"
    # "_not_issued" samples and "selected" are not counted; no_instructions reads as no_instruction.
    assert softmax.top_stalls == [("long_scoreboard", pytest.approx(80.0)), ("no_instruction", pytest.approx(20.0))]


@pytest.mark.parametrize(
    ("unit", "value", "expected_us"),
    [("ns", "41,984", 41.984), ("usecond", "3.5", 3.5), ("msecond", "1.25", 1250.0), ("second", "0.5", 5e5)],
)
def test_parse_ncu_raw_converts_duration_units(unit: str, value: str, expected_us: float) -> None:
    text = "\n".join([
        '"ID","Kernel Name","Grid Size","gpu__time_duration.sum"',
        f'"","","","{unit}"',
        f'"0","k","(2, 1, 1)","{value}"',
    ])  # fmt: skip
    (profile,) = parse_ncu_csv(text)
    assert profile.duration_us == pytest.approx(expected_us)
    assert profile.block_dim == 2


def test_parse_ncu_without_header_names_the_source() -> None:
    with pytest.raises(UserFacingError, match="run.log") as info:
        parse_ncu_csv("==PROF== ERR_NVGPUCTRPERM\nno kernels were profiled\n", source="run.log")
    assert "Kernel Name" in str(info.value)
    assert info.value.fix


def test_parse_ncu_truncated_row_names_the_line() -> None:
    lines = NCU_RAW.read_text().splitlines()
    lines[-1] = lines[-1][: len(lines[-1]) // 2]  # cut mid-row, as a killed run leaves it
    with pytest.raises(UserFacingError, match=rf"profile\.log: line {len(lines)}:"):
        parse_ncu_csv("\n".join(lines), source="profile.log")


def test_parse_ncu_rejects_non_time_duration_unit() -> None:
    text = '"ID","Kernel Name","gpu__time_duration.sum"\n"","","cycle"\n"0","k","100"\n'
    with pytest.raises(UserFacingError, match="line 3: gpu__time_duration.sum is in 'cycle'"):
        parse_ncu_csv(text, source="x.csv")


def test_find_ncu_prefers_path_then_install_dirs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ncu.shutil, "which", lambda name: "/usr/bin/ncu" if name == "ncu" else None)
    assert find_ncu() == "/usr/bin/ncu"

    monkeypatch.setattr(ncu.shutil, "which", lambda name: None)
    monkeypatch.delenv("CUDA_HOME", raising=False)
    monkeypatch.delenv("CUDA_PATH", raising=False)
    for version in ("2024.3.0", "2025.1.1"):
        binary = tmp_path / "nsight-compute" / version / "ncu"
        binary.parent.mkdir(parents=True)
        binary.write_text("#!/bin/sh\n")
        binary.chmod(0o755)
    monkeypatch.setattr(ncu, "_NCU_CANDIDATES", (str(tmp_path / "nsight-compute" / "*" / "ncu"),))
    assert find_ncu() == str(tmp_path / "nsight-compute" / "2025.1.1" / "ncu")

    monkeypatch.setattr(ncu, "_NCU_CANDIDATES", (str(tmp_path / "nowhere" / "ncu"),))
    assert find_ncu() is None


# --------------------------------------------------------------------------------------------------
# msprof op
# --------------------------------------------------------------------------------------------------


def test_parse_msprof_op_single_operator() -> None:
    (profile,) = parse_msprof_op(MSPROF_SINGLE)
    assert profile.kernel == "add_kernel"
    assert profile.source == "msprof"
    assert profile.duration_us == pytest.approx(24.56)
    assert profile.block_dim == 2
    # Per-core fractions averaged over the four vector cores, in percent; no cube pipe on a vector kernel.
    assert profile.pipes == {
        "vector": pytest.approx(20.0),
        "scalar": pytest.approx(10.0),
        "mte2": pytest.approx(60.0),
        "mte3": pytest.approx(30.0),
    }
    assert profile.sm_throughput_pct == pytest.approx(20.0)
    assert profile.dram_throughput_pct == pytest.approx(70.0)  # GM_to_UB_bw_usage_rate(%), the busier GM path
    assert profile.l2_hit_rate_pct == pytest.approx(90.0)
    assert profile.achieved_occupancy_pct is None and profile.top_stalls == []
    assert profile.metrics["Current Freq"] == 1800
    assert profile.metrics["aiv_mte2_ratio"] == pytest.approx(0.60)
    assert profile.metrics["UB_to_GM_bw_usage_rate(%)"] == pytest.approx(35.0)
    assert "PID" not in profile.metrics and "sub_block_id" not in profile.metrics


def test_parse_msprof_op_accepts_the_parent_of_one_run() -> None:
    assert parse_msprof_op(MSPROF_SINGLE.parent) == parse_msprof_op(str(MSPROF_SINGLE))


def test_parse_msprof_op_multi_operator_layout_and_core_types() -> None:
    profiles = _by_kernel(parse_msprof_op(MSPROF_MULTI))
    assert sorted(p.duration_us for p in profiles["add_kernel"]) == [60.0, 70.0]
    (matmul,) = profiles["matmul_kernel"]
    assert matmul.block_dim == 2
    assert matmul.metrics["Mix Block Dim"] == 4
    # aic_* columns are averaged over cube cores only and aiv_* over vector cores only; a pipe both
    # core types run (scalar, mte2) reports the busier type.
    assert matmul.pipes == {
        "cube": pytest.approx(75.0),
        "vector": pytest.approx(30.0),
        "scalar": pytest.approx(15.0),
        "mte1": pytest.approx(31.0),
        "mte2": pytest.approx(42.0),
        "mte3": pytest.approx(20.0),
    }
    assert matmul.sm_throughput_pct == pytest.approx(75.0)
    assert matmul.dram_throughput_pct is None  # no Memory.csv collected


def test_parse_msprof_op_errors_name_the_directory(tmp_path: Path) -> None:
    with pytest.raises(UserFacingError, match=re.escape(f"{tmp_path / 'missing'} does not exist")):
        parse_msprof_op(tmp_path / "missing")
    with pytest.raises(UserFacingError, match="is not a directory"):
        parse_msprof_op(MSPROF_SINGLE / "OpBasicInfo.csv")
    with pytest.raises(UserFacingError, match="no OPPROF_"):
        parse_msprof_op(tmp_path)
    (tmp_path / "OPPROF_1_A").mkdir()
    with pytest.raises(UserFacingError, match="no OpBasicInfo.csv"):
        parse_msprof_op(tmp_path)
    (tmp_path / "OPPROF_2_B").mkdir()
    with pytest.raises(UserFacingError, match="2 msprof op runs"):
        parse_msprof_op(tmp_path)


def test_parse_msprof_op_malformed_csv_names_file_and_line(tmp_path: Path) -> None:
    run = tmp_path / "OPPROF_1_A"
    run.mkdir()
    basic = run / "OpBasicInfo.csv"
    basic.write_text("Kernel,Task Duration(us)\nadd,1.0\n")
    with pytest.raises(UserFacingError, match=re.escape(f"{basic}: line 1: no 'Op Name' column")):
        parse_msprof_op(run)
    basic.write_text("Op Name,Task Duration(us),Block Dim\nadd,1.0,2\n")
    (run / "PipeUtilization.csv").write_text("block_id,sub_block_id,aiv_vec_ratio\n0,vector0,0.5\n1,vector0\n")
    with pytest.raises(UserFacingError, match=r"PipeUtilization.csv: line 3: 2 fields where the header has 3"):
        parse_msprof_op(run)


# --------------------------------------------------------------------------------------------------
# torch_npu profiler
# --------------------------------------------------------------------------------------------------


def test_parse_torch_npu_kernel_details() -> None:
    profiles = parse_torch_npu_profile(ASCEND_PT)
    assert [p.kernel for p in profiles] == ["add_kernel", "matmul_kernel", "add_kernel", "aclnnCast_CastAiCpu_Cast"]
    assert {p.source for p in profiles} == {"torch_npu"}
    add, matmul, _, cast = profiles
    assert add.duration_us == pytest.approx(30.5)
    assert add.block_dim == 40
    assert add.pipes == {
        "vector": pytest.approx(20.0),
        "scalar": pytest.approx(10.0),
        "mte2": pytest.approx(65.0),
        "mte3": pytest.approx(30.0),
    }
    assert add.sm_throughput_pct == pytest.approx(20.0)
    assert matmul.pipes["cube"] == pytest.approx(80.0)  # aic_mac_ratio
    assert matmul.pipes["mte2"] == pytest.approx(40.0)  # max(aic 0.40, aiv 0.15)
    assert matmul.pipes["scalar"] == pytest.approx(6.0)
    assert matmul.sm_throughput_pct == pytest.approx(80.0)
    assert matmul.block_dim == 20
    assert matmul.metrics["cube_utilization(%)"] == pytest.approx(72.5)
    assert matmul.metrics["Wait Time(us)"] == pytest.approx(1.0)
    assert cast.pipes == {} and cast.sm_throughput_pct is None and cast.block_dim == 0
    for name in ("Step Id", "Task ID", "Start Time(us)", "Input Shapes", "Output Shapes"):
        assert name not in add.metrics


def test_parse_torch_npu_accepts_file_output_dir_or_ascend_pt_dir() -> None:
    output_dir = ASCEND_PT / "ASCEND_PROFILER_OUTPUT"
    expected = parse_torch_npu_profile(ASCEND_PT)
    assert parse_torch_npu_profile(output_dir) == expected
    assert parse_torch_npu_profile(str(output_dir / "kernel_details.csv")) == expected


def test_parse_torch_npu_block_num_header_and_percent_ratios(tmp_path: Path) -> None:
    # Newer torch_npu writes "Block Num"; a ratio above 1 shows a file already in percent.
    file = tmp_path / "kernel_details.csv"
    file.write_text(
        "Device_id,Name,Type,Accelerator Core,Start Time(us),Duration(us),Wait Time(us),Block Num,aiv_vec_ratio\n"
        "0,k,k,AI_VECTOR_CORE,10.0\t,\"1,500.25\",0,48,55.5\n"
    )
    (profile,) = parse_torch_npu_profile(file)
    assert profile.duration_us == pytest.approx(1500.25)
    assert profile.block_dim == 48
    assert profile.pipes == {"vector": pytest.approx(55.5)}


def test_parse_torch_npu_errors_name_the_path(tmp_path: Path) -> None:
    with pytest.raises(UserFacingError, match="holds no kernel_details.csv"):
        parse_torch_npu_profile(tmp_path)
    with pytest.raises(UserFacingError, match="does not exist"):
        parse_torch_npu_profile(tmp_path / "nope_ascend_pt")
    for rank in (0, 1):
        out = tmp_path / f"rank{rank}_ascend_pt" / "ASCEND_PROFILER_OUTPUT"
        out.mkdir(parents=True)
        (out / "kernel_details.csv").write_text("Name,Duration(us)\nk,1.0\n")
    with pytest.raises(UserFacingError, match="2 kernel_details.csv files"):
        parse_torch_npu_profile(tmp_path)
    bad = tmp_path / "rank0_ascend_pt" / "ASCEND_PROFILER_OUTPUT" / "kernel_details.csv"
    bad.write_text("Name,Type\nk,k\n")
    with pytest.raises(UserFacingError, match=re.escape(f"{bad}: line 1: no 'Duration(us)' or 'Task Duration(us)'")):
        parse_torch_npu_profile(bad)


# --------------------------------------------------------------------------------------------------
# summarize and the record
# --------------------------------------------------------------------------------------------------


def test_summarize_picks_longest_total_and_keeps_longest_launch() -> None:
    profiles = parse_ncu_csv(NCU_RAW.read_text())
    top = summarize(profiles)
    assert top is not None
    assert top.kernel == "add_kernel"
    assert top.duration_us == pytest.approx(23.345)  # 12.345 + 11.0 beats the 20 us matmul
    assert top.dram_throughput_pct == pytest.approx(85.5)  # the 12.345 us launch's counters
    assert top.top_stalls[0] == ("long_scoreboard", pytest.approx(75.0))
    assert profiles[0].duration_us == pytest.approx(12.345)  # inputs untouched
    matmul = summarize(profiles, kernel_regex="mat")
    assert matmul is not None and matmul.kernel == "matmul_kernel"
    assert matmul.duration_us == pytest.approx(20.0)
    assert summarize(profiles, kernel_regex="^softmax") is None
    assert summarize([]) is None


def test_summarize_npu_profiles() -> None:
    top = summarize(parse_msprof_op(MSPROF_MULTI))
    assert top is not None and top.kernel == "add_kernel" and top.duration_us == pytest.approx(130.0)
    assert top.metrics["Task Duration(us)"] == pytest.approx(70.0)  # the longest launch
    torch_top = summarize(parse_torch_npu_profile(ASCEND_PT))
    assert torch_top is not None and torch_top.kernel == "add_kernel"
    assert torch_top.duration_us == pytest.approx(58.5)
    assert torch_top.pipes["mte2"] == pytest.approx(65.0)
    with pytest.raises(UserFacingError, match="invalid"):
        summarize([], kernel_regex="[")


def test_to_dict_from_dict_round_trip_through_json() -> None:
    for profile in [*parse_ncu_csv(NCU_RAW.read_text()), *parse_msprof_op(MSPROF_MULTI)]:
        restored = KernelProfile.from_dict(json.loads(json.dumps(profile.to_dict())))
        assert restored == profile
        assert all(isinstance(item, tuple) for item in restored.top_stalls)
    minimal = KernelProfile.from_dict({"kernel": "k", "source": "ncu", "added_by_a_newer_writer": 1})
    assert minimal == KernelProfile(kernel="k", source="ncu")
    with pytest.raises(UserFacingError, match="lacks kernel"):
        KernelProfile.from_dict({"source": "ncu"})
