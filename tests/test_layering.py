"""The house's shape, checked on its import graph (every import, those inside functions too):

- no circle between files, nor between folders (a folder is a room: its files' imports of another
  folder are the room's);
- the packages stack as docs/architecture.md draws them: harness <- kb <- indexer, diagnose <- cli,
  and that picture is the code's (scripts/import_graph.py, which owns the walk);
- the harness (it runs inside GPU workers) needs nothing but the standard library, numpy, torch, triton;
- IR syntax is parsed in harness/ir/ only.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))
from import_graph import PACKAGES, graph, imported, modules, rooms  # noqa: E402 - the script owns the walk

# What each package may import, besides itself. The bench and the optimize loop are diagnose's.
MAY_IMPORT = {
    "harness": set(),
    "kb": {"harness"},
    "indexer": {"harness", "kb"},
    "diagnose": {"harness", "kb"},
    "cli": {"harness", "kb", "indexer", "diagnose"},
}
HARNESS_THIRD_PARTY = {"numpy", "torch", "triton", "torch_npu"}


def _cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one node (Tarjan's, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    nodes = sorted(set(edges) | {b for bs in edges.values() for b in bs})
    for root in nodes:
        if root in index:
            continue
        work = [(root, iter(sorted(edges.get(root, ()))))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is None:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        top = stack.pop()
                        on_stack.discard(top)
                        component.append(top)
                        if top == node:
                            break
                    if len(component) > 1:
                        found.append(sorted(component))
            elif child not in index:
                index[child] = low[child] = len(index)
                stack.append(child)
                on_stack.add(child)
                work.append((child, iter(sorted(edges.get(child, ())))))
            elif child in on_stack:
                low[node] = min(low[node], index[child])
    return found


def test_no_file_imports_itself_through_others():
    assert _cycles(graph()) == []


def test_no_folder_imports_itself_through_others():
    assert _cycles(rooms()) == []


def test_packages_import_only_the_layers_below_them():
    wrong = sorted(f"{a} -> {b}" for a, bs in graph().items() for b in bs
                   if b.split(".")[0] != a.split(".")[0] and b.split(".")[0] not in MAY_IMPORT[a.split(".")[0]])
    assert wrong == []


def test_the_harness_needs_only_the_standard_library_numpy_torch_and_triton():
    outside = set()
    for module, path in modules().items():
        if module.startswith("harness"):
            for name in imported(path, module):
                top = name.split(".")[0]
                if top and top not in sys.stdlib_module_names and top not in PACKAGES and top != "__future__":
                    outside.add(f"{module}: {top}")
    assert {o for o in outside if o.split(": ")[1] not in HARNESS_THIRD_PARTY} == set()


def test_the_checker_sees_a_circle_when_there_is_one():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_the_cli_spells_the_engines_names_as_the_engine_does():
    from cli import options
    from diagnose.records import LEVELS, STRATEGIES
    from harness.backends import BACKENDS

    assert options.LEVELS == LEVELS and options.STRATEGIES == STRATEGIES
    assert options.BACKENDS == ("auto", *BACKENDS)


# Pieces of IR syntax a regex only needs when it parses IR: types, locations, SSA values, aliases,
# functions, regions. harness/ir owns them; elsewhere a regex may name an op or a message, not syntax.
_IR_SYNTAX = ("tensor<", "memref<", "loc\\(", "%[", "#loc", "\\.func", "scf\\.", "= #", "#ttg", "#mma")


def test_ir_syntax_is_parsed_only_in_harness_ir():
    readers = {"compile", "search", "match", "fullmatch", "findall", "finditer", "sub", "split"}
    found = []
    for module, path in modules().items():
        if module.startswith("harness.ir"):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in readers
                    and isinstance(node.func.value, ast.Name) and node.func.value.id == "re" and node.args
                    and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)
                    and any(token in node.args[0].value for token in _IR_SYNTAX)):
                found.append(f"{module}:{node.lineno}: {node.args[0].value}")
    assert found == [], "parse it through harness.ir (add the reader there):\n" + "\n".join(found)


def test_the_architecture_doc_draws_the_code_as_it_is():
    import subprocess

    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "import_graph.py"), "--check"],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
