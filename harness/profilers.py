"""Read what a GPU/NPU profiler measured into one normalized record per kernel launch.

Why: diagnosis asks the same questions of every backend (is the kernel memory- or compute-bound,
which pipe or stall dominates, how big was the launch), but Nsight Compute, `msprof op` and the
torch_npu profiler answer them in three different file formats, units and vocabularies. These modules
are the only place that knows those formats; everything above them sees `KernelProfile`, from here.

- `harness.profile_record`: the normalized `KernelProfile`, the choice of the kernel that matters (`summarize`), and
  the cell and table reading every format shares (parse by column *name*, never by position: every
  tool adds columns over time);
- `harness.ncu`: Nsight Compute's command line and CSV pages;
- `harness.ascend_profilers`: `msprof op`'s command line and OPPROF directories, and the torch_npu profiler's
  kernel_details.csv.
"""

from harness.ascend_profilers import find_msprof, msprof_op_command, parse_msprof_op, parse_torch_npu_profile
from harness.ncu import NCU_METRICS, NCU_SECTORS, find_ncu, ncu_command, parse_ncu_csv, sectors_per_request
from harness.profile_record import KernelProfile, summarize

__all__ = [
    "NCU_METRICS",
    "NCU_SECTORS",
    "sectors_per_request",
    "KernelProfile",
    "find_ncu",
    "ncu_command",
    "find_msprof",
    "msprof_op_command",
    "parse_msprof_op",
    "parse_ncu_csv",
    "parse_torch_npu_profile",
    "summarize",
]
