"""A small-shape path: one module that runs one kernel module's code on small inputs and another's on
large ones, chosen per call by the bytes of the tensors the entry is given.

A rewrite that wins on large cases often loses on small ones: a bigger tile or a deeper pipeline
pays off on 2^27 elements and costs a few microseconds on 4096 (TritonBench-T's sum: 3.59x geomean,
0.86x on its smallest case). The judge does not accept such a variant as it is (`judging.acceptable`);
dispatching on shape is the rewrite that keeps both.

The two modules are merged by name, through libcst's scope analysis: every module-level name the
small module defines (functions, Triton kernels, classes, constants) gets a suffix, with every reference
to it, so its kernels and helpers sit beside the large module's unchanged. Triton resolves a @jit
function's globals by name at compile time, so the renamed kernels call their own renamed helpers.
Imports are shared; a name the two modules bind differently makes the merge refuse (None) rather than
guess. A module that is a small-shape path already merges again (a later round's variant of it): its
names take the next free suffix (`_kb_small2`), and its size helper serves both.
"""

from __future__ import annotations

import libcst as cst
from libcst.metadata import Assignment, GlobalScope, ImportAssignment, MetadataWrapper, ScopeProvider

__all__ = ["SMALL_SUFFIX", "LARGE_SUFFIX", "size_dispatch"]

SMALL_SUFFIX = "_kb_small"
LARGE_SUFFIX = "_kb_large"

# Every tensor among the entry's arguments, each once, as the judge counts an input set's bytes
# (harness.reference): the threshold was measured on that figure. It calls only the builtins in
# _HELPER_BUILTINS, which the merge refuses to see rebound (a draft's entry may be named `sum`, and the
# judge refuses `import builtins`), and no method the judge's static guard reads as tensor compute
# (`.add`, `.sum`): a set's `.add` was taken for a torch fallback.
_HELPER_BUILTINS = {"isinstance", "id", "list", "tuple", "dict"}
_INPUT_BYTES = '''

def _kb_input_bytes(*values):
    """The bytes of the tensors among `values` (in lists, tuples and dicts too), each tensor once."""
    sizes, todo = {}, list(values)
    while todo:
        value = todo.pop()
        if isinstance(value, torch.Tensor):
            sizes[id(value)] = value.numel() * value.element_size()
        elif isinstance(value, (list, tuple)):
            todo.extend(value)
        elif isinstance(value, dict):
            todo.extend(value.values())
    total = 0
    for size in sizes.values():
        total += size
    return total
'''


def size_dispatch(small: str, large: str, entry: str, threshold: int) -> str | None:
    """One module whose `entry` calls `small`'s entry when its tensor arguments hold at most `threshold`
    bytes and `large`'s otherwise; None when the two cannot share a module (a name bound differently
    by each, an entry that is not a plain function of the same parameters in both)."""
    small_mod, large_mod = cst.parse_module(small), cst.parse_module(large)
    small_entry, large_entry = _entry_def(small_mod, entry), _entry_def(large_mod, entry)
    if small_entry is None or large_entry is None or _signature(small_entry) != _signature(large_entry):
        return None
    small_names, small_imports = _module_bindings(small_mod)
    large_names, large_imports = _module_bindings(large_mod)
    if small_names is None or large_names is None or small_imports is None or large_imports is None:
        return None
    taken = small_names | large_names | set(small_imports) | set(large_imports)
    depth = next(d for d in ("", *map(str, range(2, 100)), None)
                 if d is None or not ({n + SMALL_SUFFIX + d for n in small_names} | {entry + LARGE_SUFFIX + d}) & taken)
    if depth is None:
        return None
    small_suffix, large_name = SMALL_SUFFIX + depth, entry + LARGE_SUFFIX + depth
    # A large module that is itself a small-shape path (a later round's variant of one) has our helper already.
    helper = _INPUT_BYTES.strip()
    own_helper = any(isinstance(st, cst.FunctionDef) and st.name.value == "_kb_input_bytes"
                     and large_mod.code_for_node(st).strip() == helper for st in large_mod.body)
    if ("_kb_input_bytes" in large_names and not own_helper) or "_kb_input_bytes" in small_imports \
            or _HELPER_BUILTINS & (large_names | set(large_imports) | {entry}):
        return None
    if any(large_imports.get(n, bound) != bound for n, bound in small_imports.items()) \
            or set(small_imports) & large_names or set(large_imports) & {n + small_suffix for n in small_names}:
        return None
    if large_imports.get("torch", "torch") != "torch" or small_imports.get("torch", "torch") != "torch" or "torch" in large_names:
        return None
    small_body = _renamed(small_mod, {n: n + small_suffix for n in small_names})
    large_body = _renamed(large_mod, {entry: large_name})
    future = [s for s in (*large_mod.body, *small_mod.body) if _is_future(s)]
    imports: dict[str, cst.SimpleStatementLine] = {}
    for statement in (*large_body.body, *small_body.body):
        if isinstance(statement, cst.SimpleStatementLine) and _is_import(statement) and not _is_future(statement):
            imports.setdefault(large_mod.code_for_node(statement).strip(), statement)
    if "torch" not in large_imports and "torch" not in small_imports:
        imports["import torch"] = cst.parse_statement("import torch")  # type: ignore[assignment]
    rest = [s for s in large_body.body if not _is_import(s) and not _docstring(s, large_body)]
    small_rest = [s for s in small_body.body if not _is_import(s) and not _docstring(s, small_body)]
    docstring = [s for s in large_body.body[:1] if _docstring(s, large_body)]
    head = cst.Module(body=[*docstring, *{large_mod.code_for_node(s): s for s in future}.values(),
                            *imports.values()]).code
    note = (f"\n\n# The small-shape path: {entry} below, as the parent wrote it, with every module-level name "
            f"suffixed {small_suffix}\n")
    return (head + "\n" + cst.Module(body=rest).code + note + cst.Module(body=small_rest).code
            + ("" if own_helper else _INPUT_BYTES) + "\n\n"
            + _dispatcher(large_entry, entry, threshold, entry + small_suffix, large_name))


def _entry_def(module: cst.Module, entry: str) -> cst.FunctionDef | None:
    defs = [s for s in module.body if isinstance(s, cst.FunctionDef) and s.name.value == entry]
    return defs[-1] if defs and not defs[-1].asynchronous else None


def _signature(fn: cst.FunctionDef) -> tuple[tuple[str, ...], ...]:
    p = fn.params
    star = p.star_arg.name.value if isinstance(p.star_arg, cst.Param) else ("*" if p.star_arg else "")
    return (tuple(x.name.value for x in p.posonly_params), tuple(x.name.value for x in p.params), (star,),
            tuple(x.name.value for x in p.kwonly_params), (p.star_kwarg.name.value if p.star_kwarg else "",))


def _module_bindings(module: cst.Module) -> tuple[set[str] | None, dict[str, str] | None]:
    """The module-level names a module defines (not by import), and those its top-level imports bind
    (name -> what it binds, "torch" or "triton.language" or "typing:Any"); (None, None) when a name is
    bound both ways (a try/except import) or by an import under a condition."""
    scope = _global_scope(MetadataWrapper(module, unsafe_skip_copy=True))
    top = {id(s) for line in module.body if isinstance(line, cst.SimpleStatementLine) and _is_import(line)
           for s in line.body}
    defined: set[str] = set()
    imported: dict[str, str] = {}
    for assignment in scope.assignments:
        if isinstance(assignment, ImportAssignment):
            bound = _bound(assignment.node, assignment.name) if id(assignment.node) in top else None
            if bound is None or imported.get(assignment.name, bound) != bound:
                return None, None
            imported[assignment.name] = bound
        elif not (assignment.name.startswith("__") and assignment.name.endswith("__")):
            defined.add(assignment.name)
    if defined & set(imported):
        return None, None
    return defined, imported


def _bound(node: cst.CSTNode, name: str) -> str | None:
    """What an import statement binds `name` to: a module's dotted name, or "module:attribute"."""
    code = cst.Module(body=[]).code_for_node
    if isinstance(node, cst.Import):
        for alias in node.names:
            dotted = code(alias.name)
            if alias.asname is not None and code(alias.asname.name) == name:
                return dotted
            if alias.asname is None and dotted.split(".")[0] == name:
                return name
    elif isinstance(node, cst.ImportFrom) and not isinstance(node.names, cst.ImportStar):
        source = "." * len(node.relative) + (code(node.module) if node.module is not None else "")
        for alias in node.names:
            local = code(alias.asname.name) if alias.asname is not None else code(alias.name)
            if local == name:
                return f"{source}:{code(alias.name)}"
    return None


def _global_scope(wrapper: MetadataWrapper) -> GlobalScope:
    scopes = wrapper.resolve(ScopeProvider)
    scope = scopes[wrapper.module]
    assert isinstance(scope, GlobalScope)
    return scope


def _renamed(module: cst.Module, names: dict[str, str]) -> cst.Module:
    """`module` with each module-level name in `names` renamed where it is bound and wherever it is read."""
    wrapper = MetadataWrapper(module)
    scope = _global_scope(wrapper)
    targets: dict[int, str] = {}
    for assignment in scope.assignments:
        new = names.get(assignment.name)
        if new is None or isinstance(assignment, ImportAssignment) or not isinstance(assignment, Assignment):
            continue
        targets[id(assignment.node)] = new
        for access in assignment.references:
            targets[id(access.node)] = new
    return wrapper.module.visit(_Rename(targets, names))


class _Rename(cst.CSTTransformer):
    def __init__(self, targets: dict[int, str], names: dict[str, str]) -> None:
        self.targets = targets
        self.names = names

    def leave_Global(self, original: cst.Global, updated: cst.Global) -> cst.Global:
        # `global _buf` in a function that rebinds the module's _buf: the statement names the renamed global
        return updated.with_changes(names=[item.with_changes(name=cst.Name(self.names.get(item.name.value,
                                                                                          item.name.value)))
                                           for item in updated.names])

    def leave_Name(self, original: cst.Name, updated: cst.Name) -> cst.Name:
        new = self.targets.get(id(original))
        return updated.with_changes(value=new) if new else updated

    def leave_FunctionDef(self, original: cst.FunctionDef, updated: cst.FunctionDef) -> cst.FunctionDef:
        new = self.targets.get(id(original))
        return updated.with_changes(name=cst.Name(new)) if new else updated

    def leave_ClassDef(self, original: cst.ClassDef, updated: cst.ClassDef) -> cst.ClassDef:
        new = self.targets.get(id(original))
        return updated.with_changes(name=cst.Name(new)) if new else updated


def _dispatcher(fn: cst.FunctionDef, entry: str, threshold: int, small: str, large: str) -> str:
    """`entry` with `fn`'s parameters (defaults as written), calling the small or the large path."""
    p = fn.params
    params = cst.Module(body=[]).code_for_node(p)
    forward = [x.name.value for x in (*p.posonly_params, *p.params)]
    values = list(forward)
    if isinstance(p.star_arg, cst.Param):
        forward.append("*" + p.star_arg.name.value)
        values.append(p.star_arg.name.value)
    for x in p.kwonly_params:
        forward.append(f"{x.name.value}={x.name.value}")
        values.append(x.name.value)
    if p.star_kwarg is not None:
        forward.append("**" + p.star_kwarg.name.value)
        values.append(p.star_kwarg.name.value)
    args = ", ".join(forward)
    return (f"def {entry}({params}):\n"
            f'    """Inputs of at most {threshold} bytes take the small-shape path ({small}, where the\n'
            f'    rewrite measured slower), the rest the rewrite ({large})."""\n'
            f"    if _kb_input_bytes({', '.join(values)}) <= {threshold}:\n"
            f"        return {small}({args})\n"
            f"    return {large}({args})\n")


def _is_import(statement: cst.CSTNode) -> bool:
    return isinstance(statement, cst.SimpleStatementLine) and all(
        isinstance(s, (cst.Import, cst.ImportFrom)) for s in statement.body)


def _is_future(statement: cst.CSTNode) -> bool:
    return _is_import(statement) and any(
        isinstance(s, cst.ImportFrom) and isinstance(s.module, cst.Name) and s.module.value == "__future__"
        for s in statement.body)  # type: ignore[attr-defined]


def _docstring(statement: cst.CSTNode, module: cst.Module) -> bool:
    return bool(module.body) and statement is module.body[0] and isinstance(statement, cst.SimpleStatementLine) \
        and len(statement.body) == 1 and isinstance(statement.body[0], cst.Expr) \
        and isinstance(statement.body[0].value, (cst.SimpleString, cst.ConcatenatedString))
