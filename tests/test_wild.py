"""Kernels as people write them: autograd Functions, wrappers that insist on CUDA, files inside a
package, kernels written for another Triton, buffers a kernel reads and writes. Each must load on this
CPU-only machine and be judged as what it is, or be refused in one line that says why."""

from __future__ import annotations

import functools
import json

import pytest
import torch
from click.testing import CliRunner
from conftest import FIXTURES

from cli import main
from harness.capture import capture_call, device_for
from harness.compile_errors import one_line
from harness.entries import defining_file, entry_name, launch_code
from harness.errors import UserFacingError
from harness.guards import static_guards
from harness.roles import argument_roles, kernel_access
from harness.run import RunOptions, run_task
from harness.task import TaskSpec, load_job_task, task_files

WILD = FIXTURES / "wild"
RMS = WILD / "wildpkg" / "ops" / "rms_norm.py"
RMS_CALL = "RMSNormFunction.apply(torch.randn(64, 1000), torch.randn(1000))"


def test_an_autograd_entry_is_followed_to_its_forward_not_to_torch():
    with device_for(None):  # the module asks the device at import
        task = load_job_task(TaskSpec(kernel=str(RMS), call=RMS_CALL))
    assert task.source_file == str(RMS.resolve())
    assert defining_file(task.entry, "elsewhere.py") == str(RMS.resolve())  # not torch/autograd/function.py
    assert entry_name(task.entry) == "RMSNormFunction.apply"


def test_partials_methods_and_decorators_lead_to_the_code_that_runs():
    def launch(x, scale):
        return x * scale

    @functools.wraps(launch)
    def logged(*args, **kwargs):
        return launch(*args, **kwargs)

    class Op:
        def run(self, x):
            return x

    assert launch_code(functools.partial(logged, scale=2)) is launch.__code__
    assert launch_code(Op().run) is Op.run.__code__
    assert launch_code(torch.nn.Identity()) is torch.nn.Identity.forward.__code__
    assert launch_code(len) is None


def test_a_cuda_only_wrapper_in_a_package_compiles_on_a_cpu_machine():
    """The wrapper asserts cuda tensors, enters torch.cuda.device, allocates on "cuda", asks the SM count
    at import and imports its helpers relatively: all of that runs under the device shim."""
    (art,) = capture_call(RMS, RMS_CALL)
    assert art.kernel == "_rms_norm_forward" and art.target == "cuda:90"
    assert art.metadata["grid"] == [64]
    args = art.metadata["launch_args"]
    assert args["stride"] == 1000 and args["n_cols"] == 1000
    assert args["X"]["dtype"] == "float32" and args["X"]["shape"] == [64, 1000]
    assert not torch.randn(2).is_cuda  # the shim ended with the capture


def test_a_kernel_for_an_older_triton_names_the_api_the_version_and_keeps_tritons_text():
    with pytest.raises(UserFacingError) as caught:
        capture_call(WILD / "old_api.py", "tanh(torch.randn(4096))")
    error = caught.value
    assert "tl.math.tanh at old_api.py:14" in error.problem and "Triton 3.0" in error.problem
    assert "libdevice" in error.fix and "pip install 'triton<3.0'" in error.fix
    assert "at 6:8:" in error.detail and "has no attribute 'tanh'" in error.detail  # Triton's own words
    # A one-line report of the raw error (a case's error in the judge) keeps the cause, not only Triton's
    # first line, `at 6:8:`, which says nothing on its own.
    assert one_line(error.__cause__) == "CompilationError at 6:8: AttributeError(\"module 'triton.language.math' has no attribute 'tanh'\")"
    assert one_line(ValueError("not a compile error")) is None
    result = CliRunner().invoke(main, ["why", "why is it slow", "--kernel", str(WILD / "old_api.py"),
                                       "--call", "tanh(torch.randn(4096))"])
    assert result.exit_code == 2
    first, *rest = result.output.splitlines()
    assert first.startswith("error: kernel tanh_kernel uses tl.math.tanh") and any("^" in line for line in rest)
    # A diagnosis still reads what needs no compile (source, launch, measurements) and says why L3 is missing.
    result = CliRunner().invoke(main, ["diagnose", "--json", "--kernel", str(WILD / "old_api.py"),
                                       "--call", "tanh(torch.randn(4096))"])
    assert result.exit_code == 0, result.output
    answer = json.loads(result.output)
    assert answer["levels"] == ["L1"]
    skipped = next(e for e in answer["escalations"] if e["level"] == "L3")
    assert skipped["action"] == "skip" and "uses tl.math.tanh at old_api.py:14" in skipped["reason"]


def test_a_call_that_launches_no_triton_kernel_is_refused_in_one_line():
    with pytest.raises(UserFacingError, match="made no Triton launch"):
        capture_call(WILD / "torch_only.py", "double(torch.randn(8))")


def test_optimize_refuses_an_entry_whose_code_holds_no_kernel(tmp_path):
    from diagnose.optimize import OptimizeOptions, optimize

    spec = TaskSpec(kernel=str(WILD / "torch_only.py"), call="double(torch.randn(8))")
    with pytest.raises(UserFacingError, match="defines no @triton.jit kernel"):
        optimize(spec, OptimizeOptions(rounds=1, backend="cuda"), tmp_path / "run", None)
    assert not (tmp_path / "run" / "round-000.py").exists()  # refused before anything was written


def test_optimize_takes_a_kernel_and_a_call_like_run_and_why():
    result = CliRunner().invoke(main, ["optimize", "--kernel", str(WILD / "accumulate.py"), "--backend", "interpreter",
                                       "--call", "scaled_add(torch.randn(8), torch.randn(8))"])
    assert result.exit_code == 2 and "needs a device to time on" in result.output  # past the input checks
    result = CliRunner().invoke(main, ["optimize", "--kernel", str(WILD / "accumulate.py")])
    assert result.exit_code == 2 and "--kernel needs --call" in result.output


LAYERED = FIXTURES / "optimize" / "layered"
LAYERED_SPEC = TaskSpec(kernel=str(LAYERED / "rowsum_layer.py"), call="RowSum.apply(torch.randn(4, 256))",
                        reference="lambda x: x.sum(-1)")


def test_a_layer_files_entry_rewrites_the_kernels_file_its_forward_launches():
    """attorch's layout: the autograd Function in one file, its forward's kernel in another, its backward's
    in a third. The run rewrites the forward's, and the judge, the capture and the loop's start agree."""
    task = load_job_task(LAYERED_SPEC)
    assert task.source_file == str((LAYERED / "rowsum_layer.py").resolve())
    assert task.kernel_file == str((LAYERED / "rowsum_kernels.py").resolve())  # not fill_kernels.py (backward)
    assert str((LAYERED / "rowsum_kernels.py").resolve()) in task_files(task)
    # a kernel file's own entry stays its own
    with device_for(None):  # the module asks the device at import
        assert load_job_task(TaskSpec(kernel=str(RMS), call=RMS_CALL)).kernel_file == str(RMS.resolve())


def test_a_rewrite_of_the_kernels_file_is_what_the_layers_entry_launches(tmp_path):
    """The rewrite sits outside the package (a run's folder). A wrong one must be caught: if the layer
    still launched the original kernel, it would pass."""
    from harness.run import kernel_launch_facts

    original = (LAYERED / "rowsum_kernels.py").read_text()
    right, wrong = tmp_path / "round-001.py", tmp_path / "round-002.py"
    right.write_text(original.replace("for start in range(0, N, BLOCK):", "for start in tl.range(0, N, BLOCK, num_stages=2):"))
    wrong.write_text(original.replace("total += tl.sum(", "total += 2 * tl.sum("))
    options = RunOptions(backend="interpreter", seeds=1, timeout_s=60, time=False)
    report = run_task(LAYERED_SPEC, options, candidate=str(right))
    assert report.run("baseline").correct and report.run("candidate").correct, json.dumps(report.to_dict())[:2000]
    bad = run_task(LAYERED_SPEC, options, candidate=str(wrong)).run("candidate")
    assert not bad.correct and bad.cases[0].checks[0].mismatched == 4  # every row sum doubled
    (launch,) = kernel_launch_facts(LAYERED_SPEC, str(right), "RowSum.apply")
    assert launch.kernel == "rowsum_kernel" and launch.source_file == str(right.resolve())
    # A user's whole new layer (its own RowSum, its own kernel inline) stands in for the layer file instead:
    # installed as the kernels file, it would leave the original layer importing a name it lacks.
    layer = (LAYERED / "rowsum_layer.py").read_text().replace("from .rowsum_kernels import rowsum_kernel\n", "")
    whole = tmp_path / "my_layer.py"
    whole.write_text((layer + "\n\n" + right.read_text()).replace("rowsum_kernel", "my_rowsum_kernel"))
    mine = run_task(LAYERED_SPEC, options, candidate=str(whole)).run("candidate")
    assert mine.correct, mine.rejected


def test_an_entry_launching_kernels_of_several_files_is_refused_in_one_line(tmp_path):
    from diagnose.optimize import OptimizeOptions, optimize

    package = tmp_path / "twofiles"
    package.mkdir()
    (package / "__init__.py").write_text("")
    kernel = "import triton\nimport triton.language as tl\n\n@triton.jit\ndef {0}(x, y):\n    tl.store(y, tl.load(x))\n"
    (package / "first.py").write_text(kernel.format("first_kernel"))
    (package / "second.py").write_text(kernel.format("second_kernel"))
    (package / "layer.py").write_text(
        "import torch\n\nfrom .first import first_kernel\nfrom .second import second_kernel\n\n\n"
        "def helper(x, y):\n    second_kernel[(1,)](y, x)\n\n\n"
        "def both(x):\n    y = torch.empty_like(x)\n    first_kernel[(1,)](x, y)\n    helper(x, y)\n    return x\n")
    spec = TaskSpec(kernel=str(package / "layer.py"), call="both(torch.randn(1))")
    assert load_job_task(spec).kernel_file == str((package / "layer.py").resolve())  # neither: ambiguous
    with pytest.raises(UserFacingError, match="launches kernels of 2 files") as caught:
        optimize(spec, OptimizeOptions(rounds=1, backend="cuda"), tmp_path / "run", None)
    assert "first.py" in caught.value.problem and "second.py" in caught.value.problem  # the helper is followed
    assert not (tmp_path / "run" / "round-000.py").exists()


def test_the_guards_read_an_autograd_entrys_forward(tmp_path):
    source = tmp_path / "fallback.py"
    source.write_text("import torch\n\nclass Op(torch.autograd.Function):\n    @staticmethod\n"
                      "    def forward(ctx, x):\n        return torch.softmax(x, 0)\n")
    assert any("torch.softmax" in r for r in static_guards(str(source), "Op.apply"))


def test_kernel_access_follows_pointer_arithmetic_to_the_parameters():
    src = ("def k(X, OUT, Y, n, BLOCK: tl.constexpr):\n    offs = tl.arange(0, BLOCK)\n    p = base + offs\n"
           "    base = OUT + tl.program_id(0) * n\n    acc = tl.load(p)\n    tl.store(p, acc + tl.load(X + offs))\n"
           "    tl.atomic_add(Y, 1.0)\n")
    reads, writes = kernel_access(src, ["X", "OUT", "Y", "n", "BLOCK"])
    assert {"X", "OUT", "Y"} <= reads and {"OUT", "Y"} <= writes and "X" not in writes


@pytest.mark.parametrize("add_inputs, roles", [(True, ((), (1,))), (False, ((1,), ()))])
def test_argument_roles_come_from_the_kernel(add_inputs, roles):
    from harness.loading import load_kernel_module

    module = load_kernel_module(WILD / "accumulate.py")
    found = argument_roles(functools.partial(module.scaled_add, add_inputs=add_inputs),
                           (torch.randn(64), torch.randn(64)), {})
    assert (found.outputs, found.inouts) == roles


@pytest.mark.parametrize("add_inputs", [True, False])
def test_a_buffer_the_kernel_accumulates_into_is_judged_as_an_in_out_argument(add_inputs):
    """Poisoned as an out= buffer, the kernel's own baseline would fail; judged as an input, it would be
    'an input was modified'. Inferred as in/out (or out), the baseline passes against its reference."""
    reference = ("lambda x, out, add_inputs: out.add_(2 * x)" if add_inputs else
                 "lambda x, out, add_inputs: out.copy_(2 * x)")
    spec = TaskSpec(kernel=str(WILD / "accumulate.py"), reference=reference,
                    call=f"scaled_add(torch.randn(3000), torch.randn(3000), add_inputs={add_inputs})")
    report = run_task(spec, RunOptions(backend="interpreter", seeds=1, time=False, timeout_s=120))
    base = report.run("baseline")
    assert base is not None and base.correct, json.dumps(report.to_dict())[:2000]
    assert base.compared_with == "the reference"


def test_a_library_whose_autotune_keys_newer_triton_refuses_still_loads(tmp_path, capfd):
    """Triton 3.9 refuses @triton.autotune(key=[...]) naming a non-argument; older Triton dropped the name."""
    from harness.loading import load_kernel_module

    source = tmp_path / "lenient.py"
    source.write_text("import triton\nimport triton.language as tl\n\n@triton.autotune(configs=[triton.Config({})], "
                      "key=['n', 'BT'])\n@triton.jit\ndef k(x, n):\n    pass\n")
    module = load_kernel_module(source)
    assert module.k.keys == ["n"] and "autotune names BT are not kernel arguments" in capfd.readouterr().err


def test_the_device_shim_keeps_torch_cuda_names_usable_as_types():
    from harness.cuda_shim import cuda_on_cpu

    with cuda_on_cpu():
        annotation = torch.cuda.Stream | None  # libraries annotate with it at import
        with torch.cuda.device(torch.device("cuda", 0)):
            assert torch.cuda.get_device_properties(0).multi_processor_count == 132
        # by keyword, as drafts call them (TritonBench-T's scaled_add_dot: synchronize(device=y.device))
        torch.cuda.synchronize(device=torch.device("cuda", 0))
        assert torch.cuda.get_device_properties(device=0).multi_processor_count == 132
        assert torch.cuda.get_device_capability(device=0) == (9, 0) and torch.cuda.current_stream(device=0)
        with torch.cuda.stream(stream=torch.cuda.current_stream()):
            torch.cuda.set_device(device=0)
    assert annotation is not None


def test_a_wrapper_that_reads_the_launchs_result_and_prints_keeps_json_clean(tmp_path):
    source = tmp_path / "chatty.py"
    source.write_text(
        "import torch\nimport triton\nimport triton.language as tl\n\n@triton.jit\n"
        "def k(x, y, BLOCK: tl.constexpr):\n    o = tl.arange(0, BLOCK)\n    tl.store(y + o, tl.load(x + o))\n\n"
        "def copy(x):\n    y = torch.empty_like(x)\n    c = k[(1,)](x, y, BLOCK=x.numel())\n"
        "    print(f'{c.n_regs} registers, {c.shared} shared', c.asm['ptx'][:10])\n    return y\n")
    result = CliRunner().invoke(main, ["diagnose", "--kernel", str(source), "--call", "copy(torch.randn(256))", "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["kernel"] == "k"


def test_the_real_world_labels_are_the_rule_applied_to_the_committed_measurements():
    """Each label of corpora/diagnosis/wild.yaml is what scripts/wild_cases.py's rule gives the H200 report
    committed beside it: a label can be checked against its numbers, never only taken on trust."""
    import sys

    import yaml

    from diagnose.evaluate import bottleneck_class

    sys.path.insert(0, str(FIXTURES.parent.parent / "scripts"))
    import wild_cases

    data = yaml.safe_load(wild_cases.CASES.read_text())
    assert data["match"] == "class" and len(data["cases"]) >= 20
    for case in data["cases"]:
        report = json.loads((wild_cases.CASES.parent / case["measurements"]).read_text())
        assert wild_cases.label(wild_cases.numbers(report)) == case["root_cause"], case["id"]
        assert case["root_cause"] == "healthy" or bottleneck_class(case["root_cause"]), case["id"]
        assert report["device"] == "NVIDIA H200" and report["ceilings"]["copy_gbps"] > 0


def test_class_matching_scores_a_mechanism_under_its_measured_class():
    from diagnose.evaluate import bottleneck_class

    assert bottleneck_class("pipelining.none") == bottleneck_class("profile.latency-bound") == "latency"
    assert bottleneck_class("parallelism.grid-underfilled") == "parallelism"
    assert bottleneck_class("dot.mma-v2") == bottleneck_class("dot.fma") == "compute"  # a lower ceiling
    assert bottleneck_class("dot.wgmma-serialized") == "latency"  # tensor cores idle between waited MMAs
    assert bottleneck_class("spills.registers") == ""
