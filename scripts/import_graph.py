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
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("cli", "diagnose", "indexer", "kb", "harness")
DOC = ROOT / "docs" / "architecture.md"
_BEGIN, _END = "```mermaid\n", "```\n"


def _modules() -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            name = ".".join(path.relative_to(ROOT).with_suffix("").parts)
            found[name.removesuffix(".__init__")] = path
    return found


def _room(path: Path) -> str:
    return "/".join(path.parent.relative_to(ROOT).parts)


def rooms() -> dict[str, set[str]]:
    """Folder -> the folders its modules import."""
    modules = _modules()
    edges: dict[str, set[str]] = defaultdict(set)
    for module, path in modules.items():
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        edges[_room(path)]
        for node in ast.walk(ast.parse(path.read_text())):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = package.split(".")
                    base = ".".join(parts[: len(parts) - node.level + 1] + ([base] if base else []))
                names = [base, *(f"{base}.{a.name}" for a in node.names)]
            for name in names:
                if name in modules and _room(modules[name]) != _room(path):
                    edges[_room(path)].add(_room(modules[name]))
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
