"""Running kernels: compile and capture, correctness, timing, profiling, sandbox, backends.

The bottom layer of kernel-kb: imports only the standard library, numpy, torch and triton, so it
runs on GPU/NPU workers whose image lacks the knowledge-base stack. Every other package may import it.
"""

from harness.errors import UserFacingError
from harness.ir.artifacts import Artifacts, PtxasReport, Remark

__all__ = ["Artifacts", "PtxasReport", "Remark", "UserFacingError"]
