"""The house as its imports draw it: folders as rooms, an arrow where one room imports another.

    python scripts/import_graph.py            # a Mermaid diagram (the one docs/architecture.md opens with)
    python scripts/import_graph.py --check    # exit 1 when the doc's diagram is not this one

Every import counts, those inside functions too (the CLI imports its layers lazily). tests/test_layering.py
holds the rules (no circle, layers point down); this prints what the code is.
"""

from __future__ import annotations

import argparse
import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("cli", "diagnose", "indexer", "kb", "harness")
DOC = ROOT / "docs" / "architecture.md"
_BEGIN, _END = "```mermaid\n", "```\n"


def modules() -> dict[str, Path]:
    """Every module of the packages, by dotted name."""
    found = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            name = ".".join(path.relative_to(ROOT).with_suffix("").parts)
            found[name.removesuffix(".__init__")] = path
    return found


def imported(path: Path, module: str) -> list[str]:
    """Every name `path` imports (module and module.attribute), relative imports resolved."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    names: list[str] = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1] + ([base] if base else []))
            names += [base, *(f"{base}.{a.name}" for a in node.names)]
    return names


def graph(found: dict[str, Path] | None = None) -> dict[str, set[str]]:
    """Module -> the modules of the packages it imports (of `found`, by default every module)."""
    found = found if found is not None else modules()
    return {module: {n for n in imported(path, module) if n in found and n != module} for module, path in found.items()}


def room(path: Path) -> str:
    return "/".join(path.parent.relative_to(ROOT).parts)


def rooms() -> dict[str, set[str]]:
    """Folder -> the folders its modules import."""
    found = modules()
    edges: dict[str, set[str]] = {room(path): set() for path in found.values()}
    for module, targets in graph(found).items():
        edges[room(found[module])] |= {room(found[t]) for t in targets} - {room(found[module])}
    return edges


def mermaid(edges: dict[str, set[str]]) -> str:
    """Top (the CLI) to bottom (the harness); an arrow reads "imports"."""
    ids = {room: room.replace("/", "_") for room in edges}
    lines = ["flowchart TD"]
    for room in sorted(edges, key=lambda r: (PACKAGES.index(r.split("/")[0]), r)):
        lines.append(f"    {ids[room]}[\"{room}/\"]")
    for room in sorted(edges):
        for target in sorted(edges[room]):
            lines.append(f"    {ids[room]} --> {ids[target]}")
    return "\n".join(lines) + "\n"


def documented() -> str:
    text = DOC.read_text()
    start = text.index(_BEGIN) + len(_BEGIN)
    return text[start:text.index(_END, start)]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="compare with the diagram in docs/architecture.md")
    args = parser.parse_args()
    drawn = mermaid(rooms())
    if args.check:
        if documented() != drawn:
            print("docs/architecture.md's diagram is not the code's: paste `python scripts/import_graph.py` into it",
                  file=sys.stderr)
            return 1
        return 0
    sys.stdout.write(drawn)
    return 0


if __name__ == "__main__":
    sys.exit(main())
