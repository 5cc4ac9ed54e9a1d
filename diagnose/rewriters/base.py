"""What every rewriter shares: the Variant record, the registry, and the libcst helpers that keep a rewrite
inside @triton.jit functions and read the index expressions kernels are written with."""

from __future__ import annotations

import difflib
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import libcst as cst
import libcst.matchers as m

from harness.guards import KERNEL_DECORATORS

__all__ = ["REWRITERS", "TRITON_DEFAULT_KNOBS", "InJit", "ReplaceNodes", "Rewriter", "SubstituteNames", "Variant", "autotune_decorated", "dotted", "is_jit", "jit_functions", "launch_arguments", "launch_grid", "launch_grid_axes", "launch_grid_node", "launch_statement", "launching_function", "mask_argument",
           "only_launch", "register", "target_launch", "simple_assign", "sm_count_statement", "start_plus_arange", "top_level_imports", "unified_diff",
           "docstring_lines", "program_axis", "with_helper", "with_keywords", "with_parameters"]


# What a launch (or a triton.Config) that names neither knob gets from Triton on CUDA.
TRITON_DEFAULT_KNOBS = {"num_warps": 4, "num_stages": 3}


@dataclass(frozen=True)
class Variant:
    params: dict[str, Any]  # what changed, e.g. {"num_warps": 4}
    source: str


# A rewriter takes a kernel module's source and the round's context (the finding, the task's
# tolerances, a direction) and returns its variants; [] when the pattern does not apply to the source.
Rewriter = Callable[[str, dict[str, Any]], list[Variant]]

# pattern id -> its rewriter; filled by the family modules as they are imported (diagnose/rewriters/__init__.py)
REWRITERS: dict[str, Rewriter] = {}


def register(*pattern_ids: str) -> Callable[[Rewriter], Rewriter]:
    """Registers the decorated rewriter for each catalog pattern id; a pattern has one rewriter."""
    def decorate(rewriter: Rewriter) -> Rewriter:
        for pattern_id in pattern_ids:
            if pattern_id in REWRITERS:
                raise ValueError(f"pattern {pattern_id!r} already has a rewriter: {REWRITERS[pattern_id]}")
            REWRITERS[pattern_id] = rewriter
        return rewriter
    return decorate


def unified_diff(before: str, after: str, name: str = "kernel.py") -> str:
    return "".join(difflib.unified_diff(before.splitlines(True), after.splitlines(True), f"a/{name}", f"b/{name}"))


def is_jit(fn: cst.FunctionDef) -> bool:
    """Whether `fn` is a Triton kernel: the harness's rule (harness.guards.KERNEL_DECORATORS) on libcst's tree."""
    return any(dotted(d.decorator.func if isinstance(d.decorator, cst.Call) else d.decorator).rsplit(".", 1)[-1]
               in KERNEL_DECORATORS for d in fn.decorators)


def autotune_decorated(fn: cst.FunctionDef) -> bool:
    """Whether a kernel sits under an autotuner (`@triton.autotune(...)`, or a decorator named so): its
    launch options come from the configs, so a rewrite must not pass num_warps at the launch."""
    return any(dotted(d.decorator.func if isinstance(d.decorator, cst.Call) else d.decorator).endswith("autotune")
               for d in fn.decorators)


def jit_functions(module: cst.Module) -> dict[str, cst.FunctionDef]:
    """The module's top-level Triton kernels by name."""
    return {n.name.value: n for n in module.body if isinstance(n, cst.FunctionDef) and is_jit(n)}


def launch_arguments(kernel: cst.FunctionDef | None, call: cst.Call) -> dict[str, cst.Arg]:
    """A launch's arguments by the kernel parameter each binds: keyword ones by their name, positional
    ones in the order of the kernel's parameters (none where the call unpacks `*args`: positions are
    then unknown; a `**kwargs` binds no position)."""
    params = [p.name.value for p in kernel.params.params] if kernel is not None else []
    positional = [a for a in call.args if a.keyword is None and a.star != "**"]
    bound = {} if any(a.star == "*" for a in positional) else dict(zip(params, positional))
    bound.update({a.keyword.value: a for a in call.args if a.keyword is not None})
    return bound


def only_launch(module: cst.Module, kernel: str) -> tuple[cst.FunctionDef, cst.Call] | None:
    """The module's one launch `kernel[grid](...)` outside @triton.jit functions, with the innermost function
    holding it; None when there are none or several."""
    found = [(fn, c) for fn in m.findall(module, m.FunctionDef()) if isinstance(fn, cst.FunctionDef) and not is_jit(fn)
             for c in m.findall(fn, m.Call(func=m.Subscript(value=m.Name(kernel))))]
    if len({id(c) for _, c in found}) != 1:
        return None
    fn, call = found[-1]  # the innermost function holding it (findall lists the outer first)
    return fn, cst.ensure_type(call, cst.Call)


def target_launch(module: cst.Module, context: dict[str, Any]) -> tuple[str, cst.Call] | None:
    """The one kernel a grid rewrite works on, with its one launch: among the module's launched kernels,
    those the call runs (`context["launched"]`, the diagnosis's interception) where that is known; None
    unless exactly one remains, launched at one site. Real modules launch several kernels (Liger's forward
    and backward side by side), and the call runs one of them."""
    jit = set(jit_functions(module))
    launched = set(context.get("launched") or {})
    names = {dotted(c.func.value) for c in m.findall(module, m.Call(func=m.Subscript()))  # type: ignore[attr-defined]
             if dotted(c.func.value) in jit}  # type: ignore[attr-defined]
    if launched:
        names &= launched
    if len(names) != 1:
        return None
    name = next(iter(names))
    found = only_launch(module, name)
    return (name, found[1]) if found is not None else None


def with_parameters(fn: cst.FunctionDef, names: list[str], constexpr: set[str], default: str | None = None
                    ) -> cst.FunctionDef:
    """`fn` with parameters added after its last one (launches pass them by keyword), given a `default`
    (source text) for them all (launches may leave them out); those in `constexpr` annotated
    `tl.constexpr`; the list's own layout (one per line, a trailing comma) kept. Without a default they
    have none where `fn` has no parameter with one; else they default to None: inserted before the first
    defaulted parameter, a launch passing that one by position would bind its value to the new name."""
    params = list(fn.params.params)
    if default is None and any(p.default is not None for p in params):
        default = "None"
    at = len(params)
    style = _comma_style(params)
    value = cst.parse_expression(default) if default is not None else None
    equal = cst.AssignEqual(cst.SimpleWhitespace(" "), cst.SimpleWhitespace(" ")) if default is not None \
        else cst.MaybeSentinel.DEFAULT
    new = [cst.Param(cst.Name(n), annotation=cst.Annotation(cst.parse_expression("tl.constexpr")) if n in constexpr
                     else None, default=value, equal=equal, comma=style) for n in names]
    return fn.with_changes(params=fn.params.with_changes(params=_inserted(params, at, new, style)))


def docstring_lines(body: list[Any]) -> int:
    """1 when a function body (its statements) opens with a docstring, else 0: code inserted at the top of a
    function goes after it."""
    return 1 if body and m.matches(body[0], m.SimpleStatementLine(
        body=[m.Expr(value=m.SimpleString() | m.ConcatenatedString())])) else 0


def program_axis(node: cst.BaseExpression) -> int | None:
    """The axis of `tl.program_id(<literal>)`, else None."""
    if isinstance(node, cst.Call) and dotted(node.func) == "tl.program_id" and node.args \
            and isinstance(node.args[0].value, cst.Integer):
        return int(node.args[0].value.evaluated_value)  # `0x0` is an axis too
    return None


def with_helper(module: cst.Module, helper_source: str) -> cst.Module:
    """`module` with the module-level functions of `helper_source` after its last import, two blank lines
    before each; unchanged where a function of that name is there already (an earlier round added it)."""
    helpers = [n for n in cst.parse_module(helper_source).body if isinstance(n, cst.FunctionDef)]
    present = {n.name.value for n in module.body if isinstance(n, cst.FunctionDef)}
    if all(h.name.value in present for h in helpers):
        return module
    body = list(module.body)
    imports = [i for i, n in enumerate(body) if m.matches(n, m.SimpleStatementLine(body=[m.Import() | m.ImportFrom()]))]
    at = imports[-1] + 1 if imports else 0
    new = [h.with_changes(leading_lines=[cst.EmptyLine(), cst.EmptyLine()]) for h in helpers
           if h.name.value not in present]
    return module.with_changes(body=[*body[:at], *new, *body[at:]])


def with_keywords(call: cst.Call, keywords: dict[str, cst.BaseExpression]) -> cst.Call:
    """`call` with `name=value` arguments appended, its own layout kept."""
    style = _comma_style(list(call.args))
    eq = cst.AssignEqual(cst.SimpleWhitespace(""), cst.SimpleWhitespace(""))
    new = [cst.Arg(v, keyword=cst.Name(k), equal=eq, comma=style) for k, v in keywords.items()]
    return call.with_changes(args=_inserted(list(call.args), len(call.args), new, style))


def _comma_style(items: list[Any]) -> cst.Comma:
    """The comma a parameter or argument list is written with (its line breaks), else `, `."""
    return next((i.comma for i in items if isinstance(i.comma, cst.Comma)),
                cst.Comma(whitespace_after=cst.SimpleWhitespace(" ")))


def _inserted(items: list[Any], at: int, new: list[Any], style: cst.Comma) -> list[Any]:
    """`new` (each with `style`'s comma) inserted at `at`: appended ones take the last item's comma (a
    trailing comma, a closing line break) and the last item takes `style`."""
    items = list(items)
    if at == len(items) and items:
        new[-1] = new[-1].with_changes(comma=items[-1].comma)
        items[-1] = items[-1].with_changes(comma=style)
        # A list closed on its own line keeps that line break after its last item (libcst holds it there).
        trailing = next((a for a in ("whitespace_after_param", "whitespace_after_arg") if hasattr(items[-1], a)), None)
        if trailing is not None:
            new[-1] = new[-1].with_changes(**{trailing: getattr(items[-1], trailing)})
            items[-1] = items[-1].with_changes(**{trailing: cst.SimpleWhitespace("")})
    items[at:at] = new
    return items


def dotted(node: cst.BaseExpression) -> str:
    if isinstance(node, cst.Name):
        return node.value
    if isinstance(node, cst.Attribute):
        return f"{dotted(node.value)}.{node.attr.value}"
    return ""


def mask_argument(call: cst.Call) -> int | None:
    """Where the mask of a `tl.load` / `tl.store` / `tl.atomic_*` call sits in `call.args`: its keyword,
    else the position after the pointer (a load) or the pointer and the value (a store, an atomic) when an
    argument is given there; None for an access without a mask. (diagnose.features.access_mask reads the
    same rule off Python's ast.)"""
    keyword = next((i for i, a in enumerate(call.args) if a.keyword is not None and a.keyword.value == "mask"), None)
    if keyword is not None:
        return keyword
    last = dotted(call.func).rsplit(".", 1)[-1]
    position = 2 if last == "store" or last.startswith("atomic") else 1
    given = len(call.args) > position and call.args[position].keyword is None and not call.args[position].star
    return position if given else None


class InJit(cst.CSTTransformer):
    """Base: only nodes inside @triton.jit functions are rewritten."""

    def __init__(self) -> None:
        self.depth = 0
        self.changed = 0

    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        if is_jit(node):
            self.depth += 1

    def leave_FunctionDef(self, original: cst.FunctionDef, updated: cst.FunctionDef) -> cst.FunctionDef:
        if is_jit(original):
            self.depth -= 1
        return updated


class SubstituteNames(cst.CSTTransformer):
    """Every variable in `names` replaced by its expression (a template's placeholders, a renamed state); an
    attribute or a keyword spelled alike is not a variable (`x.size(0)` keeps `size` when `size` is renamed,
    `f(h=h)` keeps its keyword)."""

    def __init__(self, names: dict[str, cst.BaseExpression]) -> None:
        self.names = names
        self.spelled = 0  # inside an attribute's name or an argument's keyword

    def visit_Attribute_attr(self, node: cst.Attribute) -> None:
        self.spelled += 1

    def leave_Attribute_attr(self, node: cst.Attribute) -> None:
        self.spelled -= 1

    def visit_Arg_keyword(self, node: cst.Arg) -> None:
        self.spelled += 1

    def leave_Arg_keyword(self, node: cst.Arg) -> None:
        self.spelled -= 1

    def leave_Name(self, original: cst.Name, updated: cst.Name) -> cst.BaseExpression:
        return updated if self.spelled else self.names.get(updated.value, updated)


class ReplaceNodes(cst.CSTTransformer):
    """The given nodes (by identity, `id(node)`) replaced with new expressions."""

    def __init__(self, values: dict[int, cst.BaseExpression]) -> None:
        self.values = values

    def on_leave(self, original: cst.CSTNode, updated: cst.CSTNode) -> Any:
        return self.values.get(id(original), updated)


def launch_grid(module: cst.Module, call: cst.Call) -> cst.BaseExpression | None:
    """G of a launch on a 1-D grid, as an expression the launching function can evaluate where the
    launch is: `kernel[(G,)](...)`, or `kernel[grid](...)` where that function binds `grid` once to
    `(G,)` or to `lambda meta: (G,)` (the first drafts' usual form). In a lambda, `meta['KEY']` becomes
    the launch's own argument for KEY (by keyword, or by position through the kernel's parameters),
    which must be a name, an attribute or a number, so that repeating it computes nothing. None
    otherwise (a grid from a function, a 2-D grid, a lambda that reads meta another way)."""
    axes = launch_grid_axes(module, call)
    return axes[0] if axes is not None and len(axes) == 1 else None


# The last few modules' maps, each with its module held so that its id stays its own (libcst's nodes take
# no weak references).
_LAUNCHING: OrderedDict[int, tuple[cst.Module, dict[int, cst.FunctionDef]]] = OrderedDict()


def _launching_functions(module: cst.Module) -> dict[int, cst.FunctionDef]:
    """id of each `x[...](...)` call -> the outermost function holding it, read once per module (a walk per
    launch made the 1-D persistent rewrite take 8 s a variant on a 1,235-line fla file)."""
    held = _LAUNCHING.get(id(module))
    if held is not None and held[0] is module:
        _LAUNCHING.move_to_end(id(module))
        return held[1]
    found: dict[int, cst.FunctionDef] = {}
    for fn in m.findall(module, m.FunctionDef()):  # outer functions first
        for c in m.findall(fn, m.Call(func=m.Subscript())):
            found.setdefault(id(c), cst.ensure_type(fn, cst.FunctionDef))
    _LAUNCHING[id(module)] = (module, found)
    while len(_LAUNCHING) > 8:
        _LAUNCHING.popitem(last=False)
    return found


def launching_function(module: cst.Module, call: cst.Call) -> cst.FunctionDef | None:
    """The outermost function of `module` holding the launch `call` (None: a launch at module level)."""
    return _launching_functions(module).get(id(call))


def launch_grid_node(module: cst.Module, call: cst.Call) -> cst.BaseExpression | None:
    """The grid of a launch as written in `module`: the subscript's value, or, for a name, the one value the
    launching function binds it to (a tuple, a lambda); None where neither is found."""
    if not isinstance(call.func, cst.Subscript) or len(call.func.slice) != 1 \
            or not isinstance(call.func.slice[0].slice, cst.Index):
        return None
    value = call.func.slice[0].slice.value
    if not isinstance(value, cst.Name):
        return value
    scope = _launching_functions(module).get(id(call))
    bound = [a.value for a in m.findall(scope, m.Assign())
             if isinstance(a, cst.Assign) and [dotted(t.target) for t in a.targets] == [value.value]] if scope else []
    return bound[0] if len(bound) == 1 else None


def launch_grid_axes(module: cst.Module, call: cst.Call) -> list[cst.BaseExpression] | None:
    """Every axis of a launch's grid, read as `launch_grid` reads a 1-D one: a literal tuple, or a name
    the launching function binds once to a tuple or to `lambda meta: (...)`."""
    if not isinstance(call.func, cst.Subscript) or len(call.func.slice) != 1:
        return None
    index = call.func.slice[0].slice
    if not (isinstance(index, cst.Index) and isinstance(index.value, (cst.Tuple, cst.Name))):
        return None
    value = launch_grid_node(module, call)
    if isinstance(value, cst.Tuple):
        return [el.value for el in value.elements]
    if not (isinstance(value, cst.Lambda) and len(value.params.params) == 1 and isinstance(value.body, cst.Tuple)):
        return None
    meta = value.params.params[0].name.value
    arguments = {name: a.value for name, a in
                 launch_arguments(jit_functions(module).get(dotted(call.func.value)), call).items()}
    reads = m.findall(value.body, m.Name(meta))
    keys = m.findall(value.body, m.Subscript(value=m.Name(meta), slice=[m.SubscriptElement(m.Index(m.SimpleString()))]))
    if len(reads) != len(keys):
        return None  # meta used other than as meta['KEY']
    replaced: dict[str, cst.BaseExpression] = {}
    for key in keys:
        assert isinstance(key, cst.Subscript)
        text = cst.ensure_type(cst.ensure_type(key.slice[0].slice, cst.Index).value, cst.SimpleString).evaluated_value
        argument = arguments.get(str(text))
        if not isinstance(argument, (cst.Name, cst.Attribute, cst.Integer)):
            return None
        replaced[str(text)] = argument
    axes = [el.value.visit(_MetaKeys(meta, replaced)) for el in value.body.elements]
    return [a for a in axes if isinstance(a, cst.BaseExpression)] if all(isinstance(a, cst.BaseExpression) for a in axes) \
        else None


class _MetaKeys(cst.CSTTransformer):
    def __init__(self, meta: str, values: dict[str, cst.BaseExpression]) -> None:
        self.meta, self.values = meta, values

    def leave_Subscript(self, original: cst.Subscript, updated: cst.Subscript) -> cst.BaseExpression:
        if m.matches(updated.value, m.Name(self.meta)):
            key = cst.ensure_type(cst.ensure_type(updated.slice[0].slice, cst.Index).value, cst.SimpleString)
            return self.values[str(key.evaluated_value)]
        return updated


def sm_count_statement(fallback: str, name: str = "sm_count") -> cst.BaseStatement:
    """`<name> = <the current device's SM count>`, `fallback` (an expression) without a GPU: launch
    rewrites that size a grid by the device put this in the wrapper (a `name` of the rewrite's own keeps a
    module-level `sm_count` the wrapper reads global)."""
    return cst.parse_statement(
        f"{name} = (torch.cuda.get_device_properties(torch.cuda.current_device()).multi_processor_count\n"
        f"{' ' * (len(name) + 4)}if torch.cuda.is_available() else {fallback})\n")


def start_plus_arange(value: cst.BaseExpression) -> tuple[cst.BaseExpression, cst.BaseExpression] | None:
    """(START, BLOCK) of `START + tl.arange(0, BLOCK)` (either order)."""
    if not (isinstance(value, cst.BinaryOperation) and isinstance(value.operator, cst.Add)):
        return None
    for arange, start in ((value.right, value.left), (value.left, value.right)):
        if (isinstance(arange, cst.Call) and dotted(arange.func) == "tl.arange" and len(arange.args) == 2
                and m.matches(arange.args[0].value, m.Integer("0"))):
            start = start.with_changes(lpar=[cst.LeftParen()], rpar=[cst.RightParen()]) \
                if isinstance(start, cst.BinaryOperation) else start
            return start, arange.args[1].value
    return None


def launch_statement(launch: cst.Call, parents: Mapping[cst.CSTNode, cst.CSTNode]
                     ) -> tuple[cst.SimpleStatementLine, cst.FunctionDef] | None:
    """The statement holding `launch` and the function whose body holds that statement at its top level, not
    in a branch, a loop or another expression's argument list; None otherwise. `parents`: libcst's
    ParentNodeProvider."""
    expression = parents.get(launch)
    statement = parents.get(expression) if expression is not None else None
    block = parents.get(statement) if statement is not None else None
    function = parents.get(block) if block is not None else None
    if isinstance(statement, cst.SimpleStatementLine) and isinstance(function, cst.FunctionDef) \
            and isinstance(function.body, cst.IndentedBlock) and statement in function.body.body:
        return statement, function
    return None


def top_level_imports(module: cst.Module) -> set[tuple[str, str | None]]:
    """(module, alias) of each `import X [as Y]` at the module's top level: what a rewrite may spell its new
    code with (`("triton.language", "tl")`)."""
    imports = [i for stmt in module.body if isinstance(stmt, cst.SimpleStatementLine) for i in stmt.body
               if isinstance(i, cst.Import)]
    return {(dotted(a.name), a.asname.name.value if a.asname and isinstance(a.asname.name, cst.Name) else None)
            for i in imports for a in i.names}


def simple_assign(stmt: cst.CSTNode) -> tuple[str, cst.BaseExpression] | None:
    if (isinstance(stmt, cst.SimpleStatementLine) and len(stmt.body) == 1 and isinstance(stmt.body[0], cst.Assign)
            and len(stmt.body[0].targets) == 1 and isinstance(stmt.body[0].targets[0].target, cst.Name)):
        return stmt.body[0].targets[0].target.value, stmt.body[0].value
    return None
