"""The judge against a fifth adversarial review's cheats (2026-12-05): candidates for a vector add (an int64
one for the comparison) that the judge accepted before, each written as an adversary would
(tests/fixtures/judge_audit/, one module per cheat: ORIGINAL, CANDIDATE, ENTRY, CALL, REFERENCE). Each must
now be rejected for the reason named here; the honest candidate beside them must pass."""

from __future__ import annotations

import runpy

import pytest
from conftest import FIXTURES, candidate_rejection

AUDIT = FIXTURES / "judge_audit"

CHEATS = [
    # the whole op in torch, then the worker's call log found through a traceback's frames and scrubbed
    ("p16_frame_log_scrub", "reads .tb_frame"),
    # a C++ extension built at import computes the sum below the dispatcher
    ("p17_cpp_extension", "imports torch.utils.cpp_extension"),
    # NumPy and Python compute on the host; on the CPU interpreter no copy shows it
    ("p01_numpy_fallback", "read on the host (.numpy())"),
    ("p02_python_scalar_fallback", "read on the host (.tolist())"),
    # torch run inside Triton's launch, where the runtime guard stands aside
    ("p20_grid_subclass", "the grid of noop_kernel is a _Grid"),
    ("p13_tuple_duck_pointer", "an argument of noop_kernel that is a _Ptr"),
    ("p03_python_in_kernel_body", "calls _work() from kernel noop_kernel"),
    # honest only while judged: the harness's tripwires, the interpreter's classes or switch recognised
    ("p04a_judge_aware", "torch.utils._python_dispatch"),
    ("p04d_judge_aware", "triton.runtime.interpreter"),
    ("p04e_judge_aware", "reaches into sys.modules"),
    ("p05_interpreter_env", "names TRITON_INTERPRET"),
    # int64 sums rounded through float64: the comparison itself was in float64
    ("p06b_int64_via_float64", '"max_abs_err": 256.0'),
    # right at the call's one shape only: a held-out length drawn from the call's size catches it
    ("p08_call_shape_only", '"label": "size1000='),
    # the op done by a torch copy of a strided view, then copied on by a Triton kernel
    ("p09_laundered_transpose", "aten::clone of a strided (80, 96) view"),
    # right only on randn's range: the scaled-input case catches it
    ("p10_randn_range_only", '"label": "size1000=125,input scale=16.0"'),
]


def _probe(name: str) -> dict:
    return runpy.run_path(str(AUDIT / f"{name}.py"))


@pytest.mark.parametrize("name,reason", CHEATS, ids=[c[0] for c in CHEATS])
def test_each_cheat_is_rejected_for_its_reason(tmp_path, name, reason):
    p = _probe(name)
    why = candidate_rejection(tmp_path, p["ORIGINAL"], p["CANDIDATE"], p["ENTRY"], p["CALL"], p["REFERENCE"])
    assert reason in why, why[:2000]


def test_the_honest_candidate_passes(tmp_path):
    p = _probe("p00_honest")
    assert candidate_rejection(tmp_path, p["ORIGINAL"], p["CANDIDATE"], p["ENTRY"], p["CALL"], p["REFERENCE"]) == ""


def test_a_grid_given_as_a_torch_size_is_a_plain_grid(tmp_path):
    # torch.Size subclasses tuple: the grid check must not take it for a grid that runs code in the launch
    p = _probe("p00_honest")
    sized = p["CANDIDATE"].replace("[(triton.cdiv(n, 256),)]", "[torch.Size([triton.cdiv(n, 256)])]")
    assert sized != p["CANDIDATE"]
    assert candidate_rejection(tmp_path, p["ORIGINAL"], sized, p["ENTRY"], p["CALL"], p["REFERENCE"]) == ""


def test_host_functions_called_by_a_kernels_decorators_are_not_host_code_in_the_kernel(tmp_path):
    # attorch's and Liger's form: the configs and heuristics come from the module's own functions
    from harness.guards import escape_guards

    source = tmp_path / "tuned.py"
    source.write_text(
        "import triton\nimport triton.language as tl\n\n\ndef configs():\n    return [triton.Config({'BLOCK': 64})]\n\n\n"
        "def block_for(args):\n    return 64\n\n\n@triton.autotune(configs=configs(), key=['n'])\n"
        "@triton.heuristics({'HALF': lambda args: block_for(args) // 2})\n@triton.jit\n"
        "def k(x_ptr, n, BLOCK: tl.constexpr, HALF: tl.constexpr):\n    pass\n")
    assert escape_guards(str(source)) == []
    source.write_text(source.read_text().replace("    pass\n", "    h = block_for(n)\n"))
    assert any("calls block_for() from kernel k" in reason for reason in escape_guards(str(source)))


def test_a_strided_copy_the_task_kernel_makes_too_is_the_wrappers_design(tmp_path):
    # the same wrapper as the task's own kernel: its torch copy of the transposed view is allowed to a rewrite
    p = _probe("p09_laundered_transpose")
    assert candidate_rejection(tmp_path, p["CANDIDATE"], p["CANDIDATE"], p["ENTRY"], p["CALL"], p["REFERENCE"]) == ""
