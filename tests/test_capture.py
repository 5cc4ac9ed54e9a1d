"""Compile-and-capture with real triton compiles for sm90 on this CPU."""

from __future__ import annotations

import pytest
from conftest import EXAMPLES, FIXTURES

from harness import ir
from harness.capture import capture_call
from harness.errors import UserFacingError
from harness.task import capture_task


def _line_of(text: str) -> int:
    lines = (EXAMPLES / "scale.py").read_text().splitlines()
    return next(i for i, ln in enumerate(lines, 1) if text in ln)


def test_launch_specialization_matches_a_real_launch(scale_artifacts, tmp_path):
    odd = scale_artifacts[0]
    assert odd.kernel == "scale_kernel" and odd.target == "cuda:90" and odd.launched_on == "cpu"
    # Triton's own binder: aligned CPU tensors are divisible, n = 1000003 is not, BLOCK is constexpr.
    assert odd.divisible_args() == {"x_ptr", "out_ptr"}
    assert odd.constants == {"BLOCK": 1024}
    even = capture_call(EXAMPLES / "scale.py", "scale(torch.randn(1 << 20), 2.0)", cache_dir=tmp_path)[0]
    assert even.divisible_args() == {"x_ptr", "out_ptr", "n"}
    assert "tt.divisibility = 16" in next(ln for ln in even.stages["ttir"].splitlines() if "tt.func" in ln).split("%n")[1]


def test_artifacts_hold_every_stage_remarks_dumps_and_ptxas(scale_artifacts):
    art = scale_artifacts[0]
    assert {"ttir", "ttgir", "llir", "ptx"} <= set(art.stages)
    assert any(s.pass_arg == "tritongpu-coalesce" for s in ir.split_pass_dumps(art.pass_dumps))
    vec = [r for r in art.remarks if "vectorization fails" in r.message]
    assert {r.line for r in vec} == {_line_of("tl.load"), _line_of("tl.store")} and all(r.pass_name == "convert-triton-gpu-to-llvm" for r in vec)
    assert art.ptxas is not None and art.ptxas.registers > 0 and not art.ptxas.spills


def test_compiles_are_cached_by_content(tmp_path):
    call = "scale(torch.randn(4099), 3.0)"
    first = capture_call(EXAMPLES / "scale.py", call, cache_dir=tmp_path)[0]
    cached = list(tmp_path.glob("*.json"))
    assert len(cached) == 1 and cached[0].stem == first.cache_key
    cached[0].write_text(cached[0].read_text().replace("scale_kernel", "from_cache"))
    assert capture_call(EXAMPLES / "scale.py", call, cache_dir=tmp_path)[0].kernel == "from_cache"


def test_task_file_compiles_its_first_case(tmp_path):
    arts = capture_task(EXAMPLES / "scale_task.py", cache_dir=tmp_path)
    assert arts[0].kernel == "scale_kernel" and "n" not in arts[0].divisible_args()


@pytest.mark.parametrize("kernel, call, message", [
    ("broken_import.py", "x", "does not import: RuntimeError: this kernel file is broken on purpose"),
    ("no_launch.py", "helper(torch.randn(4))", "made no Triton launch"),
    ("no_launch.py", "helper(", "is not a Python expression"),
    ("no_launch.py", "undefined_name(1)", "raised NameError"),
    ("missing.py", "x", "does not exist"),
])
def test_bad_input_is_one_clear_error(kernel, call, message):
    with pytest.raises(UserFacingError) as exc:
        capture_call(FIXTURES / "kernels" / kernel, call)
    assert message in str(exc.value) and exc.value.fix


def test_unknown_target_is_refused():
    with pytest.raises(UserFacingError, match="unknown target"):
        capture_call(EXAMPLES / "scale.py", "scale(torch.randn(64), 1.0)", target="tpu:4")


def test_an_autotuned_launch_compiles_the_tuners_pick_when_it_has_one():
    """On a GPU the capture first lets the tuner time its configs in a real call (its `best_config`);
    config 1 (often the smallest tile: mma.sync where the pick runs wgmma) is only the CPU's fallback."""
    import torch

    from harness.capture import FIRST_CONFIG, TUNER_PICK, intercept_callable
    from harness.loading import load_kernel_module

    module = load_kernel_module(FIXTURES / "adversarial" / "autotuned_softmax.py")
    kernel = module.tuned_softmax_kernel

    def capture():
        intercepted = intercept_callable(lambda ns: module.softmax(torch.randn(4, 100)), vars(module), None, "softmax")
        (launch,), (fact,) = intercepted.launches, intercepted.facts()
        return launch.config_note, fact.num_warps

    note, warps = capture()
    assert warps == 1 and note.startswith(FIRST_CONFIG)
    kernel.best_config = kernel.configs[1]  # what Autotuner.run leaves after timing on a device
    note, warps = capture()
    assert warps == 2 and note.startswith(TUNER_PICK)
