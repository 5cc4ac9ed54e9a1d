"""The IR parser on small texts written here (shapes taken from real Triton 3.9 output)."""

from harness import ir

DUMP = """\
// -----// IR Dump Before TritonGPUCoalesce: tritongpu-coalesce ('builtin.module' operation) //----- //
module {
  %0 = tt.load %p : tensor<4x!tt.ptr<f32>> loc(#loc1)
}
// -----// IR Dump Before ConvertTritonGPUToLLVM: convert-triton-gpu-to-llvm{compute-capability=90} ('builtin.module' operation) //----- //
module {
  %0 = tt.load %p : tensor<4x!tt.ptr<f32>, #blocked> loc(#loc1)
  %1 = tt.load %q : tensor<4x!tt.ptr<f32>, #blocked> loc(#loc1)
}
/k/scale.py:8:9: remark: Warning: vectorization fails vec = 1 origin vec = 4 numElems = 8 mask is 1
    x = tl.load(x_ptr + offs, mask=mask)
/k/scale.py:8:9: remark: Warning: vectorization fails vec = 1 origin vec = 4 numElems = 8 mask is 1
// -----// IR Dump After CSE (cse) ('func.func' operation: @add_kernel) //----- //
func.func @add_kernel() { return }
"""


def test_split_pass_dumps_reads_triton_and_mlir_headers():
    snaps = ir.split_pass_dumps(DUMP)
    assert [(s.when, s.pass_class, s.pass_arg) for s in snaps] == [
        ("Before", "TritonGPUCoalesce", "tritongpu-coalesce"),
        ("Before", "ConvertTritonGPUToLLVM", "convert-triton-gpu-to-llvm"),
        ("After", "CSE", "cse"),
    ]
    assert snaps[1].options == "{compute-capability=90}"
    assert "tt.load %q" in snaps[1].text and "tt.load %q" not in snaps[0].text
    assert ir.diff_op_counts(snaps[0].text, snaps[1].text) == {"tt.load": 1}


def test_remarks_carry_location_and_emitting_pass_once():
    remarks = ir.parse_remarks(DUMP)
    assert len(remarks) == 1  # the duplicate print is kept once
    r = remarks[0]
    assert (r.file, r.line, r.col, r.severity) == ("/k/scale.py", 8, 9, "remark")
    assert r.pass_name == "convert-triton-gpu-to-llvm"
    assert r.message.startswith("Warning: vectorization fails vec = 1")


PTX = """\
\t.loc\t1 8 9                           // scale.py:8:9
\t@%p1 ld.global.b32 { %r1 }, [ %rd1 + 0 ];
\t.loc\t1 9 5                           // scale.py:9:5
\tst.global.v4.b32 [ %rd3 + 0 ], { %r9, %r10, %r11, %r12 };
\tatom.global.gpu.acq_rel.add.f32 %f1, [%rd1], %f2;
\t.file\t1 "/k/scale.py"
"""


def test_ptx_accesses_have_width_predicate_and_source_line():
    acc = ir.ptx_memory_accesses(PTX)
    assert [(a.kind, a.vector, a.element_bits, a.bits, a.predicated) for a in acc] == [
        ("load", 1, 32, 32, True), ("store", 4, 32, 128, False), ("atomic", 1, 32, 32, False)]
    assert acc[0].loc == ir.SourceLoc("/k/scale.py", 8, 9)
    assert acc[1].loc.line == 9


def test_ptxas_log_with_and_without_spills():
    log = """ptxas-blackwell info    : Function properties for center_kernel
    2976 bytes stack frame, 7880 bytes spill stores, 10368 bytes spill loads
ptxas-blackwell info    : Used 64 registers, used 0 barriers, 2976 bytes cumulative stack size"""
    r = ir.parse_ptxas_log(log)
    assert (r.registers, r.spill_stores, r.spill_loads, r.stack_frame, r.spills) == (64, 7880, 10368, 2976, True)
    assert ir.parse_ptxas_log("ptxas info    : Used 40 registers, 16384 bytes smem").shared_bytes == 16384
    assert ir.parse_ptxas_log("nothing here") is None


TTIR = """\
#loc = loc("/k/scale.py":4:1)
module {
  tt.func public @k(%x_ptr: !tt.ptr<f32> {tt.divisibility = 16 : i32} loc("x_ptr"(#loc)), %n: i32 loc("n"(#loc))) attributes {noinline = false} {
    %x = tt.load %p, %m : tensor<1024x!tt.ptr<f32>> loc(#loc19)
    tt.return loc(#loc9)
  } loc(#loc)
} loc(#loc)
#loc6 = loc("/k/scale.py":8:9)
#loc19 = loc("x"(#loc6))
"""


def test_func_args_and_locations():
    args = ir.func_args(TTIR)
    assert [(a.name, a.is_pointer, a.divisibility) for a in args] == [("x_ptr", True, 16), ("n", False, None)]
    loads = ir.op_source_lines(TTIR, {"tt.load"})
    assert len(loads) == 1 and loads[0].loc == ir.SourceLoc("/k/scale.py", 8, 9)


def test_func_args_rejects_non_triton_ir():
    import pytest

    with pytest.raises(ir.IRParseError):
        ir.func_args("module {}")


def test_inline_asm_and_calls_are_counted_by_what_they_stand_for():
    """After lowering to LLVM a vectorized load is an `llvm.inline_asm` and `tl.math.erf` a call:
    counted as bare ops they could not be traced."""
    module = (
        '    %5 = llvm.inline_asm has_side_effects asm_dialect = att operand_attrs = [] "mov.u32 $0, 0x0;\\0A\\09'
        '@$5 ld.global.v4.b32 { $0, $1, $2, $3 }, [ $4 + 0 ];", "=r,=r,=r,=r,l,b" %3, %4 : (!llvm.ptr<1>, i1) -> '
        "!llvm.struct<(i32, i32, i32, i32)> loc(#loc3)\n"
        "    %6 = llvm.call @__nv_erff(%2) : (f32) -> f32 loc(#loc4)\n"
        '    llvm.inline_asm has_side_effects asm_dialect = att operand_attrs = [] "wgmma.fence.sync.aligned;", ""  : () -> ()\n'
    )
    assert ir.op_counts(module) == {"llvm.inline_asm(ld.global.v4.b32)": 1, "llvm.call(@__nv_erff)": 1,
                                    "llvm.inline_asm(wgmma.fence.sync.aligned)": 1}
    llir = ('  %20 = tail call { i32, i32 } asm sideeffect "mov.u32 $0, 0x0;\\0A\\09@$3 ld.global.v2.b32 { $0, $1 }, '
            '[ $2 + 0 ];", "=r,=r,l,b"(ptr addrspace(1) %17, i1 %14)\n  %21 = call float @__nv_erff(float %3)\n')
    assert ir.stage_op_counts(llir, "llvm") == {"call asm(ld.global.v2.b32)": 1, "call @__nv_erff": 1}


def test_a_failed_pass_and_function_scoped_sections():
    stream = (
        "// -----// IR Dump After Canonicalizer (canonicalize) ('func.func' operation: @add_kernel) //----- //\n"
        "func.func @add_kernel() {\n  return\n}\n"
        "// -----// IR Dump After Canonicalizer (canonicalize) ('func.func' operation: @helper) //----- //\n"
        "func.func private @helper() {\n  return\n}\n"
        "// -----// IR Dump After HIVMLoadVectorize Failed (hivm-load-vectorize) ('func.func' operation: @add_kernel) //----- //\n"
        "func.func @add_kernel() {\n  return\n}\n"
    )
    [first, helper, failed] = ir.split_pass_dumps(stream)
    assert (failed.pass_arg, failed.failed, failed.func) == ("hivm-load-vectorize", True, "add_kernel")
    assert ir.dump_header_pass("IR Dump After HIVMLoadVectorize Failed (hivm-load-vectorize)") == "hivm-load-vectorize"
    assert ir.dump_header_pass("// IR Dump Before TritonGPUCoalesce") == "TritonGPUCoalesce"  # pasted in part
    assert ir.dump_header_pass("IR Dump Before X: x-arg") == "x-arg"


def test_a_dump_header_cut_short_is_noted(tmp_path):
    """A killed run's stream can end in half a header: the section after it is not lost in silence."""
    stream = tmp_path / "cut.txt"
    stream.write_text("// -----// IR Dump After Canonicalizer (canonicalize) //----- //\nmodule {\n}\n"
                      "// -----// IR Dump After HIVMScal\nmodule {\n}\n")
    dump = ir.read_ir_dump(stream)
    assert [s.pass_arg for s in dump.stages] == ["canonicalize"]
    assert dump.notes == ["cut.txt:4: a dump header kb cannot read (cut short?); what follows it is counted "
                          "with the section before"]


REDUCE_IN_A_LOOP = """\
#loc = loc("/k/row_dot.py":8:0)
#loc5 = loc("/k/row_dot.py":17:22)
#loc9 = loc("/site-packages/triton/language/standard.py":293:36)
#loc11 = loc("/site-packages/triton/language/standard.py":314:15)
#loc12 = loc(callsite(#loc9 at #loc5))
#loc13 = loc(callsite(#loc11 at #loc5))
#loc14 = loc("/k/row_dot.py":12:4)
#loc15 = loc(callsite(#loc14 at #loc))
module {
    %9 = "tt.reduce"(%8) <{axis = 0 : i32}> ({
    ^bb0(%a: f32 loc(callsite(#loc9 at #loc5)), %b: f32 loc(callsite(#loc9 at #loc5))):
      %s = arith.addf %a, %b : f32 loc(#loc12)
      tt.reduce.return %s : f32 loc(#loc12)
    }) : (tensor<16xf32, #blocked>) -> f32 loc(#loc13)
    %10 = arith.addf %acc, %9 : f32 loc(#loc15)
}
"""


def test_an_op_written_in_triton_s_library_is_located_at_the_kernel_s_call():
    """tl.sum's reduce is written in triton/language/standard.py and inlined at the kernel's line 17; a
    generic-form op with a region prints its location on the line that closes the region."""
    reduce_op, = ir.op_source_lines(REDUCE_IN_A_LOOP, {"tt.reduce"})
    assert reduce_op.loc == ir.SourceLoc("/k/row_dot.py", 17, 22)
    add = [op for op in ir.op_source_lines(REDUCE_IN_A_LOOP, {"arith.addf"}) if "%acc" in op.text]
    assert add[0].loc == ir.SourceLoc("/k/row_dot.py", 12, 4)  # a helper in the same file keeps its own line


def test_sass_opcodes_are_counted_in_both_disassembly_forms_and_ordering_is_read_off_the_ptx():
    sass = ("Function:k\n--:-:-:-:6\tMEMBAR.ALL.GPU;\n32:1:2:-:4\tATOMG.E.ADD.F32x4.FTZ.RN.STRONG.GPU PT, RZ, "
            "desc[UR8][R2.64], R4;\n04:-:-:-:1\tCCTL.IVALL;\n.L_x_0:\n--:-:-:-:1\t@!P0 EXIT;\n"
            "        /*0110*/                   MEMBAR.ALL.GPU ;\n")
    counts = ir.sass_opcode_counts(sass)
    assert counts == {"MEMBAR.ALL.GPU": 2, "ATOMG.E.ADD.F32x4.FTZ.RN.STRONG.GPU": 1, "CCTL.IVALL": 1, "EXIT": 1}
    assert ir.has_memory_ordering("\t@%p1 atom.global.gpu.acq_rel.add.f32 %r1, [ %rd11 + 0 ], %r2;")
    assert ir.has_memory_ordering("\tfence.acq_rel.gpu;")
    assert not ir.has_memory_ordering("\t@%p1 red.global.gpu.relaxed.add.f32 [ %rd11 + 0 ], %r1;\n\tld.global.b32 %r1, [%rd1];")


def test_unused_results_are_the_ops_whose_value_no_other_line_names():
    ttir = ("%5 = tt.atomic_rmw fadd, acq_rel, gpu, %4, %v, %m : (...) -> tensor<8xf32>\n"
            "%6 = tt.atomic_rmw fadd, acq_rel, gpu, %4, %v, %m : (...) -> tensor<8xf32>\n"
            "%50 = arith.addf %6, %6 : tensor<8xf32>\n")
    ops = ir.op_source_lines(ttir, {"tt.atomic_rmw"})
    assert [o.text.split(" =")[0] for o in ir.unused_results(ttir, ops)] == ["%5"]  # %50 is not %5
