"""The rewriters' registry: every catalog pattern that names a deterministic rewrite has one, and one only."""

from __future__ import annotations

import pytest

from diagnose.rewriters import REWRITERS, rewrite
from diagnose.rewriters.base import register
from kb.patterns import load_catalog


def test_every_family_registered_its_patterns():
    assert {"block-size-num-warps", "autotune-configs", "wgmma-friendly-tiles", "tl-range-pipelining",
            "masked-tail-split", "divisibility-hints", "persistent-kernel", "tensor-descriptors-tma",
            "dot-input-precision-tf32", "int32-offsets", "relaxed-atomics", "exp2-fast-math"} <= set(REWRITERS)


def test_every_registered_pattern_is_in_the_catalog():
    assert set(REWRITERS) <= {p.id for p in load_catalog()}


def test_a_pattern_cannot_get_a_second_rewriter():
    with pytest.raises(ValueError, match="already has a rewriter"):
        register("masked-tail-split")(lambda source, context: [])


def test_a_pattern_without_a_rewriter_rewrites_nothing():
    assert rewrite("no-such-pattern", "x = 1\n", {}) == []


def test_the_guards_the_features_and_the_rewriters_share_one_rule_for_a_kernel():
    import ast

    import libcst as cst

    from diagnose.rewriters.base import is_jit
    from harness.guards import is_kernel

    source = '''
import functools, triton
from triton import jit
@triton.jit
def a(x): pass
@jit
def b(x): pass
@triton.autotune(configs=[], key=[])
@triton.jit
def c(x): pass
@triton.heuristics({})
def d(x): pass
@functools.cache
def e(x): pass
def myjit(f): return f
@myjit
def f(x): pass
'''
    by_ast = {fn.name for fn in ast.parse(source).body if isinstance(fn, ast.FunctionDef) and is_kernel(fn)}
    by_cst = {fn.name.value for fn in cst.parse_module(source).body if isinstance(fn, cst.FunctionDef) and is_jit(fn)}
    assert by_ast == by_cst == {"a", "b", "c", "d"}
