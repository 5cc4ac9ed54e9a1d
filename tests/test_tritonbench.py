"""`kb import tritonbench` on a small tree in TritonBench-T's layout (tests/fixtures/tritonbench, written
by us): three operators, drafts from three models, one unmatched prompt, and a G half that must never
be read. The drafts' checks run in the real judge, on the CPU interpreter."""

from __future__ import annotations

import shutil
import sqlite3

import pytest
from click.testing import CliRunner
from conftest import FIXTURES, REPO

from cli import main
from harness.run import RunOptions, run_task
from harness.task import TaskSpec, load_task
from indexer.tritonbench import Failure, ImportOptions, import_tritonbench
from indexer.tritonbench.drafts import extract_code, screen
from indexer.tritonbench.source import TritonBenchT, model_order
from indexer.tritonbench.taskgen import family_of, timed_indices

TREE = FIXTURES / "tritonbench"


def _options(out):
    return ImportOptions(out=out, backend="interpreter", workers=2, seeds=1, timeout_s=120, perf_cases="smallest")


@pytest.fixture(scope="module")
def imported(tmp_path_factory):
    out = tmp_path_factory.mktemp("tritonbench")
    events = []
    summary = import_tritonbench(TREE, _options(out), lambda op, outcome: events.append((op, outcome)))
    return out, summary, events


def test_the_first_passing_draft_in_model_order_becomes_the_task(imported):
    out, summary, _ = imported
    assert {op: o.model for op, o in summary.imported.items()} == {"scale_add": "output_modelB", "row_sum": "coderX"}
    scale_add = {o.model: o.failure for o in summary.failed.get("scale_add", [])}
    assert scale_add == {}  # an operator with a passing draft is not listed as failed
    ledger = sqlite3.connect(out / "import.sqlite")
    failures = dict(((op, model), failure) for op, model, failure in
                    ledger.execute("SELECT op, model, failure FROM drafts"))
    assert failures[("scale_add", "output_modelA")] == Failure.WRONG_VALUES.value  # it forgets alpha
    assert failures[("row_sum", "output_modelA")] == Failure.TORCH_ONLY.value
    assert failures[("row_sum", "output_modelB")] == Failure.NO_WRAPPER.value  # defines rowsum, not row_sum
    assert failures[("row_sum", "coderX")] is None  # kernel and wrapper in two fences, joined
    assert summary.unmatched == 1  # the prompt that names no wrapper is counted, never guessed


def test_an_operator_without_a_passing_draft_lists_each_drafts_reason(imported):
    out, summary, _ = imported
    assert [(o.model, o.failure) for o in summary.failed["relu_twice"]] == [
        ("output_modelA", Failure.SYNTAX), ("output_modelB", Failure.TORCH_ONLY), ("coderX", Failure.NO_CODE)]
    probe = sqlite3.connect(out / "import.sqlite").execute("SELECT probe FROM probes WHERE op='relu_twice'").fetchone()
    assert '"tests": 1, "tests_dropped": 1' in probe[0]  # its inplace=True call returns its input: left out
    text = (out / "IMPORT.md").read_text()
    assert "relu_twice" in text and "was never closed" in text and "PyTorch-only" in text


def test_the_task_is_the_operators_own_code_and_passes_the_judge_where_it_lies(imported):
    out, _, _ = imported
    task = load_task(out / "scale_add" / "task.py")
    # 5 timed input sets spread over the 7 of the sweep, its largest among them
    assert [c["perf"] for c in task.cases] == [0, 2, 3, 4, 6]
    assert task.cases[-1]["size"] == "4096 4096"
    # the test's 4 calls less the one passing an out= tensor; keywords as the test wrote them
    assert len(task.heldout) == 3
    args, kwargs = task.arguments(task.heldout[1])
    assert kwargs == {"alpha": 0.5} and len(args) == 2
    args, kwargs = task.arguments(task.cases[0])  # as call_op calls the operator
    assert kwargs == {"alpha": 0.5} and args[0].shape == (64,)
    assert task.bytes(**task.cases[-1]) == 3 * 4096 * 4  # the perf script's get_gbps formula
    assert task.flops(**task.cases[-1]) == 2 * 4096
    draft = (out / "scale_add" / "scale_add_draft.py").read_text()
    assert "print(" not in draft and "# a demo" in draft  # the demo run at import dropped, comments kept
    assert draft.startswith("import triton.language as tl\n")  # it uses tl without importing it
    # `other * alpha` in the wrapper: torch work no static reading names, allowed after the judge saw it
    assert task.allow_torch == ("mul",) or list(task.allow_torch) == ["mul"]
    report = run_task(TaskSpec.of_file(out / "scale_add" / "task.py"),
                      RunOptions(backend="interpreter", time=False, seeds=1, generated_heldout=0, cases=[0]))
    assert report.run("baseline").correct


def test_an_import_resumes_without_judging_again_and_restores_a_lost_task(imported, tmp_path):
    out, summary, events = imported
    copy = tmp_path / "copy"
    shutil.copytree(out, copy)
    again = []
    second = import_tritonbench(TREE, _options(copy), lambda op, outcome: again.append((op, outcome)))
    assert [o for _, o in again if o is not None] == []  # every draft's verdict came from the ledger
    assert second.imported.keys() == summary.imported.keys()
    shutil.rmtree(copy / "row_sum")  # a folder lost after its verdict: the passing draft is judged again
    third = []
    import_tritonbench(TREE, _options(copy), lambda op, outcome: third.append((op, outcome)))
    assert [(op, o.model) for op, o in third if o is not None] == [("row_sum", "coderX")]
    assert (copy / "row_sum" / "task.py").is_file()
    # an import of one operator leaves the folder's summary whole
    fourth = import_tritonbench(TREE, ImportOptions(**{**vars(_options(copy)), "ops": ["row_sum"]}))
    assert set(fourth.imported) == {"scale_add", "row_sum"} and set(fourth.failed) == {"relu_twice"}
    assert "scale_add" in (copy / "IMPORT.md").read_text()


def test_a_deadline_starts_no_check_and_the_next_run_goes_on(tmp_path):
    out = tmp_path / "out"
    result = CliRunner().invoke(main, ["import", "tritonbench", str(TREE), "--out", str(out), "--backend", "interpreter",
                                       "--ops", "scale_add", "--stop-after", "0", "--perf-cases", "smallest"])
    assert result.exit_code == 0, result.output
    assert "1 operator(s) not finished" in result.output and not (out / "scale_add").exists()
    assert "Not finished" in (out / "IMPORT.md").read_text()
    summary = import_tritonbench(TREE, ImportOptions(**{**vars(_options(out)), "ops": ["scale_add"]}))
    assert summary.imported["scale_add"].model == "output_modelB" and not summary.unfinished


def test_a_reference_that_fails_on_its_own_sets_the_operator_aside_and_is_tried_again_later(tmp_path):
    """A failure outside the draft's code (the reference on the perf inputs) is no draft's verdict: after
    two drafts meet it the operator is set aside, the third draft untried, and a later run tries again."""
    tree = tmp_path / "tree"
    shutil.copytree(TREE, tree)
    reference = tree / "data" / "TritonBench_T_v1" / "scale_add.py"
    reference.write_text(reference.read_text().replace(
        "    result = input + alpha * other\n",
        "    if input.numel() == 64:  # the perf sweep's first set\n"
        "        raise ValueError('this reference takes no 64-element input')\n"
        "    result = input + alpha * other\n", 1))
    options = ImportOptions(**{**vars(_options(tmp_path / "out")), "ops": ["scale_add"]})
    for _ in range(2):
        events = []
        summary = import_tritonbench(tree, options, lambda op, outcome: events.append(outcome))
        assert [(o.model, o.failure) for o in events if o] == [("output_modelA", Failure.CHECK),
                                                               ("output_modelB", Failure.CHECK)]
        assert "reference worker failed (make): ValueError: this reference takes no" in summary.unusable["scale_add"]
        assert "scale_add" not in summary.failed and "scale_add" not in summary.imported


def _reference_out_of_memory(tmp_path, times):
    """A copy of the tree whose scale_add reference runs out of device memory on its first `times` calls in
    a judge (a file counts them: each check's reference runs in a worker process of its own; the importer's
    probe of the test's calls, a process of its own too, is let through)."""
    tree = tmp_path / "tree"
    shutil.copytree(TREE, tree)
    reference = tree / "data" / "TritonBench_T_v1" / "scale_add.py"
    count = tmp_path / "count"
    reference.write_text(reference.read_text().replace(
        "    result = input + alpha * other\n",
        f"    import pathlib, sys\n"
        f"    seen = pathlib.Path({str(count)!r})\n"
        f"    if sys.argv[0].endswith('probe.py'):\n"
        f"        return input + alpha * other\n"
        f"    calls = int(seen.read_text()) if seen.exists() else 0\n"
        f"    seen.write_text(str(calls + 1))\n"
        f"    if calls < {times}:\n"
        f"        raise torch.cuda.OutOfMemoryError('CUDA out of memory. Tried to allocate 4.00 GiB.')\n"
        "    result = input + alpha * other\n", 1))
    return tree


def test_a_draft_crowded_out_of_the_devices_memory_is_judged_again_alone(tmp_path):
    """Out of memory beside other checks is no verdict on the draft (an 80 GB H100 importing 15 at once sent
    13 operators to a later draft that way): the draft is judged again with the device to itself."""
    tree = _reference_out_of_memory(tmp_path, times=1)
    events = []
    summary = import_tritonbench(tree, ImportOptions(**{**vars(_options(tmp_path / "out")), "ops": ["scale_add"]}),
                                 lambda op, outcome: events.append(outcome))
    # modelA met the memory wall first; judged again alone it is wrong on its own (it forgets alpha)
    assert [(o.model, o.failure) for o in events if o] == [("output_modelA", Failure.WRONG_VALUES),
                                                           ("output_modelB", None)]
    assert summary.imported["scale_add"].model == "output_modelB"


def test_out_of_memory_alone_is_the_reference_s_problem_or_the_draft_s(tmp_path):
    tree = _reference_out_of_memory(tmp_path, times=100)
    events = []
    summary = import_tritonbench(tree, ImportOptions(**{**vars(_options(tmp_path / "out")), "ops": ["scale_add"]}),
                                 lambda op, outcome: events.append(outcome))
    # the reference alone does not fit: the operator's problem on this device, set aside after two drafts
    assert [(o.model, o.failure) for o in events if o] == [("output_modelA", Failure.CHECK),
                                                           ("output_modelB", Failure.CHECK)]
    assert summary.unusable["scale_add"].startswith("judged alone: the judge's reference worker failed")


def test_a_ledger_s_crowded_out_verdict_before_the_imported_draft_is_judged_on_resume(imported, tmp_path):
    out, summary, _ = imported
    copy = tmp_path / "copy"
    shutil.copytree(out, copy)
    ledger = sqlite3.connect(copy / "import.sqlite", isolation_level=None)
    ledger.execute("UPDATE drafts SET failure='raised at runtime', reason=? WHERE op='scale_add' AND "
                   "model='output_modelA'", ("the judge's reference worker failed (compare): OutOfMemoryError: CUDA "
                                             "out of memory. Tried to allocate 1024.00 MiB.",))
    ledger.close()
    events = []
    again = import_tritonbench(TREE, ImportOptions(**{**vars(_options(copy)), "ops": ["scale_add"]}),
                               lambda op, outcome: events.append(outcome))
    assert [(o.model, o.failure) for o in events if o][0] == ("output_modelA", Failure.WRONG_VALUES)
    assert again.imported["scale_add"].model == "output_modelB"


def test_the_device_gate_runs_a_retry_alone_and_before_new_checks():
    import threading
    import time

    from indexer.tritonbench.device_gate import DeviceGate

    gate, log, lock = DeviceGate(), [], threading.Lock()
    inside = threading.Barrier(3)

    def check(name, first_wait):
        with gate.shared():
            with lock:
                log.append(f"+{name}")
            if first_wait:
                inside.wait()
            time.sleep(0.05)
            with lock:
                log.append(f"-{name}")

    def retry():
        inside.wait()  # both checks are running
        with gate.alone():
            with lock:
                log.append("+alone")
            time.sleep(0.05)
            with lock:
                log.append("-alone")

    threads = [threading.Thread(target=check, args=(n, True)) for n in "ab"] + [threading.Thread(target=retry)]
    for t in threads:
        t.start()
    time.sleep(0.02)
    late = threading.Thread(target=check, args=("c", False))  # asks while the retry waits: goes after it
    late.start()
    for t in [*threads, late]:
        t.join(timeout=10)
    alone = log.index("+alone")
    assert log[alone + 1] == "-alone"  # nothing ran beside it
    assert {"-a", "-b"} <= set(log[:alone]) and log.index("+c") > alone


def test_stored_verdicts_are_sorted_by_todays_rules_when_read(tmp_path):
    from indexer.tritonbench.importer import DraftOutcome, _Ledger

    ledger = _Ledger(tmp_path / "import.sqlite")
    rows = {  # (class stored by an older rule, the judge's reason) -> the class it has now
        ("hang or timeout", "case perf=0, seed 0: the kernel changed process-wide state: torch cuda random state"):
            Failure.OTHER,  # "changed" is no hang
        ("hang or timeout", "the judge's reference worker failed (share): ExchangeError: input[1] is a Linear"):
            Failure.CHECK,
        ("other", "case perf=0: UnsupportedLanguageConstruct: at 3:4:"): Failure.COMPILE,
        ("hang or timeout", "baseline: timed out after 60 s (a hang, or far slower than allowed)"): Failure.HANG,
        ("raised at runtime", "the judge's reference worker failed (compare): OutOfMemoryError: CUDA out of memory."):
            Failure.DEVICE_MEMORY,  # judged again: it shared the device
        ("the device ran out of memory", "judged alone: baseline: OutOfMemoryError: CUDA out of memory."):
            Failure.DEVICE_MEMORY,  # kept: the draft's own
        ("the check could not judge it", "judged alone: the judge's reference worker failed (make): "
                                         "OutOfMemoryError: CUDA out of memory."): Failure.CHECK,
        ("compile error", "case 0: OutOfResources: out of resource: shared memory, Required: 262144"):
            Failure.COMPILE,  # the kernel's own shared memory, not the device's
        ("does not parse", "line 3: '(' was never closed"): Failure.SYNTAX,  # screening's classes stay
    }
    for i, (failure, reason) in enumerate(rows):
        ledger.db.execute("INSERT INTO drafts VALUES (?, ?, ?, ?, ?, ?)", ("op", f"m{i}", i, failure, reason, 1.0))
    assert [ledger.outcome("op", f"m{i}").failure for i in range(len(rows))] == list(rows.values())
    ledger.record(DraftOutcome("op", "m9", 9, None, "passed", 1.0))
    assert ledger.outcome("op", "m9").failure is None


def test_only_the_t_half_is_read(imported):
    out, _, _ = imported
    bench = TritonBenchT(TREE)
    assert bench.models() == ["output_modelA", "output_modelB", "coderX"]  # no Bench_G_* file among them
    assert "G_v1" not in (out / "scale_add" / "task.py").read_text()


def test_model_order_is_first_drafts_before_rag_and_general_before_coder():
    assert model_order(["qwen_rag", "output_gpt-4o_rag", "qwen", "output_o1", "output_Claude"]) == [
        "output_Claude", "output_o1", "qwen", "output_gpt-4o_rag", "qwen_rag"]


def test_code_is_taken_from_fenced_answers_and_screened():
    answer = "Kernel:\n```python\nimport triton\n@triton.jit\ndef k(x):\n    pass\n```\nWrapper:\n```py\ndef op(x):\n    k[(1,)](x)\n```"
    code = extract_code(answer)
    assert "def k" in code and "def op" in code
    kept = screen("import torch\nimport triton\nDEVICE = torch.device('cuda')\n@triton.jit\ndef k(x):\n    pass\n"
                  "def op(x):\n    k[(1,)](x)\nx = torch.randn(4)\nop(x)\nfor i in range(3):\n    op(x)\n", ["op"])
    assert kept.problem is None and kept.dropped == 3 and "DEVICE = torch.device" in kept.code
    kernel_wrapper = screen("@triton.jit\ndef op(x):\n    pass\n", ["op"])
    assert kernel_wrapper.problem.startswith("the wrapper op is itself")
    assert kernel_wrapper.failure is Failure.WRAPPER_IS_KERNEL  # not "PyTorch only": it has a kernel
    assert screen("Sorry, I cannot do that.", ["op"]).problem == "the answer has no code"
    typed = screen("import triton\n@triton.jit\ndef k(x):\n    pass\ndef op(x: Tensor, n: Optional[int] = None):\n"
                   "    k[(1,)](x)\n", ["op"])
    assert typed.added_imports == ("from torch import Tensor", "from typing import Optional")


def test_timed_indices_and_families():
    assert timed_indices(16) == [0, 4, 8, 11, 15]
    assert timed_indices(3) == [0, 1, 2]
    assert family_of("fused_mv_sigmoid_sub") == "matmul"
    assert family_of("softmax") == "softmax"
    assert family_of("relu") == "elementwise"


def test_bad_input_is_refused_in_one_line(tmp_path):
    result = CliRunner().invoke(main, ["import", "tritonbench", str(TREE), "--out", str(REPO / "corpora" / "tb-tasks"),
                                       "--backend", "interpreter"])
    assert result.exit_code != 0 and "inside the kernel-kb repository" in result.output
    assert not (REPO / "corpora" / "tb-tasks").exists()
    result = CliRunner().invoke(main, ["import", "tritonbench", str(tmp_path), "--out", str(tmp_path / "out")])
    assert result.exit_code != 0 and "is not a TritonBench checkout" in result.output
    result = CliRunner().invoke(main, ["import", "tritonbench", str(TREE), "--out", str(tmp_path / "out"),
                                       "--ops", "no_such_op", "--backend", "interpreter"])
    assert result.exit_code != 0 and "no TritonBench-T operator no_such_op" in result.output
    result = CliRunner().invoke(main, ["import", "tritonbench", str(TREE), "--out", str(tmp_path / "out"),
                                       "--models", "output_nobody", "--backend", "interpreter"])
    assert result.exit_code != 0 and "no draft file output_nobody.jsonl" in result.output
