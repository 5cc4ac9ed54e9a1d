"""The one owner of IR grammar: compiler text output of every stage, read here and nowhere else.

- `streams`: what a compile writes to stderr (MLIR pass-dump sections, remarks and warnings);
- `mlir`: MLIR text (locations, ops and their source lines, op counts, SSA values, types, attributes,
  aliases, kernel arguments);
- `ptx`: PTX memory accesses and the ptxas -v report;
- `sass`: the machine code's opcodes, read where PTX hides a lowering (memory ordering);
- `counts`: ops counted per stage language (MLIR, LLVM IR, PTX);
- `dumps`: dumps on disk, every format `kb index ir` accepts, read into one list of stages.

Regex-first on purpose: tree-sitter-mlir knows no Triton dialects, and dumps are line-oriented. Every
pattern carries a real example line. The indexers and the analyzers import these parsers; none keeps
an IR regex of its own (tests/test_layering.py checks that no other package compiles one).
"""

from harness.ir.common import IRParseError, SourceLoc
from harness.ir.counts import stage_op_counts
from harness.ir.dumps import STAGE_ORDER, IRDump, IRStage, compile_config, kernel_base, read_ir_dump
from harness.ir.mlir import (
                             ALIAS_REF,
                             FuncArg,
                             OpLine,
                             ShapedType,
                             alias_resolver,
                             attribute,
                             attribute_aliases,
                             attribute_kinds,
                             blocked_layouts,
                             diff_op_counts,
                             func_args,
                             function_name,
                             in_loops,
                             int_list_attribute,
                             mlir_locations,
                             op_counts,
                             op_source_lines,
                             region_end,
                             shaped_types,
                             ssa_defs,
                             ssa_names,
                             unused_results,
                             without_names,
)
from harness.ir.ptx import MemAccess, parse_ptxas_log, ptx_memory_accesses
from harness.ir.sass import has_memory_ordering, sass_opcode_counts
from harness.ir.streams import PassSnapshot, dump_header_pass, parse_remarks, split_pass_dumps

__all__ = [
    "ALIAS_REF",
    "STAGE_ORDER",
    "FuncArg",
    "IRDump",
    "IRParseError",
    "IRStage",
    "MemAccess",
    "OpLine",
    "PassSnapshot",
    "ShapedType",
    "SourceLoc",
    "alias_resolver",
    "attribute",
    "attribute_aliases",
    "attribute_kinds",
    "blocked_layouts",
    "compile_config",
    "diff_op_counts",
    "dump_header_pass",
    "func_args",
    "function_name",
    "has_memory_ordering",
    "in_loops",
    "int_list_attribute",
    "kernel_base",
    "mlir_locations",
    "op_counts",
    "op_source_lines",
    "parse_ptxas_log",
    "parse_remarks",
    "ptx_memory_accesses",
    "read_ir_dump",
    "region_end",
    "sass_opcode_counts",
    "shaped_types",
    "split_pass_dumps",
    "ssa_defs",
    "ssa_names",
    "unused_results",
    "stage_op_counts",
    "without_names",
]
